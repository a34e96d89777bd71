package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// batchStore counts the batch calls that reach the store, and can fail
// some items' claims or limit a batch's size.
type batchStore struct {
	*memory.Store
	claimBatches, finishBatches atomic.Int64
	largest, last               atomic.Int64
	maxBatch                    int
	failClaim                   func(key string) error
}

func (s *batchStore) Capabilities() idempotency.Capabilities {
	c := s.Store.Capabilities()
	c.Batcher = s
	c.Limits.MaxBatch = s.maxBatch
	return c
}

func (s *batchStore) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	s.claimBatches.Add(1)
	s.last.Store(int64(len(reqs)))
	if n := int64(len(reqs)); n > s.largest.Load() {
		s.largest.Store(n)
	}
	results, errs := s.Store.ClaimBatch(ctx, reqs)
	if s.failClaim != nil {
		for i, r := range reqs {
			if err := s.failClaim(r.Key); err != nil {
				results[i], errs[i] = idempotency.ClaimResult{}, err
			}
		}
	}
	return results, errs
}

func (s *batchStore) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	s.finishBatches.Add(1)
	return s.Store.FinishBatch(ctx, items)
}

func batchReqs(prefix string, n int) []idempotency.Request {
	reqs := make([]idempotency.Request, n)
	for i := range reqs {
		reqs[i] = idempotency.Request{Scope: []string{"t"}, Key: prefix + strconv.Itoa(i), Fingerprint: "fp"}
	}
	return reqs
}

// TestDoBatchTwoRoundTrips: a batch claims every item in one store call
// and completes them in one more; its repeat replays every item in one
// call, without running fn.
func TestDoBatchTwoRoundTrips(t *testing.T) {
	ctx := context.Background()
	s := &batchStore{Store: memStore(nil)}
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	reqs := batchReqs("k", 100)
	var runs atomic.Int64
	fn := func(ctx context.Context, i int) (string, error) {
		info, ok := idempotency.FromContext(ctx)
		if !ok || info.Key != reqs[i].Key {
			return "", fmt.Errorf("item %d runs under %+v", i, info)
		}
		runs.Add(1)
		return "v" + strconv.Itoa(i), nil
	}
	out := idempotency.DoBatch(ctx, r, reqs, fn)
	for i, o := range out {
		if o.Err != nil || o.Outcome != idempotency.OutcomeCompleted || !o.Ran || o.Value != "v"+strconv.Itoa(i) || o.Fence <= 0 {
			t.Fatalf("item %d: %+v", i, o)
		}
	}
	if c, f := s.claimBatches.Load(), s.finishBatches.Load(); c != 1 || f != 1 || runs.Load() != 100 {
		t.Fatalf("%d claim and %d finish calls, fn ran %d times; want 1, 1, 100", c, f, runs.Load())
	}
	again := idempotency.DoBatch(ctx, r, reqs, fn)
	for i, o := range again {
		if o.Err != nil || o.Outcome != idempotency.OutcomeReplay || !o.Replayed || o.Ran || o.Value != "v"+strconv.Itoa(i) || o.Fence != out[i].Fence {
			t.Fatalf("repeat of item %d: %+v", i, o)
		}
	}
	if c, f := s.claimBatches.Load(), s.finishBatches.Load(); c != 2 || f != 1 || runs.Load() != 100 {
		t.Fatalf("after the repeat: %d claim and %d finish calls, fn ran %d times; want 2, 1, 100", c, f, runs.Load())
	}
	if got := idempotency.DoBatch(ctx, r, nil, fn); len(got) != 0 {
		t.Fatalf("an empty batch: %d answers", len(got))
	}
}

// TestDoBatchItemsAreIndependent: an invalid key, a transient error, a
// permanent error, a duplicate key and a reused key with another request
// in one batch: each item gets Do's answer, and the others are untouched.
func TestDoBatchItemsAreIndependent(t *testing.T) {
	ctx := context.Background()
	s := &batchStore{Store: memStore(nil)}
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []idempotency.Request{
		{Key: "ok", Fingerprint: "a"},
		{Key: "", Fingerprint: "a"}, // invalid
		{Key: "transient", Fingerprint: "a"},
		{Key: "permanent", Fingerprint: "a"},
		{Key: "ok", Fingerprint: "a"},     // the same request as item 0
		{Key: "ok", Fingerprint: "other"}, // the same key, another request
		{Key: "last", Fingerprint: "a"},
	}
	runs := map[int]int{}
	errGateway := errors.New("gateway timeout")
	fn := func(ctx context.Context, i int) (int, error) {
		runs[i]++
		switch reqs[i].Key {
		case "transient":
			return 0, errGateway
		case "permanent":
			return 0, idempotency.Permanent(errors.New("declined"))
		}
		return 10 + i, nil
	}
	out := idempotency.DoBatch(ctx, r, reqs, fn)
	check := func(i int, outcome idempotency.Outcome, target error, value int) {
		t.Helper()
		o := out[i]
		if o.Outcome != outcome || (target == nil) != (o.Err == nil) || (target != nil && !errors.Is(o.Err, target)) || o.Value != value {
			t.Errorf("item %d (%q): %+v, %v; want %v, %v, %d", i, reqs[i].Key, o.Result, o.Err, outcome, target, value)
		}
	}
	check(0, idempotency.OutcomeCompleted, nil, 10)
	check(1, idempotency.OutcomeInvalidKey, idempotency.ErrInvalidKey, 0)
	check(2, idempotency.OutcomeReleased, errGateway, 0)
	check(3, idempotency.OutcomeCompleted, idempotency.ErrPermanent, 0)
	check(4, idempotency.OutcomeReplay, nil, 10)
	check(5, idempotency.OutcomeMismatch, idempotency.ErrMismatch, 0)
	check(6, idempotency.OutcomeCompleted, nil, 16)
	if runs[0] != 1 || runs[4] != 0 || runs[5] != 0 || runs[1] != 0 {
		t.Errorf("runs %v: want item 0 once, its duplicates and the invalid item never", runs)
	}
	// A retry of the batch: the released item runs again, the others
	// replay (the permanent error as a stored error).
	out = idempotency.DoBatch(ctx, r, reqs, fn)
	var se *idempotency.StoredError
	if runs[2] != 2 || out[2].Outcome != idempotency.OutcomeReleased || !out[0].Replayed || !errors.As(out[3].Err, &se) || runs[3] != 1 {
		t.Errorf("the retried batch: runs %v, answers %+v", runs, out)
	}
}

// TestDoBatchScopes: items of different scopes with the same client key
// are different records, each run once, in one store call; a scope part
// that is empty refuses that item alone.
func TestDoBatchScopes(t *testing.T) {
	ctx := context.Background()
	s := &batchStore{Store: memStore(nil)}
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []idempotency.Request{
		{Scope: []string{"tenant-a"}, Key: "k", Fingerprint: "a"},
		{Scope: []string{"tenant-b"}, Key: "k", Fingerprint: "b"}, // another request: no mismatch across scopes
		{Scope: []string{"tenant-a", ""}, Key: "k", Fingerprint: "a"},
		{Scope: []string{"tenant-a"}, Key: "k", Fingerprint: "a"}, // item 0 again
	}
	var runs [4]int
	out := idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (string, error) {
		runs[i]++
		return reqs[i].Scope[0], nil
	})
	if out[0].Outcome != idempotency.OutcomeCompleted || out[0].Value != "tenant-a" ||
		out[1].Outcome != idempotency.OutcomeCompleted || out[1].Value != "tenant-b" {
		t.Errorf("two scopes, one key: %+v / %+v; want each completed with its own value", out[0], out[1])
	}
	if !errors.Is(out[2].Err, idempotency.ErrInvalidKey) || out[2].Outcome != idempotency.OutcomeInvalidKey || runs[2] != 0 {
		t.Errorf("an empty scope part: %+v, %v, ran %d; want ErrInvalidKey, not run", out[2].Result, out[2].Err, runs[2])
	}
	if out[3].Outcome != idempotency.OutcomeReplay || out[3].Value != "tenant-a" || runs[3] != 0 || runs[0] != 1 || runs[1] != 1 {
		t.Errorf("item 0 again: %+v, runs %v; want tenant-a's answer, each scope run once", out[3], runs)
	}
	if n := s.claimBatches.Load(); n != 1 {
		t.Errorf("%d claim batches, want 1", n)
	}
}

// slowStore is a store with no Batcher whose every call takes delay.
type slowStore struct {
	idempotency.Store
	delay time.Duration
}

func (s slowStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	time.Sleep(s.delay)
	return s.Store.Claim(ctx, r)
}

func (s slowStore) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, retention time.Duration) error {
	time.Sleep(s.delay)
	return s.Store.Complete(ctx, key, tok, result, retention)
}

// TestDoBatchFallbackBoundsEachCall: on a store without a Batcher each
// item's call is bounded by the store timeout, as a call of Do is, not the
// whole batch's calls by one: 20 items of 40 ms each, a store timeout of
// 250 ms, all complete on their first attempt.
func TestDoBatchFallbackBoundsEachCall(t *testing.T) {
	s := slowStore{Store: memStore(nil), delay: 40 * time.Millisecond}
	var claims atomic.Int64
	counted := &countingClaims{Store: s, n: &claims}
	r, err := idempotency.New(counted, idempotency.WithStoreTimeout(250*time.Millisecond), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	if idempotency.CapabilitiesOf(counted).Batcher != nil {
		t.Fatal("the test store must have no Batcher")
	}
	out := idempotency.DoBatch(context.Background(), r, batchReqs("slow", 20), func(ctx context.Context, i int) (int, error) { return i, nil })
	for i, o := range out {
		if o.Err != nil || o.Outcome != idempotency.OutcomeCompleted || o.Value != i {
			t.Errorf("item %d: %+v, %v; want completed with %d", i, o.Result, o.Err, i)
		}
	}
	if n := claims.Load(); n != 20 {
		t.Errorf("%d claims for 20 items, want 20 (none repeated after a timeout)", n)
	}
}

// countingClaims counts the Claim calls of the store it wraps.
type countingClaims struct {
	idempotency.Store
	n *atomic.Int64
}

func (c *countingClaims) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	c.n.Add(1)
	return c.Store.Claim(ctx, r)
}

// TestDoBatchPerItemStoreErrors: a store error for one item's claim fails
// that item only, and an item that exceeds the store's batch size is sent
// in a later call.
func TestDoBatchPerItemStoreErrors(t *testing.T) {
	ctx := context.Background()
	errDown := errors.New("shard down")
	s := &batchStore{Store: memStore(nil), maxBatch: 7, failClaim: func(key string) error {
		if key == "1:t3:k13" {
			return errDown
		}
		return nil
	}}
	r, err := idempotency.New(s, idempotency.WithStoreRetries(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	reqs := batchReqs("k", 50)
	out := idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (int, error) { return i, nil })
	for i, o := range out {
		if i == 13 {
			if o.Outcome != idempotency.OutcomeStoreError || !errors.Is(o.Err, errDown) || !errors.Is(o.Err, idempotency.ErrStore) || o.Ran {
				t.Errorf("item 13: %+v, %v; want the store's error, fn not run", o.Result, o.Err)
			}
			continue
		}
		if o.Err != nil || o.Value != i {
			t.Errorf("item %d: %+v, %v", i, o.Result, o.Err)
		}
	}
	if n := s.largest.Load(); n > 7 {
		t.Errorf("a claim batch of %d items, over the store's MaxBatch of 7", n)
	}
	if n := s.claimBatches.Load(); n < 8 {
		t.Errorf("%d claim calls for 50 items in batches of 7 (and item 13 retried), want at least 8", n)
	}
}

// TestDoBatchRacesSingleCalls: batches and single calls of Do on the same
// keys, from many goroutines: every key's effect happens once, and every
// answer is that effect's value (or in progress).
func TestDoBatchRacesSingleCalls(t *testing.T) {
	ctx := context.Background()
	for _, store := range []struct {
		name string
		s    idempotency.Store
	}{{"batcher", &batchStore{Store: memStore(nil)}}, {"fallback", noBatch{memStore(nil)}}} {
		t.Run(store.name, func(t *testing.T) {
			r, err := idempotency.New(store.s)
			if err != nil {
				t.Fatal(err)
			}
			const keys = 40
			var effects [keys]atomic.Int64
			value := func(k int) string { return "effect-" + strconv.Itoa(k) }
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					reqs := batchReqs("race", keys)
					for i := range reqs { // each goroutine its own order
						j := (i*7 + g*13) % keys
						reqs[i], reqs[j] = reqs[j], reqs[i]
					}
					idx := func(req idempotency.Request) int { k, _ := strconv.Atoi(req.Key[len("race"):]); return k }
					for _, o := range idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (string, error) {
						k := idx(reqs[i])
						effects[k].Add(1)
						return value(k), nil
					}) {
						if o.Err != nil && !errors.Is(o.Err, idempotency.ErrInProgress) {
							t.Error(o.Err)
						}
					}
					for _, req := range reqs[:10] {
						res, err := idempotency.Do(ctx, r, req, func(context.Context) (string, error) {
							effects[idx(req)].Add(1)
							return value(idx(req)), nil
						})
						if err == nil && res.Value != value(idx(req)) {
							t.Errorf("key %s answered %q", req.Key, res.Value)
						}
						if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			for k := range keys {
				if n := effects[k].Load(); n != 1 {
					t.Errorf("key %d: %d effects, want 1", k, n)
				}
			}
		})
	}
}

// noBatch hides the memory store's Batcher: DoBatch falls back to a call
// per item.
type noBatch struct{ *memory.Store }

func (s noBatch) Capabilities() idempotency.Capabilities {
	c := s.Store.Capabilities()
	c.Batcher = nil
	return c
}

// TestDoBatchPanic: a panic in one item's fn completes the items that
// ran before it, releases it and the items after it, and goes on.
func TestDoBatchPanic(t *testing.T) {
	ctx := context.Background()
	r, err := idempotency.New(memStore(nil))
	if err != nil {
		t.Fatal(err)
	}
	reqs := batchReqs("p", 5)
	var ran []int
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (int, error) {
			ran = append(ran, i)
			if i == 2 {
				panic("bug")
			}
			return i, nil
		})
	}()
	if fmt.Sprint(ran) != "[0 1 2]" {
		t.Fatalf("ran %v, want [0 1 2]", ran)
	}
	out := idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (int, error) { return 100 + i, nil })
	for i, o := range out {
		replayed := i < 2
		if o.Err != nil || o.Replayed != replayed || (replayed && o.Value != i) || (!replayed && o.Value != 100+i) {
			t.Errorf("item %d after the panic: %+v; want items 0 and 1 replayed, the others run afresh", i, o.Result)
		}
	}
}

// TestDoBatchLeaseLostBeforeItsTurn: an item whose lease is taken over
// while earlier items run does not run.
func TestDoBatchLeaseLostBeforeItsTurn(t *testing.T) {
	ctx := context.Background()
	s := memStore(nil)
	r, err := idempotency.New(s, idempotency.WithLease(300*time.Millisecond), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	reqs := batchReqs("lost", 2)
	key1, _ := r.StorageKey(reqs[1])
	out := idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (int, error) {
		if i == 0 {
			// Another holder takes item 1 over: purge it and claim it.
			if err := s.Purge(ctx, key1); err != nil {
				return 0, err
			}
			if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key1, Fingerprint: "fp", Token: "other", Lease: time.Minute}); err != nil {
				return 0, err
			}
			time.Sleep(250 * time.Millisecond) // past item 1's first renewal
		}
		return i, nil
	})
	if out[0].Err != nil || out[0].Outcome != idempotency.OutcomeCompleted {
		t.Errorf("item 0: %+v, %v", out[0].Result, out[0].Err)
	}
	if !errors.Is(out[1].Err, idempotency.ErrLeaseLost) || out[1].Outcome != idempotency.OutcomeLeaseLost || out[1].Ran {
		t.Errorf("item 1: %+v, %v; want its lease lost and fn not run", out[1].Result, out[1].Err)
	}
}

// TestDoBatchObserved: a CallObserver sees every item as a call.
func TestDoBatchObserved(t *testing.T) {
	ctx := context.Background()
	o := &callRecorder{}
	r, err := idempotency.New(memStore(nil), idempotency.WithObserver(o))
	if err != nil {
		t.Fatal(err)
	}
	reqs := append(batchReqs("obs", 3), idempotency.Request{Key: ""})
	idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (int, error) { return i, nil })
	o.mu.Lock()
	defer o.mu.Unlock()
	if fmt.Sprint(o.outcomes) != "[completed completed completed invalid_key]" || o.started != 4 {
		t.Errorf("calls seen: %d started, ended %v", o.started, o.outcomes)
	}
}

type callRecorder struct {
	mu       sync.Mutex
	started  int
	outcomes []string
}

func (c *callRecorder) Observe(context.Context, idempotency.Event) {}
func (c *callRecorder) StartCall(ctx context.Context, _ []string) context.Context {
	c.mu.Lock()
	c.started++
	c.mu.Unlock()
	return ctx
}
func (c *callRecorder) EndCall(_ context.Context, call idempotency.Call) {
	c.mu.Lock()
	c.outcomes = append(c.outcomes, call.Outcome.String())
	c.mu.Unlock()
}

// TestDoBatchBadArguments: a nil runner, fn or context fails every item
// with ErrInvalidArgument, and reaches no store.
func TestDoBatchBadArguments(t *testing.T) {
	s := &batchStore{Store: memStore(nil)}
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, int) (string, error) { return "v", nil }
	reqs := batchReqs("k", 3)
	for name, out := range map[string][]idempotency.BatchResult[string]{
		"nil runner":  idempotency.DoBatch(context.Background(), nil, reqs, fn),
		"nil fn":      idempotency.DoBatch[string](context.Background(), r, reqs, nil),
		"nil context": idempotency.DoBatch(nil, r, reqs, fn), //lint:ignore SA1012 the nil context is the case under test
	} {
		if len(out) != len(reqs) {
			t.Fatalf("%s: %d answers for %d requests", name, len(out), len(reqs))
		}
		for i, o := range out {
			if !errors.Is(o.Err, idempotency.ErrInvalidArgument) || o.Ran {
				t.Errorf("%s, item %d: %+v; want ErrInvalidArgument, not run", name, i, o)
			}
		}
	}
	if c, f := s.claimBatches.Load(), s.finishBatches.Load(); c != 0 || f != 0 {
		t.Errorf("%d claim and %d finish calls reached the store, want none", c, f)
	}
}

// TestDoBatchReplayCache: with the replay cache, the items of a batch
// already completed through this runner are answered from memory (a
// replay, or a mismatch for another fingerprint) and only the others are
// claimed, in one call.
func TestDoBatchReplayCache(t *testing.T) {
	ctx := context.Background()
	s := &batchStore{Store: memStore(nil)}
	r := cachedRunner(t, s, 1<<20, time.Minute)
	fn := func(_ context.Context, i int) (string, error) { return "v" + strconv.Itoa(i), nil }
	first := idempotency.DoBatch(ctx, r, batchReqs("k", 2), fn)
	for i, o := range first {
		if o.Err != nil || o.Outcome != idempotency.OutcomeCompleted {
			t.Fatalf("item %d: %+v", i, o)
		}
	}
	reqs := append(batchReqs("k", 2), batchReqs("new", 1)...)
	reqs[1].Fingerprint = "another body"
	var ran []int
	out := idempotency.DoBatch(ctx, r, reqs, func(ctx context.Context, i int) (string, error) {
		ran = append(ran, i)
		return fn(ctx, i)
	})
	if o := out[0]; o.Err != nil || o.Outcome != idempotency.OutcomeReplay || !o.Replayed || o.Value != "v0" || o.Fence != first[0].Fence {
		t.Errorf("the completed item: %+v; want its replay", o)
	}
	if o := out[1]; !errors.Is(o.Err, idempotency.ErrMismatch) || o.Outcome != idempotency.OutcomeMismatch {
		t.Errorf("the completed key with another fingerprint: %+v; want a mismatch", o)
	}
	if o := out[2]; o.Err != nil || o.Outcome != idempotency.OutcomeCompleted || o.Value != "v2" {
		t.Errorf("the new item: %+v", o)
	}
	if len(ran) != 1 || ran[0] != 2 {
		t.Errorf("fn ran for items %v, want [2]", ran)
	}
	if c := s.claimBatches.Load(); c != 2 {
		t.Errorf("%d claim calls for the two batches, want 2 (the cached items claimed by none)", c)
	}
	if got := s.last.Load(); got != 1 {
		t.Errorf("the second batch claimed %d items, want 1 (its new item only)", got)
	}
}
