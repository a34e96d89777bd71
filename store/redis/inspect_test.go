package redis_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// tagOf returns the hash tag of a Redis key made by Store.Key, braces
// included: "{1a2}".
func tagOf(key string) string {
	i := strings.IndexByte(key, '{')
	return key[i : i+strings.IndexByte(key[i:], '}')+1]
}

// indexOf returns the key of the index of STARTED records of storageKey's
// shard: the record key's prefix and tag, a NUL, "started".
func indexOf(s *idemredis.Store, storageKey string) string {
	k := s.Key(storageKey)
	return k[:strings.IndexByte(k, '}')+1] + "\x00started"
}

// sameShard returns n storage keys of the shard of the first one, made
// from name and a counter; with wide set, some carry bytes above 0x7f.
func sameShard(s *idemredis.Store, name string, n int, wide bool) []string {
	keys := []string{fmt.Sprintf("%d:%s", len(name), name)}
	tag := tagOf(s.Key(keys[0]))
	for i := 0; len(keys) < n; i++ {
		k := name + strconv.Itoa(i)
		if wide && i%2 == 1 {
			k = name + "é" + strconv.Itoa(i)
		}
		k = fmt.Sprintf("%d:%s", len(k), k)
		if tagOf(s.Key(k)) == tag {
			keys = append(keys, k)
		}
	}
	return keys
}

// score returns the index entry of storageKey: its score, or -1 when there
// is none.
func score(t *testing.T, c goredis.Cmdable, s *idemredis.Store, storageKey string) int64 {
	t.Helper()
	v, err := c.ZScore(context.Background(), indexOf(s, storageKey), storageKey).Result()
	if errors.Is(err, goredis.Nil) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return int64(v)
}

// leaseField reads a record's lease deadline (field l).
func leaseField(t *testing.T, c goredis.Cmdable, s *idemredis.Store, storageKey string) int64 {
	t.Helper()
	l, err := c.HGet(context.Background(), s.Key(storageKey), "l").Int64()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// deployments are the two servers' clients, for tests and benchmarks run
// on both.
var deployments = []struct {
	name   string
	client func(tb testing.TB) goredis.UniversalClient
}{
	{"single", func(tb testing.TB) goredis.UniversalClient { return newSingle(tb) }},
	{"cluster", func(tb testing.TB) goredis.UniversalClient { return newCluster(tb) }},
}

// listStuck pages through Stuck with limit and returns the keys listed,
// in order.
func listStuck(t *testing.T, s *idemredis.Store, limit int) []string {
	t.Helper()
	var listed []string
	for cursor, pages := "", 0; ; pages++ {
		if pages > 10_000 {
			t.Fatal("Stuck: the cursor does not move on")
		}
		infos, next, err := s.Stuck(context.Background(), cursor, limit)
		if err != nil {
			t.Fatal(err)
		}
		for _, info := range infos {
			listed = append(listed, info.Key)
		}
		if next == "" {
			return listed
		}
		cursor = next
	}
}

// TestShardsSpreadOverMasters measures where the 1024 shard tags land on
// the test cluster: CLUSTER KEYSLOT of every tag, mapped to the masters
// by CLUSTER SLOTS. Each master owns a third of the slots, so it should
// get about 341 tags (standard deviation 15); a master with fewer than 290
// would take a visibly smaller share of the records.
func TestShardsSpreadOverMasters(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	node, err := c.MasterForKey(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	pipe := node.Pipeline()
	cmds := make([]*goredis.IntCmd, idemredis.Shards)
	for shard := range idemredis.Shards {
		cmds[shard] = pipe.ClusterKeySlot(ctx, fmt.Sprintf("{%03x}", shard))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	perMaster, distinct := map[string]int{}, map[int64]bool{}
	for _, cmd := range cmds {
		slot := cmd.Val()
		distinct[slot] = true
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				perMaster[r.Nodes[0].Addr]++
			}
		}
	}
	t.Logf("1024 shard tags: %d distinct slots; tags per master %v", len(distinct), perMaster)
	if len(perMaster) != 3 {
		t.Fatalf("tags on %d masters, want 3: %v", len(perMaster), perMaster)
	}
	for addr, n := range perMaster {
		if n < 290 || n > 395 {
			t.Errorf("master %s gets %d of 1024 tags, want about 341", addr, n)
		}
	}
}

// TestIndexFollowsLifecycle: the index of STARTED records holds a record
// while it is STARTED, scored by its lease deadline (field l), moved by a
// renewal and a takeover, and dropped by completion, release and purge.
// The index expires after the last record it lists, within a minute.
func TestIndexFollowsLifecycle(t *testing.T) {
	c := newSingle(t)
	ctx := context.Background()
	s := newStore(t, c, nil)

	const k = "3:one"
	mustClaim(t, s, claimReq(k, "a", time.Minute), idempotency.OutcomeAcquired)
	if got, want := score(t, c, s, k), leaseField(t, c, s, k); got != want {
		t.Fatalf("after claim: index score %d, want the lease deadline %d", got, want)
	}
	recTTL, idxTTL := c.PTTL(ctx, s.Key(k)).Val(), c.PTTL(ctx, indexOf(s, k)).Val()
	if idxTTL < recTTL || idxTTL > recTTL+61*time.Second {
		t.Errorf("index TTL %v, record TTL %v: want the index to outlive the record by at most a minute", idxTTL, recTTL)
	}
	if err := s.Renew(ctx, k, "a", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, want := score(t, c, s, k), leaseField(t, c, s, k); got != want {
		t.Fatalf("after renew: index score %d, want the new deadline %d", got, want)
	}
	if idxTTL, recTTL := c.PTTL(ctx, indexOf(s, k)).Val(), c.PTTL(ctx, s.Key(k)).Val(); idxTTL < recTTL {
		t.Errorf("after a longer renewal: index TTL %v below the record's %v", idxTTL, recTTL)
	}
	if err := s.Checkpoint(ctx, k, "a", "step", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if got, want := score(t, c, s, k), leaseField(t, c, s, k); got != want {
		t.Fatalf("after checkpoint: index score %d, want %d", got, want)
	}
	if err := s.Complete(ctx, k, "a", []byte("r"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := score(t, c, s, k); got != -1 {
		t.Fatalf("after complete: index entry %d still there", got)
	}

	const r = "3:two"
	mustClaim(t, s, claimReq(r, "a", time.Minute), idempotency.OutcomeAcquired)
	if err := s.Release(ctx, r, "a"); err != nil {
		t.Fatal(err)
	}
	if got := score(t, c, s, r); got != -1 {
		t.Fatalf("after release: index entry %d still there", got)
	}

	const p = "5:three"
	mustClaim(t, s, claimGrace(p, "a", shortLease, longGrace), idempotency.OutcomeAcquired)
	first := score(t, c, s, p)
	time.Sleep(pastLease)
	mustClaim(t, s, claimReq(p, "b", time.Minute), idempotency.OutcomeAcquired)
	if got, want := score(t, c, s, p), leaseField(t, c, s, p); got != want || got <= first {
		t.Fatalf("after takeover: index score %d, want the new deadline %d (was %d)", got, want, first)
	}
	mustClaim(t, s, claimReq(p, "b", 2*time.Minute), idempotency.OutcomeAcquired) // a repeated claim
	if got, want := score(t, c, s, p), leaseField(t, c, s, p); got != want {
		t.Fatalf("after a repeated claim: index score %d, want %d", got, want)
	}
	if err := s.Purge(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := score(t, c, s, p); got != -1 {
		t.Fatalf("after purge: index entry %d still there", got)
	}
	if n := c.Exists(ctx, s.Key(p)).Val(); n != 0 {
		t.Fatal("after purge: record still there")
	}

	// A mismatch, a replay and an in-progress claim leave the index alone.
	const q = "4:four"
	mustClaim(t, s, claimReq(q, "a", time.Minute), idempotency.OutcomeAcquired)
	before := score(t, c, s, q)
	mustClaim(t, s, claimReq(q, "b", time.Minute), idempotency.OutcomeInProgress)
	mustClaim(t, s, idempotency.ClaimRequest{Key: q, Fingerprint: "other", Token: "c", Lease: time.Hour}, idempotency.OutcomeMismatch)
	if got := score(t, c, s, q); got != before {
		t.Fatalf("an in-progress or mismatched claim moved the entry from %d to %d", before, got)
	}
}

// TestNULKeysRefused: a storage key with a NUL could name a shard's index
// (<prefix>{<tag>}\x00started), so every operation refuses one without
// sending anything; storage keys made by the idempotency package never
// hold one.
func TestNULKeysRefused(t *testing.T) {
	c := newSingle(t)
	var h countHook
	c.AddHook(&h)
	s := newStore(t, c, nil)
	ctx := context.Background()
	for _, k := range []string{"\x00started", "3:a\x00b"} {
		_, err1 := s.Claim(ctx, claimReq(k, "a", time.Minute))
		err2 := s.Renew(ctx, k, "a", time.Minute)
		err3 := s.Checkpoint(ctx, k, "a", "n", nil)
		err4 := s.Complete(ctx, k, "a", nil, time.Minute)
		err5 := s.Release(ctx, k, "a")
		_, err6 := s.Inspect(ctx, k)
		err7 := s.Purge(ctx, k)
		for i, err := range []error{err1, err2, err3, err4, err5, err6, err7} {
			if !errors.Is(err, idempotency.ErrInvalidArgument) {
				t.Errorf("%q: operation %d: %v, want ErrInvalidArgument", k, i+1, err)
			}
		}
	}
	if n := h.n.Load(); n != 0 {
		t.Errorf("%d round trips for refused keys", n)
	}
}

// TestStaleEntriesDropped: a record that expires by TTL leaves its index
// entry behind (no script runs). Stuck does not list it and drops it; so
// do a fresh claim in the same shard (for the two earliest entries), and
// a Renew, Complete or Release of the gone record.
func TestStaleEntriesDropped(t *testing.T) {
	c := newSingle(t)
	ctx := context.Background()
	var s *idemredis.Store // each case's own
	const brief = 100 * time.Millisecond
	expire := func(keys ...string) {
		t.Helper()
		for _, k := range keys {
			mustClaim(t, s, claimGrace(k, "a", brief, 0), idempotency.OutcomeAcquired)
		}
		time.Sleep(brief + 50*time.Millisecond)
		for _, k := range keys {
			if c.Exists(ctx, s.Key(k)).Val() != 0 {
				t.Fatalf("%s has not expired", k)
			}
			if score(t, c, s, k) == -1 {
				t.Fatalf("%s: no index entry left behind by its expiry", k)
			}
		}
	}

	t.Run("stuck", func(t *testing.T) {
		s = newStore(t, c, nil)
		gone := sameShard(s, "gone", 3, false)
		stuck := gone[2]
		mustClaim(t, s, claimGrace(stuck, "b", brief, time.Minute), idempotency.OutcomeAcquired)
		expire(gone[:2]...)
		infos, next, err := s.Stuck(ctx, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Key != stuck || next != "" {
			t.Fatalf("Stuck = %v, %q; want only %s", infos, next, stuck)
		}
		for _, k := range gone[:2] {
			if got := score(t, c, s, k); got != -1 {
				t.Errorf("%s: stale entry %d still there after Stuck", k, got)
			}
		}
	})

	t.Run("fresh_claim", func(t *testing.T) {
		s = newStore(t, c, nil)
		keys := sameShard(s, "claimed", 4, false)
		expire(keys[:2]...)
		mustClaim(t, s, claimReq(keys[2], "a", time.Minute), idempotency.OutcomeAcquired)
		for _, k := range keys[:2] {
			if got := score(t, c, s, k); got != -1 {
				t.Errorf("%s: stale entry %d still there after a fresh claim in its shard", k, got)
			}
		}
		// A live entry at the low end stays.
		mustClaim(t, s, claimReq(keys[3], "a", time.Minute), idempotency.OutcomeAcquired)
		if score(t, c, s, keys[2]) == -1 {
			t.Error("a fresh claim dropped a live entry")
		}
	})

	t.Run("holder", func(t *testing.T) {
		s = newStore(t, c, nil)
		expire("5:renew", "8:complete", "7:release")
		if err := s.Renew(ctx, "5:renew", "a", time.Minute); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Renew of a gone record: %v", err)
		}
		if err := s.Complete(ctx, "8:complete", "a", nil, time.Minute); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Complete of a gone record: %v", err)
		}
		if err := s.Release(ctx, "7:release", "a"); err != nil {
			t.Errorf("Release of a gone record: %v", err)
		}
		for _, k := range []string{"5:renew", "8:complete", "7:release"} {
			if got := score(t, c, s, k); got != -1 {
				t.Errorf("%s: stale entry %d still there", k, got)
			}
		}
	})

	// More stale entries in one shard than a script looks at (stuckBudget,
	// 256 beyond what it lists): Stuck goes on in the same shard, drops
	// them all and still lists the stuck record behind them.
	t.Run("many", func(t *testing.T) {
		s = newStore(t, c, nil)
		keys := sameShard(s, "many", 2, false)
		stuck := keys[1]
		mustClaim(t, s, claimGrace(stuck, "a", brief, time.Minute), idempotency.OutcomeAcquired)
		time.Sleep(brief + 20*time.Millisecond)
		idx := indexOf(s, stuck)
		low := score(t, c, s, stuck) - 10_000
		zs := make([]goredis.Z, 1500)
		for i := range zs {
			zs[i] = goredis.Z{Score: float64(low + int64(i)), Member: fmt.Sprintf("%s-ghost%04d", keys[0], i)}
		}
		if err := c.ZAdd(ctx, idx, zs...).Err(); err != nil {
			t.Fatal(err)
		}
		if listed := listStuck(t, s, 10); !slices.Equal(listed, []string{stuck}) {
			t.Fatalf("Stuck listed %v, want only %s", listed, stuck)
		}
		if n := c.ZCard(ctx, idx).Val(); n != 1 {
			t.Fatalf("the index holds %d entries after Stuck, want 1", n)
		}
	})
}

// TestStuckManyShards claims stuck records over many shards, next to live,
// completed, released and expired ones, and lists them in small pages:
// each stuck record exactly once, with its fields, and nothing else. It
// logs what a page costs in round trips and time.
func TestStuckManyShards(t *testing.T) {
	for _, tc := range deployments {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			var h countHook
			c.AddHook(&h)
			s := newStore(t, c, nil)
			ctx := context.Background()
			const n = 400
			want := map[string]idempotency.ClaimResult{}
			shards := map[string]bool{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := w; i < n; i += 4 {
						k := fmt.Sprintf("9:tenant-42:stuck-%d", i)
						res, err := s.Claim(ctx, claimGrace(k, "dead", shortLease, longGrace))
						if err != nil || res.Outcome != idempotency.OutcomeAcquired {
							t.Errorf("claim %s: %v, %v", k, res.Outcome, err)
							return
						}
						mu.Lock()
						want[k] = res
						shards[tagOf(s.Key(k))] = true
						mu.Unlock()
						// Others, which Stuck must not list (t.Fatal may not
						// be called here).
						claim := func(r idempotency.ClaimRequest) bool {
							res, err := s.Claim(ctx, r)
							if err != nil || res.Outcome != idempotency.OutcomeAcquired {
								t.Errorf("claim %s: %v, %v", r.Key, res.Outcome, err)
								return false
							}
							return true
						}
						switch i % 8 {
						case 0:
							claim(claimReq(k+"-live", "live", time.Minute))
						case 1:
							if claim(claimGrace(k+"-done", "done", shortLease, longGrace)) {
								if err := s.Complete(ctx, k+"-done", "done", []byte("r"), time.Minute); err != nil {
									t.Error(err)
								}
							}
						case 2:
							if claim(claimGrace(k+"-released", "rel", shortLease, longGrace)) {
								if err := s.Release(ctx, k+"-released", "rel"); err != nil {
									t.Error(err)
								}
							}
						case 3:
							claim(claimGrace(k+"-expired", "exp", shortLease/2, 0))
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			time.Sleep(pastLease)

			h.n.Store(0)
			seen := map[string]int{}
			pages, start := 0, time.Now()
			for cursor := ""; ; pages++ {
				if pages > 1000 {
					t.Fatal("Stuck: the cursor does not move on")
				}
				infos, next, err := s.Stuck(ctx, cursor, 7)
				if err != nil {
					t.Fatal(err)
				}
				if len(infos) > 7 {
					t.Fatalf("a page of limit 7 holds %d records", len(infos))
				}
				for _, info := range infos {
					seen[info.Key]++
					res, ok := want[info.Key]
					switch {
					case !ok:
						t.Errorf("Stuck listed %s, which is not stuck", info.Key)
					case info.State != idempotency.StateStarted || info.LeaseLeft != 0 || info.ExpiresIn <= 0 || info.ExpiresIn > longGrace:
						t.Errorf("%s: state %s, LeaseLeft %v, ExpiresIn %v", info.Key, info.State, info.LeaseLeft, info.ExpiresIn)
					case info.Fence != res.Fence || info.Attempt != 1 || info.Fingerprint != "fp":
						t.Errorf("%s: fence %d, attempt %d, fingerprint %q; want %d, 1, fp", info.Key, info.Fence, info.Attempt, info.Fingerprint, res.Fence)
					}
				}
				if next == "" {
					pages++
					break
				}
				cursor = next
			}
			elapsed, trips := time.Since(start), h.n.Load()
			for k := range want {
				if seen[k] != 1 {
					t.Errorf("%s listed %d times, want once", k, seen[k])
				}
			}
			t.Logf("%d stuck records in %d shards: %d pages of 7, %d round trips (%.1f a page), %v a page",
				n, len(shards), pages, trips, float64(trips)/float64(pages), elapsed/time.Duration(pages))

			// One page for them all, then a pass with none.
			h.n.Store(0)
			start = time.Now()
			infos, next, err := s.Stuck(ctx, "", 1000)
			if err != nil || len(infos) != n || next != "" {
				t.Fatalf("Stuck(limit 1000): %d records, next %q, %v; want %d, \"\"", len(infos), next, err, n)
			}
			t.Logf("one page of %d: %d round trips, %v", n, h.n.Load(), time.Since(start))
			for k := range want {
				if err := s.Purge(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
			h.n.Store(0)
			start = time.Now()
			infos, next, err = s.Stuck(ctx, "", 100)
			if err != nil || len(infos) != 0 || next != "" {
				t.Fatalf("Stuck after purging all: %v, %q, %v", infos, next, err)
			}
			t.Logf("a pass over 1024 shards with nothing stuck: %d round trips, %v", h.n.Load(), time.Since(start))
		})
	}
}

// TestStuckEqualDeadlines: records of one shard whose index entries share
// a score are ordered by their storage keys byte by byte, as the sorted
// set orders them; paging one at a time lists each once, in that order,
// also for keys with bytes above 0x7f (which Lua's < would compare by the
// server's locale).
func TestStuckEqualDeadlines(t *testing.T) {
	c := newSingle(t)
	ctx := context.Background()
	s := newStore(t, c, nil)
	keys := sameShard(s, "tie", 8, true)
	for _, k := range keys {
		mustClaim(t, s, claimGrace(k, "a", shortLease, longGrace), idempotency.OutcomeAcquired)
	}
	time.Sleep(pastLease)
	idx := indexOf(s, keys[0])
	same := float64(score(t, c, s, keys[0]))
	for _, k := range keys {
		if err := c.ZAddXX(ctx, idx, goredis.Z{Score: same, Member: k}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted) // byte by byte
	for _, limit := range []int{1, 2, 3} {
		if listed := listStuck(t, s, limit); !slices.Equal(listed, sorted) {
			t.Errorf("limit %d: listed %q, want %q", limit, listed, sorted)
		}
	}
}

// TestStuckCursor: a cursor is opaque and checked; one that this store
// did not make is an invalid argument, as is a limit below 1.
func TestStuckCursor(t *testing.T) {
	s := newStore(t, newSingle(t), nil)
	ctx := context.Background()
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, cursor := range []string{"x", "!!", enc("r0:001::"), enc("r1:400::"), enc("r1:001:12a:k"),
		enc("r1:001::k"), enc("r1:001:12:"), enc("r1:0011:k"), enc("r1:(12:12:k")} {
		if _, _, err := s.Stuck(ctx, cursor, 10); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("cursor %q: %v, want ErrInvalidArgument", cursor, err)
		}
	}
	if _, _, err := s.Stuck(ctx, "", 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("limit 0: %v, want ErrInvalidArgument", err)
	}
	if infos, next, err := s.Stuck(ctx, enc("r1:3ff:12:k"), 10); err != nil || len(infos) != 0 || next != "" {
		t.Errorf("a cursor in the last shard: %v, %q, %v", infos, next, err)
	}
}

// TestPurgeWakesWatcher: with Notify, a purge publishes on the record's
// shard channel, so a duplicate waiting on the record wakes at once,
// on a single server and on a cluster.
func TestPurgeWakesWatcher(t *testing.T) {
	for _, tc := range deployments {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			s := newStore(t, c, &idemredis.Options{Notify: true})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for i := range 4 { // on a cluster, keys on different nodes
				key := fmt.Sprintf("3:p%02d", i)
				mustClaim(t, s, claimReq(key, "a", time.Minute), idempotency.OutcomeAcquired)
				woke := make(chan error, 1)
				go func() { woke <- s.Watch(ctx, key) }()
				waitSubscribed(t, c, s.Key(key))
				select {
				case err := <-woke:
					t.Fatalf("%s: Watch returned before the purge: %v", key, err)
				default:
				}
				start := time.Now()
				if err := s.Purge(ctx, key); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-woke:
					if err != nil {
						t.Fatalf("%s: Watch: %v", key, err)
					}
				case <-time.After(2 * time.Second):
					t.Fatalf("%s: Watch still waiting 2s after the purge", key)
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("%s: woke %v after the purge", key, d)
				}
			}
		})
	}
}

// waitSubscribed waits until a client subscribes to the shard channel
// named key, on the node that owns it.
func waitSubscribed(t *testing.T, c goredis.UniversalClient, key string) {
	t.Helper()
	ctx := context.Background()
	node := goredis.Cmdable(c)
	if cc, ok := c.(*goredis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		node = m
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		n, err := node.PubSubShardNumSub(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n[key] > 0 {
			return
		}
	}
	t.Fatalf("nobody subscribed to %q within 5s", key)
}

// TestIndexMemory measures what the index costs (MEMORY USAGE of one
// shard's sorted set, divided by its entries) for a typical storage key
// of 26 bytes, at sizes where Redis keeps it compact (listpack, up to 128
// entries by default) and where it does not (skiplist).
func TestIndexMemory(t *testing.T) {
	c := newSingle(t)
	ctx := context.Background()
	s := newStore(t, c, nil)
	for _, n := range []int{1, 100, 1000} {
		keys := sameShard(s, fmt.Sprintf("tenant-427:order-%d-", n), n, false)
		for _, k := range keys {
			mustClaim(t, s, claimReq(k, "a", time.Minute), idempotency.OutcomeAcquired)
		}
		idx := indexOf(s, keys[0])
		mem, err := c.MemoryUsage(ctx, idx, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		enc := c.ObjectEncoding(ctx, idx).Val()
		t.Logf("index of %4d entries (keys of %d bytes): %s, %d bytes, %.0f bytes an entry", n, len(keys[n-1]), enc, mem, float64(mem)/float64(n))
		if per := float64(mem) / float64(n); n > 1 && per > 200 {
			t.Errorf("%d entries take %.0f bytes each", n, per)
		}
	}
}

// TestStuckAfterScriptFlush: Stuck's pipelined scripts survive servers
// that lost their script cache (NOSCRIPT in the pipeline: the scripts run
// again with EVAL), on a single server and on every node of a cluster.
func TestStuckAfterScriptFlush(t *testing.T) {
	for _, tc := range deployments {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			s := newStore(t, c, nil)
			ctx := context.Background()
			var want []string
			for i := range 20 {
				k := fmt.Sprintf("4:st%02d", i)
				mustClaim(t, s, claimGrace(k, "a", shortLease, longGrace), idempotency.OutcomeAcquired)
				want = append(want, k)
			}
			time.Sleep(pastLease)
			if err := flushScripts(ctx, c); err != nil {
				t.Fatal(err)
			}
			got := listStuck(t, s, 1000)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("Stuck after SCRIPT FLUSH listed %v, want %v", got, want)
			}
		})
	}
}
