package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// backend is a store for the tests and the idemctl flags that reach it.
type backend struct {
	store idempotency.Store
	flags []string
}

var backends = map[string]func(t *testing.T) backend{
	"postgres": func(t *testing.T) backend {
		url := os.Getenv("IDEM_POSTGRES_URL")
		if url == "" {
			t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL) or set IDEM_POSTGRES_URL")
		}
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema := fmt.Sprintf("idemctl_%d", time.Now().UnixNano())
		if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
			t.Fatalf("cannot use the PostgreSQL at IDEM_POSTGRES_URL: %v", err)
		}
		t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
		s, err := postgres.New(pool, &postgres.Options{Schema: schema, Table: "keys"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return backend{s, []string{"-postgres", url, "-schema", schema, "-table", "keys"}}
	},
	"redis": func(t *testing.T) backend {
		addr := os.Getenv("IDEM_REDIS_ADDR")
		if addr == "" {
			t.Fatal("IDEM_REDIS_ADDR is not set: run scripts/test.sh (it starts a throwaway Redis) or set IDEM_REDIS_ADDR")
		}
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		prefix := fmt.Sprintf("idemctl-%d:", time.Now().UnixNano())
		s, err := redis.New(c, &redis.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return backend{s, []string{"-redis", addr, "-prefix", prefix}}
	},
}

func idemctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCommands runs every command against real servers in the support
// scenario: a completed payment, a payment whose holder died (a retry
// would get 409 until its lease ends, then take it over), an unknown key.
func TestCommands(t *testing.T) {
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			r, err := idempotency.New(b.store, idempotency.WithLease(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			scope := []string{"acct_42", "POST /payments"}
			sflags := append(append([]string{}, b.flags...), "-scope", scope[0], "-scope", scope[1])
			done := idempotency.Request{Scope: scope, Key: "order-1", Fingerprint: "fp"}
			if _, err := idempotency.Do(ctx, r, done, func(context.Context) (string, error) { return "ch_secret", nil }); err != nil {
				t.Fatal(err)
			}
			dead := idempotency.Request{Scope: scope, Key: "order-2", Fingerprint: "fp"}
			sk, _ := r.StorageKey(dead)
			claim, err := b.store.Claim(ctx, idempotency.ClaimRequest{Key: sk, Fingerprint: "fp", Token: "dead", Lease: time.Second, Grace: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.store.Checkpoint(ctx, sk, "dead", "charge", []byte(`"ch_1"`)); err != nil {
				t.Fatal(err)
			}

			code, out, _ := idemctl(t, append(sflags, "inspect", "order-1")...)
			if code != 0 || !strings.Contains(out, "state:        completed") || strings.Contains(out, "ch_secret") {
				t.Fatalf("inspect completed: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, append(sflags, "inspect", "-result", "order-1")...)
			if code != 0 || !strings.Contains(out, `result:       value "ch_secret"`) {
				t.Fatalf("inspect -result: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, append(sflags, "inspect", "order-2")...)
			if code != 0 || !strings.Contains(out, "state:        started") || !strings.Contains(out, "holder is running") || !strings.Contains(out, "checkpoints:  charge") {
				t.Fatalf("inspect live: %d\n%s", code, out)
			}
			if code, _, errOut := idemctl(t, append(sflags, "inspect", "order-9")...); code != exitNotFound || !strings.Contains(errOut, "no such record") {
				t.Fatalf("inspect unknown: %d %s", code, errOut)
			}

			time.Sleep(1200 * time.Millisecond) // the dead holder's lease ends
			code, out, _ = idemctl(t, append(sflags, "inspect", "order-2")...)
			if code != 0 || !strings.Contains(out, "stopped renewing") {
				t.Fatalf("inspect stuck: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, append(append([]string{}, b.flags...), "-json", "stuck", "-limit", "10")...)
			var listed []recordView
			if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 1 || listed[0].Key != "order-2" ||
				listed[0].Fence != claim.Fence || listed[0].Scope[0] != "acct_42" {
				t.Fatalf("stuck: %d\n%s", code, out)
			}

			if code, _, errOut := idemctl(t, append(sflags, "purge", "order-2")...); code != exitUsage || !strings.Contains(errOut, "-yes") {
				t.Fatalf("purge without -yes: %d %s", code, errOut)
			}
			code, out, _ = idemctl(t, append(sflags, "purge", "-yes", "order-2")...)
			if code != 0 || !strings.Contains(out, "purged started record") {
				t.Fatalf("purge: %d %s", code, out)
			}
			if code, _, _ := idemctl(t, append(sflags, "inspect", "order-2")...); code != exitNotFound {
				t.Fatalf("inspect after purge: %d", code)
			}
			res, err := idempotency.Do(ctx, r, dead, func(context.Context) (string, error) { return "again", nil })
			if err != nil || res.Replayed || res.Fence <= claim.Fence {
				t.Fatalf("retry after purge: %+v, %v; want a fresh run with a greater fence", res, err)
			}
			code, out, errOut := idemctl(t, append(b.flags, "sweep")...)
			switch name {
			case "postgres":
				if code != 0 || !strings.Contains(out, "swept") {
					t.Fatalf("sweep: %d %s %s", code, out, errOut)
				}
			case "redis":
				if code != exitUsage || !strings.Contains(errOut, "expires records itself") {
					t.Fatalf("sweep on Redis: %d %s %s", code, out, errOut)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"inspect", "k"}, // no store
		{"-postgres", "postgres://x", "-redis", "y", "stuck"},
		{"-redis", "127.0.0.1:1", "-schema", "s", "stuck"},
		{"-redis", "127.0.0.1:1", "frobnicate"},
		{"-redis", "127.0.0.1:1", "inspect"},
		{"-redis", "127.0.0.1:1", "stuck", "-limit", "0"},
		{"-redis", "127.0.0.1:1", "-scope", "", "inspect", "k"},
	} {
		if code, _, _ := idemctl(t, args...); code != exitUsage {
			t.Errorf("idemctl %q: exit %d, want %d", args, code, exitUsage)
		}
	}
}
