package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/batchtest"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// batchKeys returns n storage keys for a batch.
func batchKeys(n int, tag string) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("3:%s-%04d", tag, i)
	}
	return keys
}

// claims returns a batch of claims of keys, each with its own token.
func claims(keys []string, lease time.Duration) []idempotency.ClaimRequest {
	reqs := make([]idempotency.ClaimRequest, len(keys))
	for i, k := range keys {
		reqs[i] = claimReq(k, idempotency.Token("t-"+k), lease)
	}
	return reqs
}

// TestBatchRoundTrips counts what batches send, with a go-redis hook: on a
// single server a ClaimBatch and a FinishBatch are one pipeline each
// whatever their size, and a DoBatch of fresh keys two; on the cluster,
// one pipeline per master that owns some of the keys (each node client
// counts its own), never more, for a batch that spans hundreds of slots.
// (A pipeline of EVAL follows one that met NOSCRIPT: the servers are
// shared, and another test may flush their scripts meanwhile.)
func TestBatchRoundTrips(t *testing.T) {
	ctx := context.Background()
	t.Run("single", func(t *testing.T) {
		c := newSingle(t)
		var h pipeHook
		s := newStore(t, c, nil)
		addHook(t, s, &h)
		warmUp(t, s)
		for _, n := range []int{1, 10, 300} {
			reqs := claims(batchKeys(n, fmt.Sprintf("rt%d", n)), time.Minute)
			h.reset()
			batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
			h.check(t, fmt.Sprintf("ClaimBatch of %d", n), 1)
			batchtest.MustFinish(t, s, batchtest.Completions(reqs, time.Minute))
			h.check(t, fmt.Sprintf("FinishBatch of %d", n), 1)
		}
		r, err := idempotency.New(s)
		if err != nil {
			t.Fatal(err)
		}
		reqs := make([]idempotency.Request, 100)
		for i := range reqs {
			reqs[i] = idempotency.Request{Scope: []string{"tenant"}, Key: fmt.Sprintf("do-%d", i), Fingerprint: fingerprint}
		}
		h.reset()
		for i, res := range idempotency.DoBatch(ctx, r, reqs, func(_ context.Context, i int) (int, error) { return i, nil }) {
			if res.Err != nil || res.Outcome != idempotency.OutcomeCompleted || res.Value != i {
				t.Fatalf("DoBatch item %d: %+v", i, res)
			}
		}
		h.check(t, "DoBatch of 100 fresh keys", 2)
	})
	t.Run("cluster", func(t *testing.T) {
		var h pipeHook
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: clusterAddrs(t), PoolTimeout: poolTimeout})
		t.Cleanup(func() { _ = c.Close() })
		c.OnNewNode(func(n *goredis.Client) { n.AddHook(&h) })
		var masters atomic.Int64
		if err := c.ForEachMaster(ctx, func(context.Context, *goredis.Client) error {
			masters.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s := newStore(t, c, nil)
		warmUp(t, s)
		reqs := claims(batchKeys(500, "rtc"), time.Minute)
		tags := map[string]bool{}
		for _, r := range reqs {
			k := s.Key(r.Key)
			tags[k[strings.IndexByte(k, '{'):][:5]] = true
		}
		if len(tags) < 300 {
			t.Fatalf("the batch spans %d hash tags, want hundreds", len(tags))
		}
		h.reset()
		batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
		h.check(t, fmt.Sprintf("ClaimBatch of 500 keys on %d hash tags", len(tags)), masters.Load())
		batchtest.MustFinish(t, s, batchtest.Completions(reqs, time.Minute))
		h.check(t, "FinishBatch of 500 keys", masters.Load())
		batchtest.MustClaim(t, s, claims(batchKeys(500, "rtc"), time.Minute), idempotency.OutcomeReplay)
	})
}

// pipeHook counts the pipelines of EVALSHA and those of EVAL, which
// follow a NOSCRIPT reply (the servers are shared: another test may flush
// their scripts at any time), and every other command or pipeline but a
// new connection's handshake.
type pipeHook struct{ evalsha, eval, other atomic.Int64 }

func (h *pipeHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *pipeHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !handshake(cmd) {
			h.other.Add(1)
		}
		return next(ctx, cmd)
	}
}

// handshake reports whether cmd is one go-redis sends on a new connection
// (through the client's hooks), before the connection serves a call.
func handshake(cmd goredis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select", "readonly":
		return true
	}
	return false
}

func (h *pipeHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		switch cmds[0].Name() {
		case "evalsha":
			h.evalsha.Add(1)
		case "eval":
			h.eval.Add(1)
		default:
			if !handshake(cmds[0]) {
				h.other.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// check requires want pipelines of EVALSHA, at most as many of EVAL and
// nothing else since the last check.
func (h *pipeHook) check(t *testing.T, what string, want int64) {
	t.Helper()
	sha, eval, other := h.evalsha.Swap(0), h.eval.Swap(0), h.other.Swap(0)
	if sha != want || eval > want || other != 0 {
		t.Errorf("%s: %d pipelines of EVALSHA, %d of EVAL (after NOSCRIPT) and %d other round trips; want %d, at most %d and none", what, sha, eval, other, want, want)
	}
	if eval > 0 {
		t.Logf("%s: %d pipelines of EVAL after NOSCRIPT (a script flush meanwhile)", what, eval)
	}
}

func (h *pipeHook) reset() { h.evalsha.Store(0); h.eval.Store(0); h.other.Store(0) }

// warmUp loads the claim, completion and release scripts: after a SCRIPT
// FLUSH the first EVALSHA of each costs one more round trip.
func warmUp(t *testing.T, s *idemredis.Store) {
	t.Helper()
	reqs := claims([]string{"3:warm-a", "3:warm-b"}, time.Minute)
	batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
	batchtest.MustFinish(t, s, []idempotency.Finish{
		{Key: reqs[0].Key, Token: reqs[0].Token, Result: []byte("r"), Retention: time.Minute},
		{Key: reqs[1].Key, Token: reqs[1].Token, Release: true},
	})
}

// TestBatchAfterScriptFlush: batches on servers that lost their scripts
// (the whole pipeline answered NOSCRIPT) still apply every item, with the
// right outcome: the items are sent again with EVAL.
func TestBatchAfterScriptFlush(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		client idemredis.Client
	}{{"single", newSingle(t)}, {"cluster", newCluster(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.client, nil)
			reqs := claims(batchKeys(64, "flush"), time.Minute)
			flush := func() {
				if err := flushScripts(ctx, tc.client); err != nil {
					t.Fatal(err)
				}
			}
			flush()
			batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
			flush()
			batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired) // a repeat by the holders
			items := batchtest.Completions(reqs, time.Minute)
			for i := range items[:32] {
				items[i] = idempotency.Finish{Key: reqs[i].Key, Token: reqs[i].Token, Release: true}
			}
			flush()
			batchtest.MustFinish(t, s, items)
			flush()
			res, errs := s.ClaimBatch(ctx, claims(batchKeys(64, "flush"), time.Minute))
			for i := range res {
				want := idempotency.OutcomeReplay
				if i < 32 {
					want = idempotency.OutcomeAcquired // released: claimed anew
				}
				if errs[i] != nil || res[i].Outcome != want {
					t.Fatalf("item %d after the batch: %+v, %v; want %v", i, res[i], errs[i], want)
				}
				if want == idempotency.OutcomeReplay && string(res[i].Result) != "result of "+reqs[i].Key {
					t.Fatalf("item %d replays %q", i, res[i].Result)
				}
			}
		})
	}
}

// TestBatchItemsApart: an item the store refuses (a NUL in its key, a bad
// lease, a result above MaxValueSize, a token that lost its record) gets
// its own error, before anything is sent for it; the other items of the
// batch are applied. An empty batch sends nothing, and a canceled context
// fails every item and sends nothing.
func TestBatchItemsApart(t *testing.T) {
	ctx := context.Background()
	c := newSingle(t)
	var h pipeHook
	s := newStore(t, c, &idemredis.Options{MaxValueSize: 16})
	addHook(t, s, &h)
	warmUp(t, s)

	h.reset()
	if res, errs := s.ClaimBatch(ctx, nil); len(res) != 0 || len(errs) != 0 {
		t.Fatalf("empty ClaimBatch: %v, %v", res, errs)
	}
	if errs := s.FinishBatch(ctx, []idempotency.Finish{}); len(errs) != 0 {
		t.Fatalf("empty FinishBatch: %v", errs)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	reqs := claims(batchKeys(3, "apart"), time.Minute)
	_, errs := s.ClaimBatch(canceled, reqs)
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("ClaimBatch item %d under a canceled context: %v", i, err)
		}
	}
	for i, err := range s.FinishBatch(canceled, batchtest.Completions(reqs, time.Minute)) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("FinishBatch item %d under a canceled context: %v", i, err)
		}
	}
	h.check(t, "empty and canceled batches", 0)

	bad := append([]idempotency.ClaimRequest{}, reqs...)
	bad = append(bad[:1], append([]idempotency.ClaimRequest{
		claimReq("3:nul\x00key", "t", time.Minute),
		claimReq("3:no-lease", "t", 0),
	}, bad[1:]...)...)
	res, errs := s.ClaimBatch(ctx, bad)
	for i := range bad {
		switch i {
		case 1, 2:
			if !errors.Is(errs[i], idempotency.ErrInvalidArgument) {
				t.Errorf("item %d (%q): %v, want ErrInvalidArgument", i, bad[i].Key, errs[i])
			}
		default:
			if errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired {
				t.Errorf("item %d beside refused ones: %+v, %v; want acquired", i, res[i], errs[i])
			}
		}
	}
	h.check(t, "a batch with refused items", 1)

	stale := claims([]string{"3:apart-stale"}, time.Minute)[0]
	mustClaim(t, s, stale, idempotency.OutcomeAcquired)
	if err := s.Release(ctx, stale.Key, stale.Token); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, claimReq(stale.Key, "other", time.Minute), idempotency.OutcomeAcquired)
	items := []idempotency.Finish{
		{Key: reqs[0].Key, Token: reqs[0].Token, Result: []byte("short"), Retention: time.Minute},
		{Key: reqs[1].Key, Token: reqs[1].Token, Result: []byte("seventeen bytes!!"), Retention: time.Minute},
		{Key: stale.Key, Token: stale.Token, Result: []byte("stale"), Retention: time.Minute},
		{Key: reqs[2].Key, Token: reqs[2].Token, Release: true},
		{Key: "3:no-retention", Token: "t", Result: []byte("x")},
	}
	errs = s.FinishBatch(ctx, items)
	if errs[0] != nil || errs[3] != nil {
		t.Errorf("FinishBatch: items 0 and 3: %v, %v; want success", errs[0], errs[3])
	}
	if !errors.Is(errs[1], idempotency.ErrTooLarge) {
		t.Errorf("FinishBatch: a result above MaxValueSize: %v, want ErrTooLarge", errs[1])
	}
	if !errors.Is(errs[2], idempotency.ErrLeaseLost) {
		t.Errorf("FinishBatch: a stale token: %v, want ErrLeaseLost", errs[2])
	}
	if !errors.Is(errs[4], idempotency.ErrInvalidArgument) {
		t.Errorf("FinishBatch: no retention: %v, want ErrInvalidArgument", errs[4])
	}
	mustClaim(t, s, claimReq(reqs[0].Key, "x", time.Minute), idempotency.OutcomeReplay)
	mustClaim(t, s, claimReq(reqs[1].Key, "x", time.Minute), idempotency.OutcomeInProgress) // untouched
	mustClaim(t, s, claimReq(stale.Key, "x", time.Minute), idempotency.OutcomeInProgress)   // the new holder's
	mustClaim(t, s, claimReq(reqs[2].Key, "x", time.Minute), idempotency.OutcomeAcquired)   // released
}

// TestBatchNodeDown: on a cluster whose slots are half on a server that
// refuses connections (or never answers), a batch fails the items on that
// node only, at once (a refused dial) or when the context ends (a server
// that hangs), and applies the others.
func TestBatchNodeDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"closed_port", func(t *testing.T) string { return closedPort(t) }},
		{"black_hole", func(t *testing.T) string { return newBlackHole(t).Addr() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good, down := singleAddr(t), tc.addr(t)
			c := goredis.NewClusterClient(&goredis.ClusterOptions{ClusterSlots: func(context.Context) ([]goredis.ClusterSlot, error) {
				return []goredis.ClusterSlot{
					{Start: 0, End: 8191, Nodes: []goredis.ClusterNode{{Addr: good}}},
					{Start: 8192, End: 16383, Nodes: []goredis.ClusterNode{{Addr: down}}},
				}, nil
			}})
			t.Cleanup(func() { _ = c.Close() })
			s := newStore(t, c, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			reqs := claims(batchKeys(64, "down"), time.Minute)
			res, errs := s.ClaimBatch(ctx, reqs)
			var up, failed int
			for i, r := range reqs {
				n, err := c.MasterForKey(ctx, s.Key(r.Key))
				if err != nil {
					t.Fatal(err)
				}
				if samePort(n.Options().Addr, good) {
					up++
					if errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired {
						t.Errorf("item %d on the server that answers: %+v, %v; want acquired", i, res[i], errs[i])
					}
					continue
				}
				failed++
				if errs[i] == nil {
					t.Errorf("item %d on the node that is down: %+v, no error", i, res[i])
				}
			}
			if up == 0 || failed == 0 {
				t.Fatalf("%d items on the server that answers, %d on the one that is down: want both", up, failed)
			}
		})
	}
}

// samePort reports whether two addresses have the same port: the cluster
// client names its nodes without the loopback host.
func samePort(a, b string) bool {
	_, pa, _ := net.SplitHostPort(a)
	_, pb, _ := net.SplitHostPort(b)
	return pa == pb
}

// TestBatchWaitsForReplicas: with Replicas set, each node's pipeline ends
// with a WAIT, judged for each item that wrote: asking for more replicas
// than the server has fails the acquisitions and completions of a batch
// with ErrNotReplicated (written, safe to repeat), while a replay in the
// same batch, which writes nothing, succeeds.
func TestBatchWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	c := newSingle(t)
	prefix := uniquePrefix()
	direct := newStore(t, c, &idemredis.Options{Prefix: prefix})
	short := newStore(t, c, &idemredis.Options{Prefix: prefix, Replicas: len(onlineReplicas(t, c)) + 1, ReplicaTimeout: 20 * time.Millisecond})
	done := claims([]string{"3:wait-done"}, time.Minute)
	batchtest.MustClaim(t, direct, done, idempotency.OutcomeAcquired)
	batchtest.MustFinish(t, direct, batchtest.Completions(done, time.Minute))

	reqs := append(claims(batchKeys(5, "wait"), time.Minute), claimReq(done[0].Key, "other", time.Minute))
	res, errs := short.ClaimBatch(ctx, reqs)
	for i := range reqs[:5] {
		if !errors.Is(errs[i], idemredis.ErrNotReplicated) {
			t.Errorf("item %d: %+v, %v; want ErrNotReplicated", i, res[i], errs[i])
		}
	}
	if errs[5] != nil || res[5].Outcome != idempotency.OutcomeReplay {
		t.Errorf("replay in the batch: %+v, %v; want a replay and no error", res[5], errs[5])
	}
	batchtest.MustClaim(t, direct, reqs[:5], idempotency.OutcomeAcquired) // written: the holders' repeat
	for i, err := range short.FinishBatch(ctx, batchtest.Completions(reqs[:5], time.Minute)) {
		if !errors.Is(err, idemredis.ErrNotReplicated) {
			t.Errorf("completion %d: %v, want ErrNotReplicated", i, err)
		}
	}
	batchtest.MustClaim(t, direct, claims(batchKeys(5, "wait"), time.Minute), idempotency.OutcomeReplay)
}

// TestBatchWakesWatchers: with Notify, each completion and release of a
// FinishBatch publishes from its own script, waking the watchers of its
// record.
func TestBatchWakesWatchers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client idemredis.Client
	}{{"single", newSingle(t)}, {"cluster", newCluster(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.client, &idemredis.Options{Notify: true})
			reqs := claims(batchKeys(8, "watch"), time.Minute)
			batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			woke := make(chan error, len(reqs))
			for _, r := range reqs {
				go func() { woke <- s.Watch(ctx, r.Key) }()
			}
			// Watch subscribes, then reads the state: wait until every
			// watcher subscribed, so that the wake-up is the message's.
			waitSubscribers(t, ctx, tc.client, s, reqs)
			items := batchtest.Completions(reqs, time.Minute)
			items[0] = idempotency.Finish{Key: reqs[0].Key, Token: reqs[0].Token, Release: true}
			batchtest.MustFinish(t, s, items)
			for range reqs {
				if err := <-woke; err != nil {
					t.Fatalf("Watch: %v", err)
				}
			}
		})
	}
}

// waitSubscribers waits until every record of reqs has a subscriber on its
// shard channel.
func waitSubscribers(t *testing.T, ctx context.Context, client idemredis.Client, s *idemredis.Store, reqs []idempotency.ClaimRequest) {
	t.Helper()
	for _, r := range reqs {
		k := s.Key(r.Key)
		for {
			var n int64
			var err error
			switch c := client.(type) {
			case *goredis.ClusterClient:
				var node *goredis.Client
				if node, err = c.MasterForKey(ctx, k); err == nil {
					n, err = numSub(ctx, node, k)
				}
			case *goredis.Client:
				n, err = numSub(ctx, c, k)
			}
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no subscriber on %q", k)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

func numSub(ctx context.Context, c *goredis.Client, channel string) (int64, error) {
	m, err := c.PubSubShardNumSub(ctx, channel).Result()
	return m[channel], err
}
