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
// by CLUSTER SHARDS. Each master owns a third of the slots, so it should
// get about 341 tags (standard deviation 15); a master with fewer than 290
// would take a visibly smaller share of the records.
func TestShardsSpreadOverMasters(t *testing.T) {
	masterOf := func(sh goredis.ClusterShard) string {
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				return fmt.Sprintf("%s:%d", n.IP, n.Port)
			}
		}
		t.Fatalf("shard %v has no master", sh)
		return ""
	}
	c := newCluster(t)
	ctx := context.Background()
	shards, err := c.ClusterShards(ctx).Result()
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
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= slot && slot <= r.End {
					perMaster[masterOf(sh)]++
				}
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

// TestNULKeysRefused: a storage key with a NUL could name a shard's fence
// mark (<prefix>{<tag>}\x00fence), so every operation refuses one without
// sending anything; storage keys made by the idempotency package never
// hold one.
func TestNULKeysRefused(t *testing.T) {
	c := newSingle(t)
	var h countHook
	s := newStore(t, c, nil)
	addHook(t, s, &h)
	ctx := context.Background()
	for _, k := range []string{"\x00fence", "3:a\x00b"} {
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

// TestStuckManyShards claims stuck records over many shards, next to live,
// completed, released and expired ones, and lists them in small pages:
// each stuck record exactly once, with its fields, and nothing else. It
// logs what a page costs in round trips and time.
func TestStuckManyShards(t *testing.T) {
	for _, tc := range deployments {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			var h countHook
			s := newStore(t, c, nil)
			addHook(t, s, &h)
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

			// Pages as large as the listing, then a pass with none.
			h.n.Store(0)
			start = time.Now()
			if all := listStuck(t, s, 1000); len(all) != n {
				t.Fatalf("Stuck(limit 1000) listed %d records, want %d", len(all), n)
			}
			t.Logf("pages of 1000 for %d: %d round trips, %v", n, h.n.Load(), time.Since(start))
			for k := range want {
				if err := s.Purge(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
			h.n.Store(0)
			start = time.Now()
			if all := listStuck(t, s, 100); len(all) != 0 {
				t.Fatalf("Stuck after purging all listed %v", all)
			}
			t.Logf("a pass with nothing stuck: %d round trips, %v", h.n.Load(), time.Since(start))
		})
	}
}

// TestStuckCursor: a cursor is opaque and checked; one that this store
// did not make is an invalid argument, as is a limit below 1. A cursor
// naming a node that is not there goes on from the next address.
func TestStuckCursor(t *testing.T) {
	s := newStore(t, newSingle(t), nil)
	ctx := context.Background()
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	const id = "0123456789abcdef"
	for _, cursor := range []string{"x", "!!", enc("r1:001:12:k"), enc("r2:" + id), enc("r2:" + id + ":0"),
		enc("r2:0123:0:"), enc("r2:" + id + "::"), enc("r2:" + id + ":1a:"), enc("r2:" + id[:15] + "g:0:")} {
		if _, _, err := s.Stuck(ctx, cursor, 10); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("cursor %q: %v, want ErrInvalidArgument", cursor, err)
		}
	}
	if _, _, err := s.Stuck(ctx, "", 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("limit 0: %v, want ErrInvalidArgument", err)
	}
	// The single server's node has the address "": a cursor past it is
	// at the end.
	if infos, next, err := s.Stuck(ctx, enc("r2:"+id+":0:zz"), 10); err != nil || len(infos) != 0 || next != "" {
		t.Errorf("a cursor past the last node: %v, %q, %v", infos, next, err)
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

// TestStuckAfterScriptFlush: Stuck survives servers that lost their
// script cache (NOSCRIPT: the script runs again with EVAL), on a single
// server and on every node of a cluster.
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
