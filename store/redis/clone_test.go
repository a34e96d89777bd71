package redis

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	goredis "github.com/redis/go-redis/v9"
)

// TestBoundedClone: on a *redis.Client that does not bound socket I/O by
// the context's deadline, the store sends its commands through a clone
// that does, on the same connection pool, and leaves the caller's client
// and its options as they were; a client that honours deadlines is used
// as it is, and so is one whose timeouts a clone cannot keep (read and
// write timeouts that differ, socket deadlines disabled), which keeps the
// hand-off to a worker. The bounds themselves, against a server that
// never answers, are in timeout_test.go.
func TestBoundedClone(t *testing.T) {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		t.Fatal("IDEM_REDIS_ADDR is not set: run scripts/test.sh")
	}
	for _, tc := range []struct {
		name           string
		opts           goredis.Options
		clone, honours bool
	}{
		{"default", goredis.Options{}, true, true},
		{"own_timeouts", goredis.Options{ReadTimeout: 700 * time.Millisecond}, true, true},
		{"context_timeout", goredis.Options{ContextTimeoutEnabled: true}, false, true},
		{"split_timeouts", goredis.Options{ReadTimeout: 3 * time.Second, WriteTimeout: 2 * time.Second}, false, false},
		{"no_deadlines", goredis.Options{ReadTimeout: -2, WriteTimeout: -2}, false, false},
		{"context_timeout_no_deadlines", goredis.Options{ContextTimeoutEnabled: true, ReadTimeout: -2, WriteTimeout: -2}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.Addr = addr
			c := goredis.NewClient(&o)
			t.Cleanup(func() { _ = c.Close() })
			s, err := New(c, &Options{Prefix: "idemtest:clone:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":" + tc.name + ":"})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.client != Client(c); got != tc.clone {
				t.Fatalf("store sends through a clone: %v, want %v", got, tc.clone)
			}
			if s.honoursDeadlines != tc.honours {
				t.Fatalf("store takes its client to honour deadlines: %v, want %v", s.honoursDeadlines, tc.honours)
			}
			if c.Options().ContextTimeoutEnabled != tc.opts.ContextTimeoutEnabled {
				t.Fatalf("the caller's client had its ContextTimeoutEnabled changed to %v", c.Options().ContextTimeoutEnabled)
			}
			r, err := idempotency.New(s)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i := range 3 {
				res, err := idempotency.Do(ctx, r, idempotency.Request{Key: "k"}, func(context.Context) (int, error) { return 7, nil })
				if err != nil || res.Value != 7 || res.Replayed != (i > 0) {
					t.Fatalf("Do %d: %+v, %v", i, res, err)
				}
			}
			if !tc.clone {
				return
			}
			b := s.client.(*goredis.Client)
			// The client's own timeouts (go-redis's defaults, or 700ms as
			// given), as read back from the client.
			want := c.Options().ReadTimeout
			if tc.opts.ReadTimeout > 0 && want != tc.opts.ReadTimeout {
				t.Fatalf("client's read timeout %v, configured %v", want, tc.opts.ReadTimeout)
			}
			if bo := b.Options(); !bo.ContextTimeoutEnabled || bo.ReadTimeout != want || bo.WriteTimeout != want {
				t.Errorf("clone's options: ContextTimeoutEnabled %v, timeouts %v/%v; want true, %v both", bo.ContextTimeoutEnabled, bo.ReadTimeout, bo.WriteTimeout, want)
			}
			// One pool: the connections the store's calls opened are the
			// caller's client's.
			if bs, cs := b.PoolStats(), c.PoolStats(); bs.TotalConns == 0 || bs.TotalConns != cs.TotalConns {
				t.Errorf("clone's pool has %d connections, the client's %d: want the same pool", bs.TotalConns, cs.TotalConns)
			}
		})
	}
}
