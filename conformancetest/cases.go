package conformancetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
)

func testFreshClaim(e *env) {
	for _, name := range []string{"fresh", "fresh-other"} {
		k := e.key(name)
		res := e.acquire(k, fpA, e.token(), long, 0)
		if len(res.Result) != 0 {
			e.t.Errorf("fresh claim of %s: result %s, want none", short(k), describe(res.Result))
		}
		if len(res.Checkpoints) != 0 {
			e.t.Errorf("fresh claim of %s: checkpoints %s, want none", short(k), describeMap(res.Checkpoints))
		}
	}
}

func testReplayExactBytes(e *env) {
	largest := e.caps.MaxValueSize
	if largest <= 0 {
		largest = 1 << 20
	}
	big := make([]byte, largest)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(big)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	values := []struct {
		name  string
		value []byte
	}{
		{"empty", []byte{}},
		{"nil", nil},
		{"text", []byte(`{"status":"ok"}`)},
		{"all_byte_values", all},
		{"invalid_utf8", []byte{0xff, 0xfe, 0x00, 0xc3, 0x28}},
		{"largest", big},
	}
	for _, v := range values {
		k := e.key("replay-" + v.name)
		tok := e.token()
		acq := e.acquire(k, fpA, tok, long, 0)
		in := clone(v.value)
		e.complete(k, tok, in, long)
		for i := range in {
			in[i] ^= 0xff // the store must have copied what it keeps
		}
		what := "replay of " + v.name + " value"
		res := e.replay(k, fpA, what)
		if !equalBytes(res.Result, v.value) {
			e.t.Errorf("%s: replayed %s, want %s (changed by the caller's later writes to its slice?)", what, describe(res.Result), describe(v.value))
			continue
		}
		if res.Fence != 0 && res.Fence != acq.Fence {
			e.t.Errorf("%s: fence %d, want the holder's %d (or 0 for unknown)", what, res.Fence, acq.Fence)
		}
		for i := range res.Result {
			res.Result[i] ^= 0xff // a replay must hand out a copy
		}
		e.replayEquals(k, fpA, v.value, what+" after the caller changed an earlier replay's bytes")
	}
}

func testTooLarge(e *env) {
	k := e.key("too-large")
	tok := e.token()
	acq := e.acquire(k, fpA, tok, long, long)
	over := make([]byte, e.caps.MaxValueSize+1)
	for i := range over {
		over[i] = byte(i)
	}
	e.isErr(e.s.Complete(e.ctx, k, tok, over, long), idempotency.ErrTooLarge,
		fmt.Sprintf("Complete with %d bytes (MaxValueSize %d)", len(over), e.caps.MaxValueSize))
	e.inProgress(k, "claim by another token after a refused Complete (the record must still be STARTED)")

	// A checkpoint the store cannot keep must be refused the same way; a
	// store whose checkpoints have another limit may keep it instead.
	cpErr := e.s.Checkpoint(e.ctx, k, tok, "big", over)
	if cpErr != nil {
		e.isErr(cpErr, idempotency.ErrTooLarge, "Checkpoint refused")
	}
	res := e.claim(k, fpA, tok, long, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim by the holder after refused writes")
	if res.Fence != acq.Fence {
		e.t.Errorf("repeated claim by the holder: fence %d, want %d", res.Fence, acq.Fence)
	}
	got, stored := res.Checkpoints["big"]
	switch {
	case cpErr != nil && stored:
		e.t.Errorf("Checkpoint failed with %v but its value was stored (%s)", cpErr, describe(got))
	case cpErr == nil && !equalBytes(got, over):
		e.t.Errorf("Checkpoint succeeded but the holder reads back %s, want %s", describe(got), describe(over))
	}

	e.complete(k, tok, []byte("small"), long)
	e.replayEquals(k, fpA, []byte("small"), "replay after a refused then an accepted Complete")
}

func testMismatch(e *env) {
	k := e.key("mismatch")
	tok := e.token()
	e.acquire(k, fpA, tok, long, long)
	res := e.claim(k, fpB, e.token(), long, long)
	e.expect(res, idempotency.OutcomeMismatch, "claim with another fingerprint while STARTED")
	e.complete(k, tok, []byte("done"), long)
	res = e.claim(k, fpB, e.token(), long, long)
	e.expect(res, idempotency.OutcomeMismatch, "claim with another fingerprint when COMPLETED")
	if len(res.Result) != 0 {
		e.t.Errorf("a mismatch handed out the stored result %s: a mismatch is never replayed", describe(res.Result))
	}
	e.replayEquals(k, fpA, []byte("done"), "replay with the original fingerprint")

	// After the lease ends, a different request still may not take over.
	k2 := e.key("mismatch-expired-lease")
	first := e.acquire(k2, fpA, e.token(), e.unit, long)
	e.passBeyond(e.unit)
	res = e.claim(k2, fpB, e.token(), long, long)
	e.expect(res, idempotency.OutcomeMismatch, "claim with another fingerprint after the lease ended")
	res = e.claim(k2, fpA, e.token(), long, long)
	e.expect(res, idempotency.OutcomeAcquired, "takeover with the original fingerprint after the lease ended")
	if res.Attempt != 2 || res.Fence <= first.Fence {
		e.t.Errorf("takeover after a refused mismatch: attempt %d fence %d, want attempt 2 and a fence above %d",
			res.Attempt, res.Fence, first.Fence)
	}
}

func testInProgress(e *env) {
	lease := 4 * e.unit
	k := e.key("in-progress")
	tok := e.token()
	acq := e.acquire(k, fpA, tok, lease, long)
	res := e.inProgress(k, "claim by another token during a live lease")
	if res.RetryAfter <= 0 || res.RetryAfter > lease+e.tol {
		e.t.Errorf("RetryAfter %v, want within (0, %v]: the time left on the lease", res.RetryAfter, lease)
	}
	if res.Fence != 0 && res.Fence != acq.Fence {
		e.t.Errorf("InProgress fence %d, want the holder's %d (or 0 for unknown)", res.Fence, acq.Fence)
	}
	if len(res.Result) != 0 || len(res.Checkpoints) != 0 {
		e.t.Errorf("InProgress handed out a result %s or checkpoints %s", describe(res.Result), describeMap(res.Checkpoints))
	}

	e.pass(e.unit)
	res = e.inProgress(k, "claim by another token later in the lease")
	if left := lease - e.unit; res.RetryAfter <= 0 || res.RetryAfter > left+e.tol {
		e.t.Errorf("RetryAfter %v after %v of a %v lease, want within (0, %v]: the time left, not the whole lease",
			res.RetryAfter, e.unit, lease, left)
	}
	e.complete(k, tok, []byte("r"), long)
	e.replayEquals(k, fpA, []byte("r"), "replay after the holder completed (InProgress answers must not disturb it)")
}

// claimAll runs n claims of key at once, with distinct tokens, released
// together, and returns their results.
func (e *env) claimAll(key string, n int, lease time.Duration) ([]idempotency.ClaimResult, []error) {
	results := make([]idempotency.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		tok := e.token()
		wg.Go(func() {
			<-start
			results[i], errs[i] = e.s.Claim(e.ctx, idempotency.ClaimRequest{
				Key: key, Fingerprint: fpA, Token: tok, Lease: lease, Grace: long,
			})
		})
	}
	close(start)
	wg.Wait()
	return results, errs
}

// countOutcomes fails on errors and outcomes other than Acquired and
// InProgress, and returns the acquired results.
func (e *env) countOutcomes(results []idempotency.ClaimResult, errs []error, what string) []idempotency.ClaimResult {
	e.t.Helper()
	var acquired []idempotency.ClaimResult
	for i, res := range results {
		switch {
		case errs[i] != nil:
			e.t.Errorf("%s: claim %d: %v", what, i, errs[i])
		case res.Outcome == idempotency.OutcomeAcquired:
			acquired = append(acquired, res)
		case res.Outcome != idempotency.OutcomeInProgress:
			e.t.Errorf("%s: claim %d: outcome %v, want acquired or in_progress", what, i, res.Outcome)
		case res.RetryAfter <= 0:
			e.t.Errorf("%s: claim %d: in_progress with RetryAfter %v, want > 0", what, i, res.RetryAfter)
		}
	}
	return acquired
}

func testOneKeyConcurrent(e *env) {
	const n = 64
	results, errs := e.claimAll(e.key("one-key"), n, long)
	acquired := e.countOutcomes(results, errs, "concurrent claims of one key")
	if len(acquired) != 1 {
		e.t.Errorf("%d of %d concurrent claims of one key acquired it, want exactly 1", len(acquired), n)
	}
}

func testManyKeysConcurrent(e *env) {
	const keys, per = 1000, 8
	var acquired, inProgress [keys]atomic.Int32
	var failures atomic.Int32
	var firstErr atomic.Value
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		key := e.key(fmt.Sprintf("many-%04d", k))
		for range per {
			tok := e.token()
			wg.Go(func() {
				<-start
				res, err := e.s.Claim(e.ctx, idempotency.ClaimRequest{
					Key: key, Fingerprint: fpA, Token: tok, Lease: long, Grace: long,
				})
				switch {
				case err != nil:
					failures.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("claim of %s: %w", short(key), err))
				case res.Outcome == idempotency.OutcomeAcquired:
					acquired[k].Add(1)
				case res.Outcome == idempotency.OutcomeInProgress:
					inProgress[k].Add(1)
				default:
					failures.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("claim of %s: outcome %v", short(key), res.Outcome))
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		e.t.Errorf("%d claims failed or had unexpected outcomes; first: %v", n, firstErr.Load())
	}
	var wrong []string
	total := 0
	for k := range keys {
		a := int(acquired[k].Load())
		total += a
		if a != 1 {
			wrong = append(wrong, fmt.Sprintf("many-%04d acquired %d times", k, a))
		}
	}
	if len(wrong) > 0 {
		e.t.Errorf("%d of %d keys were not acquired exactly once (%d acquisitions in all), e.g. %s",
			len(wrong), keys, total, strings.Join(wrong[:min(5, len(wrong))], "; "))
	}
}

func testConcurrentTakeover(e *env) {
	const n = 32
	k := e.key("concurrent-takeover")
	first := e.acquire(k, fpA, e.token(), e.unit, long)
	e.passBeyond(e.unit)
	results, errs := e.claimAll(k, n, long)
	acquired := e.countOutcomes(results, errs, "concurrent claims of an expired lease")
	if len(acquired) != 1 {
		e.t.Fatalf("%d of %d concurrent claims of an expired lease took it over, want exactly 1", len(acquired), n)
	}
	if got := acquired[0]; got.Attempt != 2 || got.Fence <= first.Fence {
		e.t.Errorf("takeover: attempt %d fence %d, want attempt 2 and a fence above %d", got.Attempt, got.Fence, first.Fence)
	}
}

func testTakeover(e *env) {
	lease := 2 * e.unit
	k := e.key("takeover")
	tokA := e.token()
	a := e.acquire(k, fpA, tokA, lease, long)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	want := map[string][]byte{"step1": []byte("one"), "empty": {}, "binary": all}
	for name, v := range want {
		e.checkpoint(k, tokA, name, v)
	}
	e.inProgress(k, "claim by another token before the lease ends")

	e.passBeyond(lease)
	tokB := e.token()
	b := e.claim(k, fpA, tokB, lease, long)
	e.expect(b, idempotency.OutcomeAcquired, "claim after the lease ended (takeover)")
	if b.Fence <= a.Fence {
		e.t.Errorf("takeover fence %d, want strictly greater than the old holder's %d", b.Fence, a.Fence)
	}
	if b.Attempt != 2 {
		e.t.Errorf("takeover attempt %d, want 2", b.Attempt)
	}
	e.checkpointsEqual(b.Checkpoints, want, "checkpoints handed over by the takeover")

	again := e.claim(k, fpA, tokB, lease, long)
	e.expect(again, idempotency.OutcomeAcquired, "repeated claim by the new holder")
	if again.Fence != b.Fence || again.Attempt != 2 {
		e.t.Errorf("repeated claim by the new holder: fence %d attempt %d, want fence %d attempt 2", again.Fence, again.Attempt, b.Fence)
	}
	e.inProgress(k, "claim by a third token during the new holder's lease")

	// A second takeover raises the fence again and hands the checkpoints on.
	e.passBeyond(lease)
	c := e.claim(k, fpA, e.token(), long, long)
	e.expect(c, idempotency.OutcomeAcquired, "second takeover")
	if c.Fence <= b.Fence || c.Attempt != 3 {
		e.t.Errorf("second takeover: fence %d attempt %d, want a fence above %d and attempt 3", c.Fence, c.Attempt, b.Fence)
	}
	e.checkpointsEqual(c.Checkpoints, want, "checkpoints handed over by the second takeover")
}

func testStaleHolder(e *env) {
	k := e.key("stale")
	tokA := e.token()
	e.acquire(k, fpA, tokA, e.unit, long)
	e.checkpoint(k, tokA, "a", []byte("A1"))
	e.passBeyond(e.unit)
	tokB := e.token()
	b := e.claim(k, fpA, tokB, long, long)
	e.expect(b, idempotency.OutcomeAcquired, "takeover")
	e.checkpoint(k, tokB, "b", []byte("B1"))

	stale := func(when string) {
		e.t.Helper()
		e.isErr(e.s.Renew(e.ctx, k, tokA, long), idempotency.ErrLeaseLost, "stale Renew "+when)
		e.isErr(e.s.Checkpoint(e.ctx, k, tokA, "a", []byte("A2")), idempotency.ErrLeaseLost, "stale Checkpoint of an existing name "+when)
		e.isErr(e.s.Checkpoint(e.ctx, k, tokA, "x", []byte("A3")), idempotency.ErrLeaseLost, "stale Checkpoint of a new name "+when)
		e.isErr(e.s.Complete(e.ctx, k, tokA, []byte("A"), long), idempotency.ErrLeaseLost, "stale Complete "+when)
		e.isErr(e.s.Release(e.ctx, k, tokA), idempotency.ErrLeaseLost, "stale Release "+when)
		never := e.token()
		e.isErr(e.s.Complete(e.ctx, k, never, []byte("N"), long), idempotency.ErrLeaseLost, "Complete by a token that never held the key "+when)
		e.isErr(e.s.Release(e.ctx, k, never), idempotency.ErrLeaseLost, "Release by a token that never held the key "+when)
	}
	stale("while the new holder runs")

	e.inProgress(k, "claim by a third token after the stale writes (the new holder must still hold the key)")
	res := e.claim(k, fpA, tokB, long, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim by the new holder after the stale writes")
	if res.Fence != b.Fence {
		e.t.Errorf("new holder's fence changed from %d to %d after the stale writes", b.Fence, res.Fence)
	}
	e.checkpointsEqual(res.Checkpoints, map[string][]byte{"a": []byte("A1"), "b": []byte("B1")},
		"new holder's checkpoints after the stale writes")

	e.complete(k, tokB, []byte("B"), long)
	stale("after the new holder completed")
	e.replayEquals(k, fpA, []byte("B"), "replay after the stale writes")

	// Writes under a lease to a key that holds no record fail the same way.
	absent := e.key("stale-absent")
	e.isErr(e.s.Renew(e.ctx, absent, tokA, long), idempotency.ErrLeaseLost, "Renew of an absent key")
	e.isErr(e.s.Checkpoint(e.ctx, absent, tokA, "a", []byte("x")), idempotency.ErrLeaseLost, "Checkpoint of an absent key")
	e.isErr(e.s.Complete(e.ctx, absent, tokA, []byte("x"), long), idempotency.ErrLeaseLost, "Complete of an absent key")
	e.acquire(absent, fpB, e.token(), long, long) // none of them created a record
}

func testRenew(e *env) {
	k := e.key("renew")
	tok := e.token()
	e.acquire(k, fpA, tok, 2*e.unit, e.unit)
	e.pass(e.unit)
	e.noErr(e.s.Renew(e.ctx, k, tok, 6*e.unit), "Renew")
	// 4 units after the claim: past the original lease (2) and the original
	// lease plus grace (3); the renewed lease ends at 7.
	e.pass(3 * e.unit)
	res := e.inProgress(k, "claim by another token after the original lease, within the renewed one")
	if res.RetryAfter <= 0 || res.RetryAfter > 6*e.unit+e.tol {
		e.t.Errorf("RetryAfter %v after renewing for %v, want within (0, %v]", res.RetryAfter, 6*e.unit, 6*e.unit)
	}
	e.noErr(e.s.Renew(e.ctx, k, tok, long), "second Renew")
	e.complete(k, tok, []byte("r"), long)
	e.replayEquals(k, fpA, []byte("r"), "replay after renewing and completing")
}

func testRelease(e *env) {
	k := e.key("release")
	tokA := e.token()
	a := e.acquire(k, fpA, tokA, long, long)
	e.checkpoint(k, tokA, "s", []byte("x"))
	e.noErr(e.s.Release(e.ctx, k, tokA), "Release by the holder")
	e.noErr(e.s.Release(e.ctx, k, tokA), "repeated Release (record absent)")

	// The record is gone: even another fingerprint acquires it afresh.
	tokB := e.token()
	b := e.acquire(k, fpB, tokB, long, long)
	if b.Fence <= a.Fence {
		e.t.Errorf("claim after Release: fence %d, want strictly greater than the released %d", b.Fence, a.Fence)
	}
	if len(b.Checkpoints) != 0 {
		e.t.Errorf("claim after Release: checkpoints %s, want none (Release deletes the record)", describeMap(b.Checkpoints))
	}
	e.isErr(e.s.Release(e.ctx, k, tokA), idempotency.ErrLeaseLost, "Release by the old holder once another holds the key")
	e.isErr(e.s.Complete(e.ctx, k, tokA, []byte("A"), long), idempotency.ErrLeaseLost, "Complete by the old holder once another holds the key")
	e.inProgress2(k, fpB, "claim by a third token after the old holder's refused writes")

	e.noErr(e.s.Release(e.ctx, k, tokB), "second Release")
	c := e.acquire(k, fpA, e.token(), long, long)
	if c.Fence <= b.Fence {
		e.t.Errorf("claim after a second Release: fence %d, want strictly greater than %d", c.Fence, b.Fence)
	}
}

// inProgress2 is inProgress with a given fingerprint.
func (e *env) inProgress2(key string, fp idempotency.Fingerprint, what string) {
	e.t.Helper()
	e.expect(e.claim(key, fp, e.token(), long, 0), idempotency.OutcomeInProgress, what)
}

func testRepeated(e *env) {
	k := e.key("repeated")
	tok := e.token()
	a := e.acquire(k, fpA, tok, 2*e.unit, long)
	e.checkpoint(k, tok, "c", []byte("1"))
	e.pass(e.unit)
	res := e.claim(k, fpA, tok, 4*e.unit, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim with the same token")
	if res.Fence != a.Fence || res.Attempt != 1 {
		e.t.Errorf("repeated claim: fence %d attempt %d, want the same fence %d and attempt 1", res.Fence, res.Attempt, a.Fence)
	}
	e.checkpointsEqual(res.Checkpoints, map[string][]byte{"c": []byte("1")}, "repeated claim's checkpoints")
	// 3 units after the first claim: past its 2-unit lease, inside the
	// 4-unit lease the repeated claim set.
	e.pass(2 * e.unit)
	e.inProgress(k, "claim by another token after the first lease, within the repeated claim's lease")

	e.complete(k, tok, []byte("r"), long)
	e.complete(k, tok, []byte("r"), long)
	e.noErr(e.s.Complete(e.ctx, k, tok, []byte("other"), long), "repeated Complete with other bytes")
	e.replayEquals(k, fpA, []byte("r"), "replay after repeated Completes (the first one wins)")
	res = e.claim(k, fpA, tok, long, long)
	e.expect(res, idempotency.OutcomeReplay, "claim by the holder of a COMPLETED record")

	other := e.token()
	e.isErr(e.s.Complete(e.ctx, k, other, []byte("x"), long), idempotency.ErrLeaseLost, "Complete of a COMPLETED record by another token")
	e.isErr(e.s.Release(e.ctx, k, other), idempotency.ErrLeaseLost, "Release of a COMPLETED record by another token")
	e.isErr(e.s.Release(e.ctx, k, tok), idempotency.ErrLeaseLost, "Release of a COMPLETED record by its holder")
	e.isErr(e.s.Renew(e.ctx, k, tok, long), idempotency.ErrLeaseLost, "Renew of a COMPLETED record")
	e.isErr(e.s.Checkpoint(e.ctx, k, tok, "c", []byte("2")), idempotency.ErrLeaseLost, "Checkpoint of a COMPLETED record")
	e.replayEquals(k, fpA, []byte("r"), "replay after refused writes to the COMPLETED record")

	e.noErr(e.s.Release(e.ctx, e.key("never-claimed"), e.token()), "Release of an absent record")
	e.acquire(e.key("never-claimed"), fpA, e.token(), long, long)
}

func testCompletedExpires(e *env) {
	k := e.key("retention")
	tok := e.token()
	a := e.acquire(k, fpA, tok, long, long)
	retention := 3 * e.unit
	e.complete(k, tok, []byte("r"), retention)
	e.pass(e.unit)
	e.replayEquals(k, fpA, []byte("r"), "replay within retention")
	e.passBeyond(retention - e.unit)
	e.isErr(e.s.Complete(e.ctx, k, tok, []byte("r"), long), idempotency.ErrLeaseLost,
		"repeated Complete after retention ended (an expired record is absent)")
	res := e.acquire(k, fpB, e.token(), long, long)
	if res.Fence <= a.Fence {
		e.t.Errorf("claim after retention ended: fence %d, want strictly greater than the expired record's %d", res.Fence, a.Fence)
	}
	if len(res.Result) != 0 {
		e.t.Errorf("claim after retention ended: result %s, want none", describe(res.Result))
	}
}

func testAbandonedExpires(e *env) {
	// Both holders vanish after one checkpoint. kept's grace outlasts the
	// wait, gone's does not.
	kept, gone := e.key("abandoned-kept"), e.key("abandoned-gone")
	tokKept, tokGone := e.token(), e.token()
	ak := e.acquire(kept, fpA, tokKept, e.unit, 4*e.unit)
	ag := e.acquire(gone, fpA, tokGone, e.unit, e.unit)
	e.checkpoint(kept, tokKept, "s", []byte("1"))
	e.checkpoint(gone, tokGone, "s", []byte("2"))

	e.passBeyond(2 * e.unit) // past gone's lease plus grace (2), inside kept's (5)

	res := e.claim(kept, fpA, e.token(), long, long)
	e.expect(res, idempotency.OutcomeAcquired, "takeover within the grace")
	if res.Attempt != 2 || res.Fence <= ak.Fence {
		e.t.Errorf("takeover within the grace: attempt %d fence %d, want attempt 2 and a fence above %d", res.Attempt, res.Fence, ak.Fence)
	}
	e.checkpointsEqual(res.Checkpoints, map[string][]byte{"s": []byte("1")}, "checkpoints handed over within the grace")

	e.isErr(e.s.Renew(e.ctx, gone, tokGone, long), idempotency.ErrLeaseLost, "Renew of a record past lease plus grace")
	res = e.acquire(gone, fpA, e.token(), long, long)
	if res.Fence <= ag.Fence {
		e.t.Errorf("claim after lease plus grace: fence %d, want strictly greater than the expired record's %d", res.Fence, ag.Fence)
	}
	if len(res.Checkpoints) != 0 {
		e.t.Errorf("claim after lease plus grace: checkpoints %s, want none (the record expired)", describeMap(res.Checkpoints))
	}
}

func testSweep(e *env) {
	sw, ok := e.s.(idempotency.Sweeper)
	if !ok {
		e.t.Fatalf("Capabilities.Sweeper is set but %T does not implement idempotency.Sweeper", e.s)
	}
	liveStarted, liveCompleted := e.key("sweep-live-started"), e.key("sweep-live-completed")
	expired := []string{e.key("sweep-expired-started-1"), e.key("sweep-expired-started-2"), e.key("sweep-expired-completed")}

	e.acquire(liveStarted, fpA, e.token(), long, long)
	tok := e.token()
	e.acquire(liveCompleted, fpA, tok, long, long)
	e.complete(liveCompleted, tok, []byte("keep"), long)
	e.acquire(expired[0], fpA, e.token(), e.unit, 0)
	tok = e.token()
	e.acquire(expired[1], fpA, tok, e.unit, 0)
	e.checkpoint(expired[1], tok, "s", []byte("x"))
	tok = e.token()
	e.acquire(expired[2], fpA, tok, long, long)
	e.complete(expired[2], tok, []byte("old"), e.unit)

	e.passBeyond(e.unit)
	n, err := sw.Sweep(e.ctx, 1)
	e.noErr(err, "Sweep(1)")
	if n != 1 {
		e.t.Errorf("Sweep(limit 1) with 3 expired records deleted %d, want 1", n)
	}
	n, err = sw.Sweep(e.ctx, 0)
	e.noErr(err, "Sweep(0)")
	if n < 2 {
		e.t.Errorf("Sweep(no limit) deleted %d records, want at least the 2 expired records left", n)
	}

	e.inProgress(liveStarted, "claim of a live STARTED record after Sweep")
	e.replayEquals(liveCompleted, fpA, []byte("keep"), "replay of a live COMPLETED record after Sweep")
	for _, k := range expired {
		res := e.acquire(k, fpB, e.token(), long, long)
		if len(res.Checkpoints) != 0 {
			e.t.Errorf("claim of swept %s: checkpoints %s, want none", short(k), describeMap(res.Checkpoints))
		}
	}
}

func testOddKeys(e *env) {
	suffixes := []string{
		"", "p", "pp", "ppp", "p/", "p:", // prefixes of one another
		"unicode-ключ-鍵-🔑", "\u00e9", "e\u0301", // two spellings of é are two keys
		"Key", "key", "KEY",
		"{braces}", "{", "}", "{p}pp",
		"a/b/c", "/leading/slash", "a//b",
		"a:b:c", ":", "::",
		"with space", " leading", "trailing ", "trailing",
		"tab\there", "new\nline",
		`quote'"` + "`", `back\slash`, "glob*?[ab]^$", "sql%_like", "dot.dollar$.x", "#hash&amp;=",
	}
	keys := make([]string, 0, len(suffixes)+2)
	for _, s := range suffixes {
		keys = append(keys, e.key(s))
	}
	longest := e.prefix + strings.Repeat("x", idempotency.MaxStorageKeyLen-len(e.prefix))
	keys = append(keys, longest, longest[:len(longest)-1])

	toks := make([]idempotency.Token, len(keys))
	for i, k := range keys {
		toks[i] = e.token()
		e.acquire(k, fpA, toks[i], long, long)
	}
	for i, k := range keys {
		e.complete(k, toks[i], fmt.Appendf(nil, "key %d of %d bytes", i, len(k)), long)
	}
	for i, k := range keys {
		e.replayEquals(k, fpA, fmt.Appendf(nil, "key %d of %d bytes", i, len(k)), "replay of key "+short(k))
	}
}

func testScopeIsolation(e *env) {
	p := e.prefix
	scopes := []struct {
		scope []string
		key   string
	}{
		{[]string{p, "tenant-a"}, "order-1"},
		{[]string{p, "tenant-b"}, "order-1"},
		{[]string{p, "a:b"}, "c"},
		{[]string{p, "a"}, "b:c"},
		{[]string{p, "a", "b"}, "c"},
		{[]string{p, "ab"}, "c"},
		{[]string{p}, "order-1"},
		{[]string{p, ""}, "order-1"},
		{[]string{p, "tenant-a", "POST /payments"}, "order-1"},
	}
	keys := make([]string, len(scopes))
	seen := map[string]int{}
	for i, s := range scopes {
		k, err := idempotency.StorageKey(s.scope, s.key)
		e.noErr(err, fmt.Sprintf("StorageKey(%q, %q)", s.scope, s.key))
		if j, dup := seen[k]; dup {
			e.t.Fatalf("StorageKey gave scopes %q and %q the same key %q", scopes[j].scope, s.scope, k)
		}
		seen[k] = i
		keys[i] = k
	}
	toks := make([]idempotency.Token, len(keys))
	for i, k := range keys {
		toks[i] = e.token()
		e.acquire(k, fpA, toks[i], long, long)
	}
	for i, k := range keys {
		e.complete(k, toks[i], fmt.Appendf(nil, "result of scope %d", i), long)
	}
	for i, k := range keys {
		e.replayEquals(k, fpA, fmt.Appendf(nil, "result of scope %d", i), fmt.Sprintf("replay of scope %q key %q", scopes[i].scope, scopes[i].key))
	}
}

func testCanceledContext(e *env) {
	canceled, cancel := context.WithCancel(e.ctx)
	cancel()
	k := e.key("canceled")
	_, err := e.s.Claim(canceled, idempotency.ClaimRequest{Key: k, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long})
	e.isErr(err, context.Canceled, "Claim with a canceled context")

	tok := e.token()
	e.acquire(k, fpA, tok, long, long) // the canceled claim wrote nothing
	e.isErr(e.s.Renew(canceled, k, tok, long), context.Canceled, "Renew with a canceled context")
	e.isErr(e.s.Checkpoint(canceled, k, tok, "c", []byte("x")), context.Canceled, "Checkpoint with a canceled context")
	e.isErr(e.s.Complete(canceled, k, tok, []byte("x"), long), context.Canceled, "Complete with a canceled context")
	e.isErr(e.s.Release(canceled, k, tok), context.Canceled, "Release with a canceled context")
	if e.caps.Watcher {
		if w, ok := e.s.(idempotency.Watcher); ok {
			done := make(chan error, 1)
			go func() { done <- w.Watch(canceled, k) }()
			select {
			case err := <-done:
				e.isErr(err, context.Canceled, "Watch with a canceled context")
			case <-time.After(watchTimeout):
				e.t.Errorf("Watch with a canceled context still blocks after %v", watchTimeout)
			}
		}
	}
	if e.caps.Sweeper {
		if sw, ok := e.s.(idempotency.Sweeper); ok {
			_, err := sw.Sweep(canceled, 0)
			e.isErr(err, context.Canceled, "Sweep with a canceled context")
		}
	}
	_, err = e.s.Claim(canceled, idempotency.ClaimRequest{Key: k, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long})
	e.isErr(err, context.Canceled, "Claim of a held key with a canceled context")

	e.inProgress(k, "claim by another token after canceled writes (neither Complete nor Release may have landed)")
	res := e.claim(k, fpA, tok, long, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim by the holder after canceled writes")
	e.checkpointsEqual(res.Checkpoints, nil, "checkpoints after a canceled Checkpoint")
	e.complete(k, tok, []byte("ok"), long)
	e.replayEquals(k, fpA, []byte("ok"), "replay after the holder completed")
}

// watchTimeout bounds how long a Watch may take to notice a change.
const watchTimeout = 5 * time.Second

func testWatch(e *env) {
	w, ok := e.s.(idempotency.Watcher)
	if !ok {
		e.t.Fatalf("Capabilities.Watcher is set but %T does not implement idempotency.Watcher", e.s)
	}
	changes := []struct {
		name   string
		change func(key string, tok idempotency.Token) error
	}{
		{"complete", func(k string, tok idempotency.Token) error {
			return e.s.Complete(e.ctx, k, tok, []byte("done"), long)
		}},
		{"release", func(k string, tok idempotency.Token) error {
			return e.s.Release(e.ctx, k, tok)
		}},
	}
	for _, c := range changes {
		k := e.key("watch-" + c.name)
		tok := e.token()
		e.acquire(k, fpA, tok, long, long)

		var changed atomic.Bool
		woke := make(chan error, 1)
		ctx, cancel := context.WithTimeout(e.ctx, 2*watchTimeout)
		go func() {
			// A spurious wake-up before the change is allowed: watch again.
			for spurious := 0; ; spurious++ {
				err := w.Watch(ctx, k)
				if err != nil || changed.Load() {
					woke <- err
					return
				}
				if spurious == 10000 {
					woke <- errors.New("Watch returned 10000 times before any change: it polls instead of waiting")
					return
				}
			}
		}()
		time.Sleep(100 * time.Millisecond) // let Watch subscribe
		changed.Store(true)
		e.noErr(c.change(k, tok), c.name)
		select {
		case err := <-woke:
			if err != nil {
				e.t.Errorf("Watch after %s: %v", c.name, err)
			}
		case <-time.After(watchTimeout):
			e.t.Fatalf("Watch did not return within %v after the record's %s", watchTimeout, c.name)
		}
		cancel()
	}

	k := e.key("watch-deadline")
	e.acquire(k, fpA, e.token(), long, long)
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		var err error
		for range 10000 { // spurious wake-ups allowed
			if err = w.Watch(ctx, k); err != nil {
				break
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		e.isErr(err, context.DeadlineExceeded, "Watch of an unchanging record until its context's deadline")
	case <-time.After(watchTimeout):
		e.t.Errorf("Watch still blocks %v after its context's deadline", watchTimeout)
	}
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// equalBytes compares byte slices, nil equal to empty.
func equalBytes(a, b []byte) bool { return string(a) == string(b) }
