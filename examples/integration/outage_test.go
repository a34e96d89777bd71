package integration

import (
	"context"
	"encoding/json"
	"github.com/exactlyonce/idempotency/internal/nettest"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/postgres"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// blackHole and closedPort are the shared unreachable servers.
var (
	blackHole  = nettest.BlackHole
	closedPort = nettest.ClosedPort
)

// outageStores builds the stores to try against addr, each with its
// driver's default options.
var outageStores = map[string]func(t *testing.T, addr string) idempotency.Store{
	"postgres": func(t *testing.T, addr string) idempotency.Store {
		pool, err := pgxpool.New(context.Background(), "postgres://u@"+addr+"/db?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := postgres.New(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	"redis": func(t *testing.T, addr string) idempotency.Store {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		s, err := idemredis.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
}

// TestStoreOutageGives503 is the HTTP side of "no default may hang": with
// the store behind a black hole or on a closed port, and the drivers'
// default client options, the middleware answers a 503 problem in bounded
// time and the handler never runs. Bounds: with WithStoreTimeout(500ms)
// and the default retries, 2 s for a black hole and 1 s for a closed
// port; with no option at all, well under 30 s. The assertions keep a
// margin for a loaded machine; the figures are logged.
func TestStoreOutageGives503(t *testing.T) {
	for name, mk := range outageStores {
		for _, c := range []struct {
			outage  string
			addr    func(testing.TB) string
			opts    []idempotency.Option
			want    time.Duration // the target
			allowed time.Duration // what the test accepts
		}{
			{"black_hole", blackHole, []idempotency.Option{idempotency.WithStoreTimeout(500 * time.Millisecond)}, 2 * time.Second, 4 * time.Second},
			{"closed_port", closedPort, []idempotency.Option{idempotency.WithStoreTimeout(500 * time.Millisecond)}, time.Second, 2500 * time.Millisecond},
			{"black_hole_defaults", blackHole, nil, 30 * time.Second, 15 * time.Second},
		} {
			t.Run(name+"/"+c.outage, func(t *testing.T) {
				t.Parallel()
				runner, err := idempotency.New(mk(t, c.addr(t)), c.opts...)
				if err != nil {
					t.Fatal(err)
				}
				idem, err := httpidem.New(runner, httpidem.WithSharedKeySpace())
				if err != nil {
					t.Fatal(err)
				}
				var runs atomic.Int64
				srv := httptest.NewServer(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) })))
				defer srv.Close()

				req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "outage-1")
				start := time.Now()
				resp, err := http.DefaultClient.Do(req)
				took := time.Since(start)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var p httpidem.Problem
				if resp.StatusCode != 503 || json.Unmarshal(body, &p) != nil || p.Type != httpidem.ProblemStoreUnavailable {
					t.Fatalf("%d %q; want a 503 store-unavailable problem", resp.StatusCode, body)
				}
				if runs.Load() != 0 {
					t.Fatal("the handler ran without a claim")
				}
				t.Logf("503 after %v (target %v)", took.Round(time.Millisecond), c.want)
				if took > c.allowed {
					t.Fatalf("503 after %v; target %v, allowed %v", took, c.want, c.allowed)
				}
			})
		}
	}
}
