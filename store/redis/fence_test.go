package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
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

	// Once the store has seen a retention, claims make the mark cover it
	// (the record's TTL plus that retention plus the memory), and a
	// completion with that retention leaves the mark alone: it still
	// outlives the record by the memory, and more by at most the lease
	// and grace. A longer retention sets the mark again.
	const key2 = "5:ttl2"
	fk2 := idemredis.FenceKey(s, key2)
	pttl := func(k string) time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, k).Result()
		if err != nil || d < 0 {
			t.Fatalf("PTTL %q: %v, %v", k, d, err)
		}
		return d
	}
	mustClaim(t, s, claimReq(key2, "c", time.Minute), idempotency.OutcomeAcquired)
	if d, want := pttl(fk2)-pttl(s.Key(key2)), time.Hour+memory; d < want-time.Second || d > want+time.Second {
		t.Errorf("claim after a 1h retention: mark outlives the record by %v, want %v", d, want)
	}
	before := pttl(fk2)
	if err := s.Complete(ctx, key2, "c", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	rec, hw := pttl(s.Key(key2)), pttl(fk2)
	if hw > before {
		t.Errorf("complete with the covered retention set the mark again: %v, before %v", hw, before)
	}
	if d := hw - rec; d < memory-time.Second || d > memory+2*time.Minute+time.Second {
		t.Errorf("complete with the covered retention: mark outlives the record by %v, want %v to %v more", d, memory, 2*time.Minute)
	}
	mustClaim(t, s, claimReq("5:ttl3", "d", time.Minute), idempotency.OutcomeAcquired)
	if err := s.Complete(ctx, "5:ttl3", "d", []byte("r"), 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if d := pttl(idemredis.FenceKey(s, "5:ttl3")) - pttl(s.Key("5:ttl3")); d < memory-time.Second || d > memory+time.Second {
		t.Errorf("complete with a longer retention: mark outlives the record by %v, want %v", d, memory)
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
