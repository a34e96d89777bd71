package conformancetest

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
)

// The cases of an idempotency.Batcher: each item of a batch obeys the
// rules of its own call.

func needsBatcher(f features) (bool, string) {
	return f.batcher != nil, "the store has no Batcher (or the test skips it)"
}

func init() { cases = append(cases, batchCases...) }

// batchCases are the Batcher's rows of the suite.
var batchCases = []testCase{
	{name: "batch_claims_as_claims", together: true, run: testBatchClaims, needs: needsBatcher,
		rule: "ClaimBatch decides each item as Claim would, in order: fresh, replay (with its result), mismatch, in progress (with the time left), takeover (a greater fence, attempt+1, the checkpoints), a repeat by the holder"},
	{name: "batch_racing_single_claims", run: testBatchRace, needs: needsBatcher,
		rule: "a batch's claims are each one atomic operation: batches and single claims racing on the same keys acquire each key exactly once"},
	{name: "batch_repeat_same_tokens", together: true, run: testBatchRepeat, needs: needsBatcher,
		rule: "a batch is safe to repeat with the same tokens, item by item: a repeated ClaimBatch keeps the fences, a repeated FinishBatch succeeds and changes nothing"},
	{name: "batch_finish_per_item", together: true, run: testBatchFinish, needs: needsBatcher,
		rule: "FinishBatch completes or releases each record under its own item's token: a stale token's item gets ErrLeaseLost and changes nothing, the others are applied"},
}

// claimBatch runs ClaimBatch and checks that it answered each item.
func (e *env) claimBatch(reqs []idempotency.ClaimRequest, what string) []idempotency.ClaimResult {
	e.t.Helper()
	res, errs := e.feat.batcher.ClaimBatch(e.ctx, reqs)
	if len(res) != len(reqs) || len(errs) != len(reqs) {
		e.t.Fatalf("%s: ClaimBatch of %d items returned %d results and %d errors", what, len(reqs), len(res), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("%s: item %d (%s): unexpected error: %v", what, i, short(reqs[i].Key), err)
		}
	}
	return res
}

func (e *env) finishBatch(items []idempotency.Finish, what string) []error {
	e.t.Helper()
	errs := e.feat.batcher.FinishBatch(e.ctx, items)
	if len(errs) != len(items) {
		e.t.Fatalf("%s: FinishBatch of %d items returned %d errors", what, len(items), len(errs))
	}
	return errs
}

func testBatchClaims(e *env) {
	fresh, done, other, busy, ended, mine := e.key("b-fresh"), e.key("b-done"), e.key("b-other"), e.key("b-busy"), e.key("b-ended"), e.key("b-mine")
	tokDone, tokOther, tokBusy, tokEnded, tokMine := e.token(), e.token(), e.token(), e.token(), e.token()
	e.acquire(done, fpA, tokDone, long, long)
	e.complete(done, tokDone, []byte("done's result"), long)
	e.acquire(other, fpB, tokOther, long, long)
	busyClaim := e.acquire(busy, fpA, tokBusy, 4*e.unit, long)
	endedClaim := e.acquire(ended, fpA, tokEnded, e.unit, long)
	e.checkpoint(ended, tokEnded, "step", []byte("1"))
	mineClaim := e.acquire(mine, fpA, tokMine, e.unit, long)
	e.checkpoint(mine, tokMine, "mine", []byte("2"))
	e.passBeyond(e.unit) // ended's and mine's leases are over; busy's is not

	tokFresh, tokTake := e.token(), e.token()
	reqs := []idempotency.ClaimRequest{
		{Key: fresh, Fingerprint: fpA, Token: tokFresh, Lease: long, Grace: long},
		{Key: done, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long},
		{Key: other, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long},
		{Key: busy, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long},
		{Key: ended, Fingerprint: fpA, Token: tokTake, Lease: long, Grace: long},
		{Key: mine, Fingerprint: fpA, Token: tokMine, Lease: long, Grace: long},
	}
	res := e.claimBatch(reqs, "a batch of every kind of claim")
	e.expect(res[0], idempotency.OutcomeAcquired, "batch item 0: an absent key")
	if res[0].Fence < 1 || res[0].Attempt != 1 {
		e.t.Errorf("batch item 0: fence %d attempt %d, want a fence >= 1 and attempt 1", res[0].Fence, res[0].Attempt)
	}
	e.expect(res[1], idempotency.OutcomeReplay, "batch item 1: a completed key")
	if !bytes.Equal(res[1].Result, []byte("done's result")) {
		e.t.Errorf("batch item 1: result %s, want the stored one", describe(res[1].Result))
	}
	e.expect(res[2], idempotency.OutcomeMismatch, "batch item 2: a key held with another fingerprint")
	e.expect(res[3], idempotency.OutcomeInProgress, "batch item 3: a live lease of another token")
	if left := res[3].RetryAfter; left <= 0 || left > 3*e.unit+e.tol {
		e.t.Errorf("batch item 3: RetryAfter %v, want the time left on a 4-unit lease claimed over a unit ago", left)
	}
	e.expect(res[4], idempotency.OutcomeAcquired, "batch item 4: a takeover of an ended lease")
	if res[4].Fence <= endedClaim.Fence || res[4].Attempt != 2 {
		e.t.Errorf("batch item 4: fence %d attempt %d, want a fence above %d and attempt 2", res[4].Fence, res[4].Attempt, endedClaim.Fence)
	}
	e.checkpointsEqual(res[4].Checkpoints, map[string][]byte{"step": []byte("1")}, "batch item 4's checkpoints, handed over")
	e.expect(res[5], idempotency.OutcomeAcquired, "batch item 5: a repeat by the holder of an ended lease")
	if res[5].Fence != mineClaim.Fence || res[5].Attempt != 1 {
		e.t.Errorf("batch item 5: fence %d attempt %d, want its own fence %d and attempt 1", res[5].Fence, res[5].Attempt, mineClaim.Fence)
	}
	e.checkpointsEqual(res[5].Checkpoints, map[string][]byte{"mine": []byte("2")}, "batch item 5's checkpoints")

	// The records are as single claims would have left them.
	e.inProgress(fresh, "claim by another token of the key the batch acquired")
	e.isErr(e.s.Renew(e.ctx, ended, tokEnded, long), idempotency.ErrLeaseLost, "Renew by the holder the batch took over from")
	e.noErr(e.s.Renew(e.ctx, ended, tokTake, long), "Renew by the batch's new holder")
	e.noErr(e.s.Renew(e.ctx, busy, tokBusy, long), "Renew by the holder of the live lease the batch found")
	_ = busyClaim
}

func testBatchRace(e *env) {
	// Started together, the batches go through the keys in one order and
	// the single claims in the other, so that they meet on every key
	// however fast either is.
	const keys, racers, rounds = 16, 8, 8
	for round := range rounds {
		var acquired [keys]atomic.Int32
		key := func(k int) string { return e.key(fmt.Sprintf("b-race-%d-%d", round, k)) }
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range racers {
			wg.Go(func() {
				<-start
				if g%2 == 0 {
					reqs := make([]idempotency.ClaimRequest, keys)
					for k := range reqs {
						reqs[k] = idempotency.ClaimRequest{Key: key(k), Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long}
					}
					res, errs := e.feat.batcher.ClaimBatch(e.ctx, reqs)
					if len(res) != keys || len(errs) != keys {
						e.t.Errorf("ClaimBatch of %d items returned %d results and %d errors", keys, len(res), len(errs))
						return
					}
					for k, r := range res {
						if errs[k] == nil && r.Outcome == idempotency.OutcomeAcquired {
							acquired[k].Add(1)
						}
					}
					return
				}
				for k := keys - 1; k >= 0; k-- {
					r, err := e.s.Claim(e.ctx, idempotency.ClaimRequest{Key: key(k), Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long})
					if err == nil && r.Outcome == idempotency.OutcomeAcquired {
						acquired[k].Add(1)
					}
					// Paced, so that the batches, however they are
					// scheduled, meet the single claims on some key.
					time.Sleep(100 * time.Microsecond)
				}
			})
		}
		close(start)
		wg.Wait()
		for k := range keys {
			if n := acquired[k].Load(); n != 1 {
				e.t.Errorf("round %d, key %d: acquired %d times by racing batches and claims, want exactly once", round, k, n)
			}
		}
	}
}

func testBatchRepeat(e *env) {
	a, b := e.key("b-rep-a"), e.key("b-rep-b")
	ta, tb := e.token(), e.token()
	reqs := []idempotency.ClaimRequest{
		{Key: a, Fingerprint: fpA, Token: ta, Lease: long, Grace: long},
		{Key: b, Fingerprint: fpA, Token: tb, Lease: long, Grace: long},
	}
	first := e.claimBatch(reqs, "a batch")
	again := e.claimBatch(reqs, "the same batch again, with the same tokens")
	for i := range reqs {
		e.expect(again[i], idempotency.OutcomeAcquired, fmt.Sprintf("repeated batch item %d", i))
		if again[i].Fence != first[i].Fence || again[i].Attempt != first[i].Attempt {
			e.t.Errorf("repeated batch item %d: fence %d attempt %d, want the first's %d and %d", i, again[i].Fence, again[i].Attempt, first[i].Fence, first[i].Attempt)
		}
	}
	items := []idempotency.Finish{
		{Key: a, Token: ta, Result: []byte("a's result"), Retention: long},
		{Key: b, Token: tb, Release: true},
	}
	for round, what := range []string{"FinishBatch", "the same FinishBatch again"} {
		for i, err := range e.finishBatch(items, what) {
			if err != nil {
				e.t.Errorf("%s, item %d: %v, want success (round %d)", what, i, err, round)
			}
		}
	}
	e.noErr(e.s.Complete(e.ctx, a, ta, []byte("other"), long), "Complete of the record the batch completed, by its token")
	e.replayEquals(a, fpA, []byte("a's result"), "replay of the record a repeated batch completed (the first completion wins)")
	res := e.acquire(b, fpA, e.token(), long, long)
	if res.Fence <= first[1].Fence {
		e.t.Errorf("claim after the batch released b: fence %d, want above %d", res.Fence, first[1].Fence)
	}
}

func testBatchFinish(e *env) {
	own, rel, stale, absent := e.key("b-fin-own"), e.key("b-fin-rel"), e.key("b-fin-stale"), e.key("b-fin-absent")
	tOwn, tRel, tStale, tNew := e.token(), e.token(), e.token(), e.token()
	e.acquire(own, fpA, tOwn, long, long)
	e.acquire(rel, fpA, tRel, long, long)
	old := e.acquire(stale, fpA, tStale, e.unit, long)
	e.passBeyond(e.unit)
	taken := e.claim(stale, fpA, tNew, long, long)
	e.expect(taken, idempotency.OutcomeAcquired, "takeover of the stale item's record")
	if taken.Fence <= old.Fence {
		e.t.Fatalf("takeover: fence %d, want above %d", taken.Fence, old.Fence)
	}
	errs := e.finishBatch([]idempotency.Finish{
		{Key: own, Token: tOwn, Result: []byte("own"), Retention: long},
		{Key: rel, Token: tRel, Release: true},
		{Key: stale, Token: tStale, Result: []byte("stale"), Retention: long},
		{Key: absent, Token: e.token(), Release: true},
	}, "a batch of a completion, a release, a stale completion and the release of an absent record")
	if errs[0] != nil || errs[1] != nil || errs[3] != nil {
		e.t.Errorf("FinishBatch: errors %v, want success for items 0, 1 and 3", errs)
	}
	e.isErr(errs[2], idempotency.ErrLeaseLost, "FinishBatch item 2: a completion under a token taken over")
	e.replayEquals(own, fpA, []byte("own"), "replay of the batch's completion")
	e.acquire(rel, fpA, e.token(), long, long)
	e.inProgress(stale, "claim of the record the stale item tried to complete (the new holder's, untouched)")
	e.noErr(e.s.Complete(e.ctx, stale, tNew, []byte("new holder's"), long), "Complete by the new holder")
	e.replayEquals(stale, fpA, []byte("new holder's"), "replay of the new holder's result, not the stale item's")
}
