package idempotency_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// countingStore counts the claims that reach the store.
type countingStore struct {
	*memory.Store
	claims atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, r)
}

func cachedRunner(t *testing.T, s idempotency.Store, maxBytes int64, ttl time.Duration, opts ...idempotency.Option) *idempotency.Runner {
	t.Helper()
	r, err := idempotency.New(s, append([]idempotency.Option{idempotency.WithReplayCache(maxBytes, ttl)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReplayCacheAnswersWithoutTheStore: after a completion, repeats are
// answered from memory, with the record's fence, attempt and expiry; a
// replay the store answered is cached too; another fingerprint is a
// mismatch from memory as well; a []byte result is each caller's own.
func TestReplayCacheAnswersWithoutTheStore(t *testing.T) {
	ctx := context.Background()
	s := &countingStore{Store: memStore(nil)}
	r := cachedRunner(t, s, 1<<20, time.Minute)
	req := idempotency.Request{Scope: []string{"t"}, Key: "k", Fingerprint: "fp"}
	runs := 0
	fn := func(context.Context) ([]byte, error) { runs++; return []byte("ch_1"), nil }
	first, err := idempotency.Do(ctx, r, req, fn)
	if err != nil || first.Outcome != idempotency.OutcomeCompleted || first.ExpiresAt.IsZero() {
		t.Fatalf("first call: %+v, %v", first, err)
	}
	if d := time.Until(first.ExpiresAt); d <= idempotency.DefaultRetention-time.Minute || d > idempotency.DefaultRetention {
		t.Errorf("ExpiresAt is %v from now, want about the retention (%v)", d, idempotency.DefaultRetention)
	}
	for i := range 100 {
		res, err := idempotency.Do(ctx, r, req, fn)
		if err != nil || !res.Replayed || res.Outcome != idempotency.OutcomeReplay || string(res.Value) != "ch_1" ||
			res.Fence != first.Fence || res.Attempt != 1 || !res.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("repeat %d: %+v, %v", i, res, err)
		}
		res.Value[0] = 'X' // the caller's own bytes
	}
	if n := s.claims.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d claims reached the store and fn ran %d times for 101 calls, want 1 and 1", n, runs)
	}
	other := req
	other.Fingerprint = "another body"
	if res, err := idempotency.Do(ctx, r, other, fn); !errors.Is(err, idempotency.ErrMismatch) || res.Outcome != idempotency.OutcomeMismatch {
		t.Fatalf("another fingerprint: %+v, %v; want a mismatch", res, err)
	}
	if n := s.claims.Load(); n != 1 {
		t.Errorf("the mismatch reached the store (%d claims)", n)
	}

	// A record another runner completed: the store answers the first
	// replay, memory the next.
	r2 := cachedRunner(t, s, 1<<20, time.Minute)
	for range 3 {
		if res, err := idempotency.Do(ctx, r2, req, fn); err != nil || !res.Replayed || string(res.Value) != "ch_1" || res.ExpiresAt.IsZero() {
			t.Fatalf("replay through another runner: %+v, %v", res, err)
		}
	}
	if n := s.claims.Load(); n != 2 || runs != 1 {
		t.Fatalf("%d claims, %d runs; want the other runner's first replay only (2 claims, 1 run)", n, runs)
	}
}

// TestReplayCacheNeverPastTheRecord: an entry is answered for its time to
// live at most, and never past the record's own expiry, after which the
// key runs fn afresh as the store says.
func TestReplayCacheNeverPastTheRecord(t *testing.T) {
	ctx := context.Background()
	s := &countingStore{Store: memStore(nil)}
	const retention = 400 * time.Millisecond
	r := cachedRunner(t, s, 1<<20, time.Hour, idempotency.WithUnsafeShortDurations(),
		idempotency.WithLease(200*time.Millisecond), idempotency.WithStoreTimeout(50*time.Millisecond),
		idempotency.WithRetention(retention))
	req := idempotency.Request{Key: "short"}
	runs := 0
	fn := func(context.Context) (int, error) { runs++; return runs, nil }
	if _, err := idempotency.Do(ctx, r, req, fn); err != nil {
		t.Fatal(err)
	}
	if res, err := idempotency.Do(ctx, r, req, fn); err != nil || !res.Replayed {
		t.Fatalf("repeat within the retention: %+v, %v", res, err)
	}
	time.Sleep(retention + 100*time.Millisecond)
	res, err := idempotency.Do(ctx, r, req, fn)
	if err != nil || res.Replayed || res.Value != 2 || runs != 2 {
		t.Fatalf("after the record's retention: %+v, %v (runs %d); want fn run afresh, not a replay from memory", res, err, runs)
	}

	// A short time to live: after it, the store is asked again.
	r2 := cachedRunner(t, s, 1<<20, 100*time.Millisecond)
	req2 := idempotency.Request{Key: "ttl"}
	if _, err := idempotency.Do(ctx, r2, req2, fn); err != nil {
		t.Fatal(err)
	}
	before := s.claims.Load()
	idempotency.Do(ctx, r2, req2, fn)
	if s.claims.Load() != before {
		t.Fatal("a repeat within the time to live reached the store")
	}
	time.Sleep(150 * time.Millisecond)
	if res, err := idempotency.Do(ctx, r2, req2, fn); err != nil || !res.Replayed || s.claims.Load() != before+1 {
		t.Fatalf("after the time to live: %+v, %v, %d claims; want a replay from the store", res, err, s.claims.Load()-before)
	}
}

// TestReplayCachePurge: a purge through the runner drops its entry at
// once; another runner's purge is seen once the entry's time to live
// ends, which is the staleness the option documents.
func TestReplayCachePurge(t *testing.T) {
	ctx := context.Background()
	s := memStore(nil)
	const ttl = 200 * time.Millisecond
	a := cachedRunner(t, s, 1<<20, ttl)
	b, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	fn := func(context.Context) (int64, error) { return runs.Add(1), nil }
	req := idempotency.Request{Key: "purged"}

	idempotency.Do(ctx, a, req, fn)
	if err := a.Purge(ctx, req); err != nil {
		t.Fatal(err)
	}
	if res, err := idempotency.Do(ctx, a, req, fn); err != nil || res.Replayed || res.Value != 2 {
		t.Fatalf("after a purge through the runner: %+v, %v; want fn run afresh", res, err)
	}

	if err := b.Purge(ctx, req); err != nil {
		t.Fatal(err)
	}
	if res, err := idempotency.Do(ctx, a, req, fn); err != nil || !res.Replayed || res.Value != 2 {
		t.Fatalf("within the time to live after another runner's purge: %+v, %v; want the stale replay the option documents", res, err)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	if res, err := idempotency.Do(ctx, a, req, fn); err != nil || res.Replayed || res.Value != 3 {
		t.Fatalf("after the time to live: %+v, %v; want fn run afresh", res, err)
	}
}

// TestReplayCacheBounded: the cache keeps at most its size, dropping the
// least recently used entries, and keeps answering correctly under many
// goroutines.
func TestReplayCacheBounded(t *testing.T) {
	ctx := context.Background()
	s := &countingStore{Store: memStore(nil)}
	const entry = 1000 // bytes of result
	r := cachedRunner(t, s, 64*entry, time.Minute)
	result := strings.Repeat("x", entry)
	const keys = 500
	for i := range keys {
		idempotency.Do(ctx, r, idempotency.Request{Key: strconv.Itoa(i)}, func(context.Context) (string, error) { return result, nil })
	}
	before := s.claims.Load()
	for i := keys - 1; i >= 0; i-- { // the most recent first: a scan in insertion order would find none
		res, err := idempotency.Do(ctx, r, idempotency.Request{Key: strconv.Itoa(i)}, func(context.Context) (string, error) {
			t.Fatal("fn ran for a completed key")
			return "", nil
		})
		if err != nil || !res.Replayed || res.Value != result {
			t.Fatalf("key %d: %+v, %v", i, res, err)
		}
	}
	fromMemory := keys - (s.claims.Load() - before)
	if fromMemory > 64 {
		t.Errorf("%d of %d repeats answered from memory: more entries were kept than the size allows (64 of this size)", fromMemory, keys)
	}
	if fromMemory < 16 {
		t.Errorf("only %d of the most recent repeats answered from memory: the cache kept less than a fourth of its size", fromMemory)
	}

	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				k := strconv.Itoa((g*7 + i) % 40)
				res, err := idempotency.Do(ctx, r, idempotency.Request{Key: "c" + k}, func(context.Context) (string, error) { return k, nil })
				if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
					t.Error(err)
				}
				if err == nil && res.Value != k {
					t.Errorf("key c%s answered %q", k, res.Value)
				}
			}
		})
	}
	wg.Wait()
}

// alwaysTxStore runs every call as in a transaction of the caller's, to check
// what the core does there.
type alwaysTxStore struct{ *countingStore }

func (s alwaysTxStore) Capabilities() idempotency.Capabilities {
	return idempotency.Capabilities{Transactional: s}
}
func (alwaysTxStore) InTx(context.Context) bool                                { return true }
func (alwaysTxStore) Discard(context.Context, string, idempotency.Token) error { return nil }

// TestReplayCacheNotFilledInATransaction: a completion in a transaction
// may yet roll back, so it is not cached; and the option is refused with
// a size or a time to live that is not positive.
func TestReplayCacheNotFilledInATransaction(t *testing.T) {
	ctx := context.Background()
	s := &countingStore{Store: memStore(nil)}
	r := cachedRunner(t, alwaysTxStore{s}, 1<<20, time.Minute)
	req := idempotency.Request{Key: "tx"}
	if res, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) { return 1, nil }); err != nil || res.Outcome != idempotency.OutcomeCompleted {
		t.Fatalf("%+v, %v", res, err)
	}
	res, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) { return 2, nil })
	if err != nil || !res.Replayed || res.Value != 1 {
		t.Fatalf("repeat: %+v, %v", res, err)
	}
	if n := s.claims.Load(); n != 2 {
		t.Errorf("%d claims for a completion in a transaction and its repeat, want 2: the completion was cached", n)
	}
	if _, err := idempotency.New(memStore(nil), idempotency.WithReplayCache(0, time.Minute)); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithReplayCache") {
		t.Errorf("a zero size: %v, want ErrInvalidArgument naming WithReplayCache", err)
	}
	if _, err := idempotency.New(memStore(nil), idempotency.WithReplayCache(1<<20, 0)); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("a zero time to live: %v, want ErrInvalidArgument", err)
	}
}
