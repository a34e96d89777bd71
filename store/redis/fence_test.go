package redis_test

import (
	"context"
	"strconv"
	"strings"
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
	for _, tc := range deployments {
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

// markOf reads a shard's fence mark: the highest fence it holds and the
// mark's time to live.
func markOf(t *testing.T, c goredis.Cmdable, s *idemredis.Store, key string) (int64, time.Duration) {
	t.Helper()
	ctx := context.Background()
	fk := idemredis.FenceKey(s, key)
	v, err := c.Get(ctx, fk).Result()
	if err != nil {
		t.Fatalf("mark of %q: %v", key, err)
	}
	f, _, _ := strings.Cut(v, ":")
	fence, err := strconv.ParseInt(f, 10, 64)
	if err != nil {
		t.Fatalf("mark of %q is %q: %v", key, v, err)
	}
	return fence, c.PTTL(ctx, fk).Val()
}

// TestFenceMemoryOutlivesRecord: the shard's fence mark holds a fence at
// least the record's and lives at least FenceMemory past the record at
// every step (claim, renew, complete), and at least FenceMemory after
// release and purge, which leave it alone; it lives in the record's slot.
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
	// check: the mark lives at least the record's time to live plus the
	// memory, and at most more besides.
	check := func(step string, fence int64, more time.Duration) {
		t.Helper()
		rec, err := c.PTTL(ctx, s.Key(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		rec = max(rec, 0)
		hf, hw := markOf(t, c, s, key)
		if hf < fence {
			t.Errorf("%s: mark holds fence %d, below the record's %d", step, hf, fence)
		}
		if d := hw - (rec + memory); d < -time.Second || d > more+time.Second {
			t.Errorf("%s: mark lives %v, record %v; want the record's plus %v, plus at most %v", step, hw, rec, memory, more)
		}
	}
	res := mustClaim(t, s, claimReq(key, "a", time.Minute), idempotency.OutcomeAcquired)
	check("claim", res.Fence, 0)
	if err := s.Renew(ctx, key, "a", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	check("renew", res.Fence, 0)
	if err := s.Complete(ctx, key, "a", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	check("complete", res.Fence, 0)
	if err := s.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	check("purge", res.Fence, time.Hour)
	res = mustClaim(t, s, claimReq(key, "b", time.Minute), idempotency.OutcomeAcquired)
	if err := s.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	check("release", res.Fence, 2*time.Hour)

	// Once the store has seen a retention, claims make the mark cover it
	// (the record's TTL plus that retention plus the memory), and a
	// completion with that retention leaves the mark alone: it still
	// outlives the record by the memory, and more by at most the lease
	// and grace. A longer retention extends the mark.
	s2 := newStore(t, c, &idemredis.Options{FenceMemory: memory})
	mustClaim(t, s2, claimReq(key, "p", time.Minute), idempotency.OutcomeAcquired)
	if err := s2.Complete(ctx, key, "p", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	pttl := func(k string) time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, k).Result()
		if err != nil || d < 0 {
			t.Fatalf("PTTL %q: %v, %v", k, d, err)
		}
		return d
	}
	key2 := sameShard(s2, "ttl2", 2, false)[1]
	mustClaim(t, s2, claimReq(key2, "c", time.Minute), idempotency.OutcomeAcquired)
	_, hw := markOf(t, c, s2, key2)
	if d, want := hw-pttl(s2.Key(key2)), time.Hour+memory; d < want-time.Second || d > want+time.Second {
		t.Errorf("claim after a 1h retention: mark outlives the record by %v, want %v", d, want)
	}
	if err := s2.Complete(ctx, key2, "c", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	rec, hw2 := pttl(s2.Key(key2)), pttl(idemredis.FenceKey(s2, key2))
	if hw2 > hw {
		t.Errorf("complete with the covered retention extended the mark: %v, before %v", hw2, hw)
	}
	if d := hw2 - rec; d < memory-time.Second || d > memory+2*time.Minute+time.Second {
		t.Errorf("complete with the covered retention: mark outlives the record by %v, want %v to %v more", d, memory, 2*time.Minute)
	}
	key3 := sameShard(s2, "ttl3", 2, false)[1]
	mustClaim(t, s2, claimReq(key3, "d", time.Minute), idempotency.OutcomeAcquired)
	if err := s2.Complete(ctx, key3, "d", []byte("r"), 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if d := pttl(idemredis.FenceKey(s2, key3)) - pttl(s2.Key(key3)); d < memory-time.Second || d > memory+time.Second {
		t.Errorf("complete with a longer retention: mark outlives the record by %v, want %v", d, memory)
	}
	// A claim that needs less than the mark was given keeps the longer
	// expiry.
	before := pttl(idemredis.FenceKey(s2, key3))
	mustClaim(t, s, claimReq(sameShard(s2, "ttl4", 2, false)[1], "e", time.Minute), idempotency.OutcomeAcquired)
	if after := pttl(idemredis.FenceKey(s2, key3)); after < before-time.Second {
		t.Errorf("a claim needing less shortened the mark's life from %v to %v", before, after)
	}
}

// TestFenceClockBackAfterExpiry: records expire by TTL (no script runs at
// their end) while the scripts' clock steps back, by amounts from a
// millisecond to two hours, and the same keys are claimed again: every
// new fence is above the key's last, on the single server and on the
// cluster, and the fences of one shard grow by one while the clock is
// behind. Without the shard's mark (deleted), a step back hands out a
// smaller fence, which shows the test could fail.
func TestFenceClockBackAfterExpiry(t *testing.T) {
	for _, tc := range deployments {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			s := newStore(t, c, nil)
			keys := append(sameShard(s, "back", 3, false), "4:solo", "5:other")
			last := map[string]int64{}
			back := time.Duration(0)
			for _, step := range []time.Duration{time.Millisecond, 300 * time.Millisecond, time.Second, time.Hour, time.Hour} {
				back += step
				idemredis.SetClockSkew(s, -back+time.Duration(len(last))*time.Microsecond)
				for _, k := range keys {
					res := mustClaim(t, s, claimGrace(k, idempotency.Token("t"+back.String()), 20*time.Millisecond, 20*time.Millisecond), idempotency.OutcomeAcquired)
					if res.Fence <= last[k] {
						t.Errorf("%s, clock %v back, after expiry: fence %d after %d", k, back, res.Fence, last[k])
					}
					last[k] = res.Fence
				}
				time.Sleep(60 * time.Millisecond) // the records expire by TTL
				for _, k := range keys {
					if n := c.Exists(context.Background(), s.Key(k)).Val(); n != 0 {
						t.Fatalf("%s still there after its lease and grace", k)
					}
				}
			}

			// The control: with the marks gone, the step wins.
			for _, k := range keys {
				if err := c.Del(context.Background(), idemredis.FenceKey(s, k)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			idemredis.SetClockSkew(s, -back-time.Hour)
			if res := mustClaim(t, s, claimReq(keys[0], "z", time.Minute), idempotency.OutcomeAcquired); res.Fence >= last[keys[0]] {
				t.Errorf("without the mark, a clock 1h further back gave fence %d after %d: the test cannot tell", res.Fence, last[keys[0]])
			}
		})
	}
}

// TestFenceAfterCompletionExpires: a completed record that expires leaves
// the high-water mark behind for the fence memory, whether Complete set it
// (a retention longer than the one the claim covered) or left it as the
// claim set it (the retention the store saw last): a clock stepped back
// hands out a greater fence either way, on the single server and on the
// cluster. The retention exceeds lease, grace and fence memory together,
// so a mark left at the claim's time to live when it had to be set again
// would be gone by the next claim.
func TestFenceAfterCompletionExpires(t *testing.T) {
	for _, tc := range deployments {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			const memory = 500 * time.Millisecond
			s := newStore(t, c, &idemredis.Options{FenceMemory: memory})
			ctx := context.Background()
			const key = "5:complete-expiry"
			// The first and third retentions are longer than the one the
			// claim covered (none, then 800ms), the second is the same.
			retentions := []time.Duration{800 * time.Millisecond, 800 * time.Millisecond, time.Second}
			var last int64
			for i, retention := range retentions {
				idemredis.SetClockSkew(s, -time.Duration(i)*time.Hour)
				tok := idempotency.Token(string(rune('a' + i)))
				res := mustClaim(t, s, claimGrace(key, tok, 100*time.Millisecond, 100*time.Millisecond), idempotency.OutcomeAcquired)
				if res.Fence <= last {
					t.Errorf("claim %d, clock %dh back: fence %d after %d", i, i, res.Fence, last)
				}
				last = res.Fence
				if err := s.Complete(ctx, key, tok, []byte("r"), retention); err != nil {
					t.Fatal(err)
				}
				time.Sleep(retention + 100*time.Millisecond)
				if n, err := c.Exists(ctx, s.Key(key)).Result(); err != nil || n != 0 {
					t.Fatalf("record still there after its retention: %d, %v", n, err)
				}
			}
			idemredis.SetClockSkew(s, -3*time.Hour)
			if res := mustClaim(t, s, claimReq(key, "z", time.Minute), idempotency.OutcomeAcquired); res.Fence <= last {
				t.Errorf("last claim, clock 3h back: fence %d after %d", res.Fence, last)
			}
		})
	}
}
