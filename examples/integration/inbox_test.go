package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// inboxStores opens each store the inbox is tried on: the real servers
// of IDEM_POSTGRES_URL and IDEM_REDIS_ADDR, and memory as the baseline.
var inboxStores = map[string]func(t *testing.T) idempotency.Store{
	"memory": func(t *testing.T) idempotency.Store { return memStore(nil) },
	"postgres": func(t *testing.T) idempotency.Store {
		url := os.Getenv("IDEM_POSTGRES_URL")
		if url == "" {
			t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL) or set IDEM_POSTGRES_URL")
		}
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema := fmt.Sprintf("inbox_%d", time.Now().UnixNano())
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatalf("cannot use the PostgreSQL at IDEM_POSTGRES_URL: %v", err)
		}
		t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
		s, err := postgres.New(pool, &postgres.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	},
	"redis": func(t *testing.T) idempotency.Store {
		addr := os.Getenv("IDEM_REDIS_ADDR")
		if addr == "" {
			t.Fatal("IDEM_REDIS_ADDR is not set: run scripts/test.sh (it starts a throwaway Redis) or set IDEM_REDIS_ADDR")
		}
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		s, err := redis.New(c, &redis.Options{Prefix: fmt.Sprintf("inbox-it-%d:", time.Now().UnixNano())})
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
}

// TestInboxOnRealStores: on every store, an event delivered ten times at
// once and ten times one after another is processed once; a consumer that
// crashed mid-handling (its claim made, never finished) blocks
// redeliveries until its lease ends, and then the redelivery processes
// the event, once.
func TestInboxOnRealStores(t *testing.T) {
	for name, open := range inboxStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := open(t)
			r, err := idempotency.New(store, idempotency.WithLease(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			in, err := inbox.New(r, "ledger")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var effects atomic.Int32
			handle := func(context.Context) error { effects.Add(1); return nil }

			msg := inbox.Message{Source: "payments", ID: "evt-1", Payload: []byte(`{"credit":1}`)}
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() {
					d, err := in.Handle(ctx, msg, handle)
					if d.Disposition == inbox.DeadLetter {
						t.Errorf("concurrent delivery dead-lettered: %v", err)
					}
				})
			}
			wg.Wait()
			for range 10 {
				if d, err := in.Handle(ctx, msg, handle); err != nil || !d.Duplicate {
					t.Fatalf("sequential delivery: %+v, %v", d, err)
				}
			}
			if n := effects.Load(); n != 1 {
				t.Fatalf("%d effects after 20 deliveries, want 1", n)
			}

			// A consumer that claimed evt-2 and died.
			crashed := inbox.Message{Source: "payments", ID: "evt-2"}
			key, err := r.StorageKey(in.Request(crashed))
			if err != nil {
				t.Fatal(err)
			}
			if res, err := store.Claim(ctx, idempotency.ClaimRequest{Key: key, Token: "dead-consumer", Lease: time.Second, Grace: time.Minute}); err != nil || res.Outcome != idempotency.OutcomeAcquired {
				t.Fatalf("the crashed consumer's claim: %+v, %v", res, err)
			}
			effects.Store(0)
			if d, err := in.Handle(ctx, crashed, handle); !errors.Is(err, idempotency.ErrInProgress) || d.Disposition != inbox.Retry {
				t.Fatalf("redelivery during the dead consumer's lease: %v; want in progress, retry", err)
			}
			time.Sleep(1500 * time.Millisecond)
			var wg2 sync.WaitGroup
			for range 5 {
				wg2.Go(func() { in.Handle(ctx, crashed, handle) })
			}
			wg2.Wait()
			if d, err := in.Handle(ctx, crashed, handle); err != nil || !d.Duplicate {
				t.Fatalf("after the takeover: %+v, %v", d, err)
			}
			if n := effects.Load(); n != 1 {
				t.Fatalf("%d effects of the crashed event after its lease, want 1", n)
			}
		})
	}
}
