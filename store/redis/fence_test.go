package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// TestFenceNeverGoesBack steps the scripts' clock back by an hour (the
// store's test hook, as an NTP step or a failover to a server whose clock
// is behind would) between the life of a record and its re-creation, on
// the single server and on the cluster, after each way a record ends:
// release, expiry, purge, and completion followed by purge. The new fence
// is still above every fence handed out before. Without the high-water
// mark (its key deleted) the same step hands out a smaller fence, which
// shows what the test would catch.
func TestFenceNeverGoesBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(testing.TB) goredis.UniversalClient
	}{
		{"single", func(tb testing.TB) goredis.UniversalClient { return newSingle(tb) }},
		{"cluster", func(tb testing.TB) goredis.UniversalClient { return newCluster(tb) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			s := newStore(t, c, nil)
			ctx := context.Background()
			back := -time.Hour
			ends := map[string]func(key string, tok idempotency.Token){
				"release": func(key string, tok idempotency.Token) {
					if err := s.Release(ctx, key, tok); err != nil {
						t.Fatal(err)
					}
				},
				"expiry": func(key string, tok idempotency.Token) {
					time.Sleep(2*shortLease + 100*time.Millisecond) // lease + grace
					if n, err := c.Exists(ctx, s.Key(key)).Result(); err != nil || n != 0 {
						t.Fatalf("record still there: %d, %v", n, err)
					}
				},
				"purge": func(key string, tok idempotency.Token) {
					if err := s.Purge(ctx, key); err != nil {
						t.Fatal(err)
					}
				},
				"complete_purge": func(key string, tok idempotency.Token) {
					if err := s.Complete(ctx, key, tok, []byte("r"), time.Minute); err != nil {
						t.Fatal(err)
					}
					if err := s.Purge(ctx, key); err != nil {
						t.Fatal(err)
					}
				},
			}
			for name, end := range ends {
				key := "5:" + name
				idemredis.SetClockSkew(s, 0)
				first := mustClaim(t, s, claimGrace(key, "a", shortLease, shortLease), idempotency.OutcomeAcquired)
				end(key, "a")
				idemredis.SetClockSkew(s, back)
				second := mustClaim(t, s, claimGrace(key, "b", shortLease, shortLease), idempotency.OutcomeAcquired)
				if second.Fence <= first.Fence {
					t.Errorf("%s, clock stepped back 1h: fence %d after %d", name, second.Fence, first.Fence)
				}
				// Two more steps back, each past the previous fence.
				end(key, "b")
				idemredis.SetClockSkew(s, 2*back)
				third := mustClaim(t, s, claimGrace(key, "c", shortLease, shortLease), idempotency.OutcomeAcquired)
				if third.Fence <= second.Fence {
					t.Errorf("%s, clock stepped back 2h: fence %d after %d", name, third.Fence, second.Fence)
				}
				if err := s.Release(ctx, key, "c"); err != nil {
					t.Fatal(err)
				}
			}

			// The control: with the mark gone, the step wins.
			const key = "5:control"
			idemredis.SetClockSkew(s, 0)
			first := mustClaim(t, s, claimReq(key, "a", time.Minute), idempotency.OutcomeAcquired)
			if err := s.Release(ctx, key, "a"); err != nil {
				t.Fatal(err)
			}
			if err := c.Del(ctx, idemredis.FenceKey(s, key)).Err(); err != nil {
				t.Fatal(err)
			}
			idemredis.SetClockSkew(s, back)
			second := mustClaim(t, s, claimReq(key, "b", time.Minute), idempotency.OutcomeAcquired)
			if second.Fence >= first.Fence {
				t.Errorf("without the mark, a clock 1h back gave fence %d after %d: the test cannot tell", second.Fence, first.Fence)
			}
		})
	}
}

// TestFenceMemoryOutlivesRecord: the high-water mark's time to live is
// the record's plus FenceMemory at every step (claim, renew, complete),
// and FenceMemory after release; it lives in the record's slot.
func TestFenceMemoryOutlivesRecord(t *testing.T) {
	c := newSingle(t)
	const memory = 5 * time.Minute
	s := newStore(t, c, &idemredis.Options{FenceMemory: memory})
	ctx := context.Background()
	const key = "5:ttl"
	fk := idemredis.FenceKey(s, key)
	cl := newCluster(t)
	fs, err1 := cl.ClusterKeySlot(ctx, fk).Result()
	rs, err2 := cl.ClusterKeySlot(ctx, s.Key(key)).Result()
	if err1 != nil || err2 != nil || fs != rs {
		t.Fatalf("fence key %q in slot %d (%v), record in %d (%v)", fk, fs, err1, rs, err2)
	}
	check := func(step string, want time.Duration) {
		t.Helper()
		rec, err := c.PTTL(ctx, s.Key(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		hw, err := c.PTTL(ctx, fk).Result()
		if err != nil {
			t.Fatal(err)
		}
		if rec < 0 {
			rec = 0
		}
		if d := hw - (rec + want); d < -time.Second || d > time.Second {
			t.Errorf("%s: mark lives %v, record %v; want the record's plus %v", step, hw, rec, want)
		}
	}
	res := mustClaim(t, s, claimReq(key, "a", time.Minute), idempotency.OutcomeAcquired)
	check("claim", memory)
	if v, err := c.Get(ctx, fk).Int64(); err != nil || v != res.Fence {
		t.Fatalf("mark %d (%v), want the fence %d", v, err, res.Fence)
	}
	if err := s.Renew(ctx, key, "a", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	check("renew", memory)
	if err := s.Complete(ctx, key, "a", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	check("complete", memory)
	if err := s.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	check("purge", memory)
	mustClaim(t, s, claimReq(key, "b", time.Minute), idempotency.OutcomeAcquired)
	if err := s.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	check("release", memory)
}
