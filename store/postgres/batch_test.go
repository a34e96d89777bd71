package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// The Batcher's bad input and edges, beside the conformance suite's batch
// cases (which TestConformance runs in every query mode).

func batchStore(t *testing.T, opts *postgres.Options) (*postgres.Store, *idempotency.Runner) {
	t.Helper()
	s := newStore(t, testPool(t, pgx.QueryExecModeCacheStatement), opts)
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return s, r
}

func claimReq(key string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: idempotency.Token("tok-" + randomHex(8)), Lease: time.Minute, Grace: time.Minute}
}

func TestBatchEmpty(t *testing.T) {
	s, r := batchStore(t, nil)
	ctx := context.Background()
	res, errs := s.ClaimBatch(ctx, nil)
	if len(res) != 0 || len(errs) != 0 {
		t.Errorf("ClaimBatch(nil): %d results, %d errors, want none", len(res), len(errs))
	}
	if errs := s.FinishBatch(ctx, []idempotency.Finish{}); len(errs) != 0 {
		t.Errorf("FinishBatch of no items: %d errors, want none", len(errs))
	}
	ran := false
	out := idempotency.DoBatch(ctx, r, nil, func(context.Context, int) (int, error) { ran = true; return 0, nil })
	if len(out) != 0 || ran {
		t.Errorf("DoBatch of no requests: %d answers, fn ran %v; want none and no run", len(out), ran)
	}
}

// Two requests for one key in one ClaimBatch are claimed one after
// another, as two single claims: the second is the holder's repeat (same
// token) or in progress (another token).
func TestBatchDuplicateKeys(t *testing.T) {
	s, r := batchStore(t, nil)
	ctx := context.Background()
	a, b := claimReq("dup-a"), claimReq("dup-b")
	other := claimReq("dup-a")
	res, errs := s.ClaimBatch(ctx, []idempotency.ClaimRequest{a, b, a, other})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if res[0].Outcome != idempotency.OutcomeAcquired || res[1].Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("first claims of two keys: %v, %v, want acquired", res[0].Outcome, res[1].Outcome)
	}
	if res[2].Outcome != idempotency.OutcomeAcquired || res[2].Fence != res[0].Fence {
		t.Errorf("the holder's repeat in the same batch: %v fence %d, want acquired with fence %d", res[2].Outcome, res[2].Fence, res[0].Fence)
	}
	if res[3].Outcome != idempotency.OutcomeInProgress || res[3].RetryAfter <= 0 {
		t.Errorf("another token's claim of the key in the same batch: %v (retry after %v), want in progress with the time left", res[3].Outcome, res[3].RetryAfter)
	}
	// The same key twice in one FinishBatch: the second completion is a
	// repeat by the same token, and succeeds without changing the result.
	ferrs := s.FinishBatch(ctx, []idempotency.Finish{
		{Key: a.Key, Token: a.Token, Result: []byte("first"), Retention: time.Minute},
		{Key: a.Key, Token: a.Token, Result: []byte("second"), Retention: time.Minute},
		{Key: b.Key, Token: b.Token, Release: true},
		{Key: b.Key, Token: b.Token, Release: true},
	})
	for i, err := range ferrs {
		if err != nil {
			t.Errorf("finish item %d: %v", i, err)
		}
	}
	got, err := s.Claim(ctx, claimReq(a.Key))
	if err != nil || got.Outcome != idempotency.OutcomeReplay || string(got.Result) != "first" {
		t.Errorf("replay after the batch: %v %q %v, want the first completion's result", got.Outcome, got.Result, err)
	}

	// Through DoBatch: the effect runs once, both items get its answer.
	var runs atomic.Int32
	reqs := []idempotency.Request{{Key: "k-dup"}, {Key: "k-other"}, {Key: "k-dup"}}
	out := idempotency.DoBatch(ctx, r, reqs, func(_ context.Context, i int) (string, error) {
		runs.Add(1)
		return fmt.Sprint("v", i), nil
	})
	if n := runs.Load(); n != 2 {
		t.Errorf("fn ran %d times for two distinct keys, want 2", n)
	}
	if out[0].Err != nil || out[2].Err != nil || out[0].Value != "v0" || out[2].Value != "v0" {
		t.Errorf("duplicates in DoBatch: %+v, %+v, want both v0", out[0], out[2])
	}
}

// An invalid item in the middle of a batch gets its own error; the others
// are claimed and finished.
func TestBatchInvalidItem(t *testing.T) {
	s, r := batchStore(t, &postgres.Options{MaxValueSize: 1 << 10})
	ctx := context.Background()
	good1, good2 := claimReq("inv-1"), claimReq("inv-2")
	bad := claimReq("")
	res, errs := s.ClaimBatch(ctx, []idempotency.ClaimRequest{good1, bad, good2})
	if !errors.Is(errs[1], idempotency.ErrInvalidArgument) {
		t.Errorf("item with an empty key: %v, want ErrInvalidArgument", errs[1])
	}
	if errs[0] != nil || errs[2] != nil || res[0].Outcome != idempotency.OutcomeAcquired || res[2].Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("the valid items: %v %v, %v %v, want acquired", res[0].Outcome, errs[0], res[2].Outcome, errs[2])
	}
	ferrs := s.FinishBatch(ctx, []idempotency.Finish{
		{Key: good1.Key, Token: good1.Token, Result: []byte("ok"), Retention: time.Minute},
		{Key: good2.Key, Token: good2.Token, Result: make([]byte, 2<<10), Retention: time.Minute},
		{Key: good2.Key, Token: good2.Token, Result: []byte("ok"), Retention: 0},
	})
	if ferrs[0] != nil {
		t.Errorf("valid completion: %v", ferrs[0])
	}
	if !errors.Is(ferrs[1], idempotency.ErrTooLarge) {
		t.Errorf("result above MaxValueSize: %v, want ErrTooLarge", ferrs[1])
	}
	if !errors.Is(ferrs[2], idempotency.ErrInvalidArgument) {
		t.Errorf("zero retention: %v, want ErrInvalidArgument", ferrs[2])
	}
	if err := s.Renew(ctx, good2.Key, good2.Token, time.Minute); err != nil {
		t.Errorf("the record whose completions were refused is still held: %v", err)
	}

	var ran []int
	reqs := []idempotency.Request{{Key: "ok-1"}, {Key: "bad\x00key"}, {Key: "ok-2"}}
	out := idempotency.DoBatch(ctx, r, reqs, func(_ context.Context, i int) (int, error) {
		ran = append(ran, i)
		return i, nil
	})
	if !errors.Is(out[1].Err, idempotency.ErrInvalidKey) {
		t.Errorf("DoBatch item with an invalid key: %v, want ErrInvalidKey", out[1].Err)
	}
	if out[0].Err != nil || out[2].Err != nil || len(ran) != 2 {
		t.Errorf("DoBatch's valid items: %v, %v, ran %v; want both run", out[0].Err, out[2].Err, ran)
	}
}

// A batch whose items as parameters of a multi-row statement would be far
// more than PostgreSQL's 65535 (five per claim) goes through in several
// statements, and every item is answered: acquired, then replayed.
func TestBatchBeyondParameterLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("14 000 records")
	}
	_, r := batchStore(t, nil)
	ctx := context.Background()
	const n = 14_000 // 70 000 parameters at five per item
	reqs := make([]idempotency.Request, n)
	for i := range reqs {
		reqs[i] = idempotency.Request{Key: fmt.Sprint("big-", i)}
	}
	runs := 0
	fn := func(_ context.Context, i int) (int, error) { runs++; return i, nil }
	for pass, want := range []idempotency.Outcome{idempotency.OutcomeCompleted, idempotency.OutcomeReplay} {
		out := idempotency.DoBatch(ctx, r, reqs, fn)
		for i, o := range out {
			if o.Err != nil || o.Outcome != want || o.Value != i {
				t.Fatalf("pass %d, item %d: %v %v value %d, want %v with value %d", pass, i, o.Outcome, o.Err, o.Value, want, i)
			}
		}
	}
	if runs != n {
		t.Errorf("fn ran %d times over two passes of %d keys, want %d", runs, n, n)
	}
}

// Batches on the same keys in different orders, racing, claim and finish
// without a deadlock's error: each key completed is acquired by exactly
// one of them.
func TestBatchRacingBatches(t *testing.T) {
	s, _ := batchStore(t, nil)
	ctx := context.Background()
	const keys, racers, rounds = 50, 8, 5
	for round := range rounds {
		var acquired [keys]atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range racers {
			wg.Go(func() {
				order := rand.Perm(keys)
				reqs := make([]idempotency.ClaimRequest, keys)
				for j, k := range order {
					reqs[j] = claimReq(fmt.Sprintf("race-%d-%d", round, k))
				}
				<-start
				res, errs := s.ClaimBatch(ctx, reqs)
				var finish []idempotency.Finish
				for j, k := range order {
					if errs[j] != nil {
						t.Errorf("racer %d, key %d: %v", g, k, errs[j])
						continue
					}
					if res[j].Outcome == idempotency.OutcomeAcquired {
						acquired[k].Add(1)
						finish = append(finish, idempotency.Finish{Key: reqs[j].Key, Token: reqs[j].Token, Result: []byte("r"), Retention: time.Minute, Release: k%2 == 0})
					}
				}
				for j, err := range s.FinishBatch(ctx, finish) {
					if err != nil {
						t.Errorf("racer %d, finish %s: %v", g, finish[j].Key, err)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		for k := range keys {
			// A completed key is acquired once; a released one may be
			// acquired again by a batch that comes after the release.
			if n := acquired[k].Load(); n < 1 || k%2 == 1 && n != 1 {
				t.Errorf("round %d, key %d (released: %v): acquired %d times", round, k, k%2 == 0, n)
			}
		}
	}
}

// With Options.Notify, a batch's completions and releases wake the
// waiters of their records, as single ones do: each Watch returns long
// before the leases it waits on end.
func TestBatchNotifies(t *testing.T) {
	s, _ := batchStore(t, &postgres.Options{Notify: true})
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := claimReq("notify-a"), claimReq("notify-b")
	a.Lease, b.Lease = time.Hour, time.Hour
	_, errs := s.ClaimBatch(ctx, []idempotency.ClaimRequest{a, b})
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	woke := make(chan error, 2)
	for _, k := range []string{a.Key, b.Key} {
		go func() { woke <- s.Watch(ctx, k) }()
	}
	// Both subscribe and read their records, then wait on hour-long
	// leases: neither may return before the batch.
	time.Sleep(2 * time.Second)
	select {
	case err := <-woke:
		t.Fatalf("a Watch returned before the batch finished its record: %v", err)
	default:
	}
	ferrs := s.FinishBatch(ctx, []idempotency.Finish{
		{Key: a.Key, Token: a.Token, Result: []byte("a"), Retention: time.Minute},
		{Key: b.Key, Token: b.Token, Release: true},
	})
	if ferrs[0] != nil || ferrs[1] != nil {
		t.Fatal(ferrs)
	}
	for range 2 {
		select {
		case err := <-woke:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a Watch was not woken by the batch's completion or release within 10s")
		}
	}
}

// Keys, fingerprints and tokens with the characters an array literal
// quotes or escapes, and results of every byte, go through a batch and
// come back as they were, in every query mode.
func TestBatchAwkwardValues(t *testing.T) {
	odd := []string{`a"b`, `back\slash`, `{brace},comma`, ` lead and trail `, "NULL", "", `\"\\`, "ünï©ødé ✓", "tab\there"}
	result := make([]byte, 256)
	for i := range result {
		result[i] = byte(i)
	}
	for _, m := range execModes {
		t.Run(m.name, func(t *testing.T) {
			s := newStore(t, testPool(t, m.mode), nil)
			ctx := context.Background()
			var reqs []idempotency.ClaimRequest
			for i, o := range odd {
				key := fmt.Sprint(m.name, i, o)
				reqs = append(reqs, idempotency.ClaimRequest{Key: key, Fingerprint: idempotency.Fingerprint("fp" + o), Token: idempotency.Token("tok" + o), Lease: time.Minute, Grace: time.Minute})
			}
			res, errs := s.ClaimBatch(ctx, reqs)
			var fin []idempotency.Finish
			for i := range reqs {
				if errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired {
					t.Fatalf("claim of %q: %v %v", reqs[i].Key, res[i].Outcome, errs[i])
				}
				fin = append(fin, idempotency.Finish{Key: reqs[i].Key, Token: reqs[i].Token, Result: append(result, byte(i)), Retention: time.Minute})
			}
			for i, err := range s.FinishBatch(ctx, fin) {
				if err != nil {
					t.Fatalf("completion of %q: %v", fin[i].Key, err)
				}
			}
			again, errs := s.ClaimBatch(ctx, reqs)
			for i, r := range reqs {
				got, err := s.Claim(ctx, idempotency.ClaimRequest{Key: r.Key, Fingerprint: r.Fingerprint, Token: "other", Lease: time.Minute, Grace: time.Minute})
				if err != nil || got.Outcome != idempotency.OutcomeReplay || !bytes.Equal(got.Result, fin[i].Result) {
					t.Errorf("single replay of %q: %v %v, result equal %v", r.Key, got.Outcome, err, bytes.Equal(got.Result, fin[i].Result))
				}
				if errs[i] != nil || again[i].Outcome != idempotency.OutcomeReplay || !bytes.Equal(again[i].Result, fin[i].Result) {
					t.Errorf("batch replay of %q: %v %v", r.Key, again[i].Outcome, errs[i])
				}
			}
		})
	}
}

// Batches and single claims racing to take over the same ended leases
// (the batch's locking statement): each record is taken over exactly once,
// under a greater fence, and no racer gets an error.
func TestBatchRacingTakeovers(t *testing.T) {
	s, _ := batchStore(t, nil)
	ctx := context.Background()
	const keys, racers, rounds = 40, 6, 3
	for round := range rounds {
		key := func(k int) string { return fmt.Sprintf("take-%d-%d", round, k) }
		old := make([]idempotency.ClaimRequest, keys)
		for k := range old {
			old[k] = claimReq(key(k))
			old[k].Lease = 50 * time.Millisecond
		}
		first, errs := s.ClaimBatch(ctx, old)
		for k, err := range errs {
			if err != nil || first[k].Outcome != idempotency.OutcomeAcquired {
				t.Fatalf("first claim of key %d: %v %v", k, first[k].Outcome, err)
			}
		}
		time.Sleep(100 * time.Millisecond) // every lease has ended
		var acquired [keys]atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range racers {
			wg.Go(func() {
				order := rand.Perm(keys)
				<-start
				note := func(k int, r idempotency.ClaimResult, err error) {
					switch {
					case err != nil:
						t.Errorf("racer %d, key %d: %v", g, k, err)
					case r.Outcome == idempotency.OutcomeAcquired:
						acquired[k].Add(1)
						if r.Fence <= first[k].Fence || r.Attempt != 2 {
							t.Errorf("racer %d, key %d: takeover with fence %d attempt %d, want above %d and 2", g, k, r.Fence, r.Attempt, first[k].Fence)
						}
					case r.Outcome != idempotency.OutcomeInProgress:
						t.Errorf("racer %d, key %d: %v, want acquired or in progress", g, k, r.Outcome)
					}
				}
				if g%2 == 1 {
					for _, k := range order {
						r, err := s.Claim(ctx, claimReq(key(k)))
						note(k, r, err)
					}
					return
				}
				reqs := make([]idempotency.ClaimRequest, keys)
				for j, k := range order {
					reqs[j] = claimReq(key(k))
				}
				res, errs := s.ClaimBatch(ctx, reqs)
				for j, k := range order {
					note(k, res[j], errs[j])
				}
			})
		}
		close(start)
		wg.Wait()
		for k := range keys {
			if n := acquired[k].Load(); n != 1 {
				t.Errorf("round %d, key %d: taken over %d times, want exactly once", round, k, n)
			}
		}
	}
}
