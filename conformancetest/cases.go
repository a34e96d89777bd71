package conformancetest

import (
	"bytes"
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
	largest := e.feat.maxValue
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
	over := make([]byte, e.feat.maxValue+1)
	for i := range over {
		over[i] = byte(i)
	}
	e.isErr(e.s.Complete(e.ctx, k, tok, over, long), idempotency.ErrTooLarge,
		fmt.Sprintf("Complete with %d bytes (MaxValueSize %d)", len(over), e.feat.maxValue))
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

	// Fingerprints compare byte for byte: no case folding, no trimming, no
	// prefix match, no truncation of the longest one Do accepts.
	long256 := strings.Repeat("f", idempotency.MaxFingerprintLen-1)
	for _, pair := range [][2]idempotency.Fingerprint{
		{"Request-Fingerprint", "request-fingerprint"},
		{"Request-Fingerprint", "Request-Fingerprint "},
		{"Request-Fingerprint", "Request-Fingerprin"},
		{"Request-Fingerprint", "Request-FingerprinT"},
		{idempotency.Fingerprint(long256 + "1"), idempotency.Fingerprint(long256 + "2")},
	} {
		k := e.key("mismatch-bytes-" + randomHex(4))
		e.acquire(k, pair[0], e.token(), long, long)
		res := e.claim(k, pair[1], e.token(), long, long)
		e.expect(res, idempotency.OutcomeMismatch, fmt.Sprintf("claim with fingerprint %s of a key held with %s", short(string(pair[1])), short(string(pair[0]))))
	}
}

func testInProgress(e *env) {
	lease := 4 * e.unit
	k := e.key("in-progress")
	tok := e.token()
	acq := e.acquire(k, fpA, tok, lease, long)
	res := e.inProgress(k, "claim by another token during a live lease")
	if res.RetryAfter < lease-e.slack || res.RetryAfter > lease+e.tol {
		e.t.Errorf("RetryAfter %v right after a claim of a %v lease, want within [%v, %v]: the time left on the lease, which lasts as long as asked",
			res.RetryAfter, lease, lease-e.slack, lease+e.tol)
	}
	if res.Fence != 0 && res.Fence != acq.Fence {
		e.t.Errorf("InProgress fence %d, want the holder's %d (or 0 for unknown)", res.Fence, acq.Fence)
	}
	if len(res.Result) != 0 || len(res.Checkpoints) != 0 {
		e.t.Errorf("InProgress handed out a result %s or checkpoints %s", describe(res.Result), describeMap(res.Checkpoints))
	}

	e.pass(e.unit)
	res = e.inProgress(k, "claim by another token later in the lease")
	if left := lease - e.unit; res.RetryAfter < left-e.slack || res.RetryAfter > left+e.tol {
		e.t.Errorf("RetryAfter %v after %v of a %v lease, want within [%v, %v]: the time left, not the whole lease",
			res.RetryAfter, e.unit, lease, left-e.slack, left+e.tol)
	}
	e.complete(k, tok, []byte("r"), long)
	e.replayEquals(k, fpA, []byte("r"), "replay after the holder completed (InProgress answers must not disturb it)")
}

func testOneKeyConcurrent(e *env) {
	keys := []string{e.key("one-key")}
	e.onceEach(keys, e.burst(keys, 64, long), 1, nil, "64 concurrent claims of one key")
}

func testManyKeysConcurrent(e *env) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = e.key(fmt.Sprintf("many-%04d", i))
	}
	e.onceEach(keys, e.burst(keys, 8, long), 1, nil, "8 concurrent claims of each of 1,000 keys")
}

func testConcurrentTakeover(e *env) {
	keys := []string{e.key("concurrent-takeover")}
	first := []idempotency.ClaimResult{e.acquire(keys[0], fpA, e.token(), e.unit, long)}
	e.passBeyond(e.unit)
	e.onceEach(keys, e.burst(keys, 32, long), 2, first, "32 concurrent claims of an expired lease")
}

// testManyKeysTakeover repeats concurrent_takeover over many keys: a
// takeover decided by a read and then a write shows in one burst on one key
// only when two of its claims run at the same instant, which for a store in
// the process (a window of microseconds, two CPUs shared with other work)
// is rare. Many short bursts, one after another, give it many chances. A
// store over a network needs fewer (its window is a round trip at least)
// and takes longer for each, so in real time the bursts stop after
// takeoverBudget once minRounds are done (see moreRounds).
func testManyKeysTakeover(e *env) {
	const rounds, minRounds, perRound = 16, 4, 64
	keys := make([]string, rounds*perRound)
	for i := range keys {
		keys[i] = e.key(fmt.Sprintf("takeover-%04d", i))
	}
	// Every lease is the shortest the store honours: the case waits for
	// them all once.
	setup := e.burst(keys, 1, e.short)
	e.onceEach(keys, setup, 1, nil, "claims of absent keys")
	if e.t.Failed() {
		return
	}
	first := make([]idempotency.ClaimResult, len(keys))
	for i, acq := range setup {
		first[i] = acq[0]
	}
	e.passBeyond(e.short)
	start := time.Now()
	for r := 0; r < rounds && e.moreRounds(start, r, minRounds); r++ {
		ks, fs := keys[r*perRound:(r+1)*perRound], first[r*perRound:(r+1)*perRound]
		e.onceEach(ks, e.burst(ks, 8, long), 2, fs, fmt.Sprintf("round %d of %d: 8 concurrent claims of each of %d expired leases", r+1, rounds, perRound))
		if e.t.Failed() {
			return
		}
	}
}

// takeoverBudget bounds the time many_keys_takeover_8_goroutines and
// stale_writes_race_takeovers spend in bursts after their first minRounds,
// in real time.
const takeoverBudget = 500 * time.Millisecond

// moreRounds reports whether a case that began its rounds at start and has
// run r of them runs more: always before minRounds; then, on the
// controlled clock, every round (a store that takes the suite's clock runs
// in the process, where a race's window is narrowest and a round costs
// microseconds, and its waits cost nothing); in real time (a server, whose
// window is a round trip at least, and whose rounds are slow) until
// takeoverBudget has passed. On the controlled clock, the number of rounds
// does not depend on the machine's load.
func (e *env) moreRounds(start time.Time, r, minRounds int) bool {
	return r < minRounds || e.caps.ControlledClock || time.Since(start) < takeoverBudget
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
		// Tokens compare exactly: the holder's token in upper case is another token.
		if folded := idempotency.Token(strings.ToUpper(string(tokB))); folded != tokB {
			e.isErr(e.s.Renew(e.ctx, k, folded, long), idempotency.ErrLeaseLost, "Renew by the holder's token in upper case "+when)
			e.isErr(e.s.Complete(e.ctx, k, folded, []byte("F"), long), idempotency.ErrLeaseLost, "Complete by the holder's token in upper case "+when)
		}
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
	k, shorter := e.key("renew"), e.key("renew-shorter")
	tok, tokS := e.token(), e.token()
	e.acquire(k, fpA, tok, 2*e.unit, e.unit)
	s := e.acquire(shorter, fpA, tokS, long, long)
	// Renew sets the deadline: a lease shorter than the one left ends sooner.
	e.noErr(e.s.Renew(e.ctx, shorter, tokS, e.unit), "Renew with a lease shorter than the one left")
	res := e.inProgress(shorter, "claim by another token after Renew shortened the lease")
	if res.RetryAfter > e.unit+e.tol {
		e.t.Errorf("RetryAfter %v after Renew(%v) of a %v lease, want at most %v: Renew sets the lease, it does not only extend it",
			res.RetryAfter, e.unit, long, e.unit)
	}

	e.pass(e.unit)
	e.noErr(e.s.Renew(e.ctx, k, tok, 6*e.unit), "Renew")
	res = e.inProgress(k, "claim by another token right after Renew")
	if res.RetryAfter < 6*e.unit-e.slack || res.RetryAfter > 6*e.unit+e.tol {
		e.t.Errorf("RetryAfter %v right after Renew(%v) one unit into a 2-unit lease, want within [%v, %v]: the new lease is measured from now, not from the old deadline",
			res.RetryAfter, 6*e.unit, 6*e.unit-e.slack, 6*e.unit+e.tol)
	}
	// 4 units after the claim: past the original lease (2) and the original
	// lease plus grace (3); the renewed lease ends at 7.
	e.pass(3 * e.unit)
	res = e.inProgress(k, "claim by another token after the original lease, within the renewed one")
	if res.RetryAfter <= 0 || res.RetryAfter > 3*e.unit+e.tol {
		e.t.Errorf("RetryAfter %v 3 units after renewing for %v, want within (0, %v]", res.RetryAfter, 6*e.unit, 3*e.unit)
	}
	e.noErr(e.s.Renew(e.ctx, k, tok, long), "second Renew")
	e.complete(k, tok, []byte("r"), long)
	e.replayEquals(k, fpA, []byte("r"), "replay after renewing and completing")

	// The shortened lease ended 4 units ago (its grace is long).
	e.takenOver(shorter, e.token(), s, nil, "claim after a shortened lease ended")
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

// takenOver claims key under tok and checks that it takes over the record
// prev acquired: attempt one more, a greater fence, and the checkpoints cps
// handed over.
func (e *env) takenOver(key string, tok idempotency.Token, prev idempotency.ClaimResult, cps map[string][]byte, what string) idempotency.ClaimResult {
	e.t.Helper()
	res := e.claim(key, fpA, tok, long, long)
	e.expect(res, idempotency.OutcomeAcquired, what)
	if res.Attempt != prev.Attempt+1 || res.Fence <= prev.Fence {
		e.t.Errorf("%s: attempt %d fence %d, want a takeover: attempt %d and a fence above %d",
			what, res.Attempt, res.Fence, prev.Attempt+1, prev.Fence)
	}
	e.checkpointsEqual(res.Checkpoints, cps, what)
	return res
}

// afresh claims key with fp and tok and checks that it finds no record
// where prev acquired one: attempt 1, a greater fence, no checkpoints and
// no result.
func (e *env) afresh(key string, fp idempotency.Fingerprint, tok idempotency.Token, prev idempotency.ClaimResult, what string) {
	e.t.Helper()
	res := e.claim(key, fp, tok, long, long)
	e.expect(res, idempotency.OutcomeAcquired, what)
	if res.Attempt != 1 || res.Fence <= prev.Fence || len(res.Checkpoints) != 0 || len(res.Result) != 0 {
		e.t.Errorf("%s: attempt %d fence %d checkpoints %s result %s, want a fresh record: attempt 1, a fence above %d, no checkpoints, no result",
			what, res.Attempt, res.Fence, describeMap(res.Checkpoints), describe(res.Result), prev.Fence)
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
	e.pass(e.unit)
	retention := 3 * e.unit
	e.complete(k, tok, []byte("r"), retention) // 1 unit after the claim: retention ends at 4
	if rep := e.replay(k, fpA, "replay just after Complete"); rep.ExpiresIn < 0 || rep.ExpiresIn > retention+e.tol {
		e.t.Errorf("replay just after a Complete with a %v retention: ExpiresIn %v, want zero (not said) or at most the retention", retention, rep.ExpiresIn)
	}
	e.pass(2 * e.unit)
	rep := e.replay(k, fpA, "replay 3 units after the claim, within a 3-unit retention counted from Complete")
	if !bytes.Equal(rep.Result, []byte("r")) {
		e.t.Errorf("replay 3 units after the claim: result %s, want %q", describe(rep.Result), "r")
	}
	if rep.ExpiresIn < 0 || rep.ExpiresIn > e.unit+e.tol {
		e.t.Errorf("replay 2 units into a 3-unit retention: ExpiresIn %v, want zero (not said) or at most the unit left (%v)", rep.ExpiresIn, e.unit)
	}
	e.noErr(e.s.Complete(e.ctx, k, tok, []byte("r"), long), "repeated Complete within retention (it changes nothing, retention included)")
	e.passBeyond(e.unit)
	e.isErr(e.s.Complete(e.ctx, k, tok, []byte("r"), long), idempotency.ErrLeaseLost,
		"repeated Complete after retention ended (an expired record is absent, and the earlier repeat did not extend it)")
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
	sw := e.feat.sweeper
	// Live records, whose deadlines were set every way a record's can be.
	liveStarted, liveCompleted := e.key("sweep-live-started"), e.key("sweep-live-completed")
	inGrace, renewed := e.key("sweep-in-grace"), e.key("sweep-renewed")
	repeated, completedLate := e.key("sweep-repeated"), e.key("sweep-completed-after-short-lease")
	e.acquire(liveStarted, fpA, e.token(), long, long)
	tok := e.token()
	e.acquire(liveCompleted, fpA, tok, long, long)
	e.complete(liveCompleted, tok, []byte("keep"), long)
	tok = e.token()
	graced := e.acquire(inGrace, fpA, tok, e.unit, long) // past its lease, within its grace
	e.checkpoint(inGrace, tok, "s", []byte("kept"))
	tok = e.token()
	e.acquire(renewed, fpA, tok, e.unit, 0)
	e.noErr(e.s.Renew(e.ctx, renewed, tok, long), "Renew")
	tok = e.token()
	e.acquire(repeated, fpA, tok, e.unit, 0)
	e.expect(e.claim(repeated, fpA, tok, long, 0), idempotency.OutcomeAcquired, "repeated claim")
	tok = e.token()
	e.acquire(completedLate, fpA, tok, e.unit, 0)
	e.complete(completedLate, tok, []byte("late"), long)

	expired := []string{e.key("sweep-expired-started-1"), e.key("sweep-expired-started-2"), e.key("sweep-expired-completed")}
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
		e.t.Errorf("Sweep(limit 1) with 3 expired records deleted %d, want 1 (at most the limit, at least one)", n)
	}
	// The rest, by three sweepers at once, each calling until nothing is
	// left (a store shared with other cases may keep finding some).
	var deleted atomic.Int64
	var wg sync.WaitGroup
	for limit := range 3 {
		wg.Go(func() {
			for range 100 {
				n, err := sw.Sweep(e.ctx, limit)
				if err != nil {
					e.t.Errorf("Sweep(%d) beside other sweeps: %v", limit, err)
					return
				}
				if n < 0 || limit > 0 && n > limit {
					e.t.Errorf("Sweep(%d) deleted %d records", limit, n)
				}
				deleted.Add(int64(n))
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if n := deleted.Load(); n < 2 {
		e.t.Errorf("three concurrent sweepers called until they found nothing deleted %d records, want at least the 2 expired records left", n)
	}

	// Three more records expire. Sweep with no limit (limit <= 0), alone,
	// deletes at least one of them, and calling it until it finds nothing
	// deletes them all: a limit of 0 is not "delete nothing" (LIMIT 0).
	later := []string{e.key("sweep-later-started-1"), e.key("sweep-later-started-2"), e.key("sweep-later-completed")}
	e.acquire(later[0], fpA, e.token(), e.short, 0)
	e.acquire(later[1], fpA, e.token(), e.short, 0)
	tok = e.token()
	e.acquire(later[2], fpA, tok, long, long)
	e.complete(later[2], tok, []byte("old"), e.short)
	e.passBeyond(e.short)
	n, err = sw.Sweep(e.ctx, 0)
	e.noErr(err, "Sweep(0)")
	if n < 1 {
		e.t.Errorf("Sweep(0), alone, with 3 expired records nobody holds deleted %d, want at least 1: a limit <= 0 means no limit", n)
	}
	total := n
	for range 100 {
		n, err := sw.Sweep(e.ctx, -1)
		e.noErr(err, "Sweep(-1)")
		if n == 0 {
			break
		}
		total += n
	}
	if total < len(later) {
		e.t.Errorf("Sweep(0) then Sweep(-1), alone, called until they found nothing, deleted %d records, want at least the %d that expired: a limit <= 0 means no limit", total, len(later))
	}

	e.inProgress(liveStarted, "claim of a live STARTED record after Sweep")
	e.replayEquals(liveCompleted, fpA, []byte("keep"), "replay of a live COMPLETED record after Sweep")
	e.inProgress(renewed, "claim of a record renewed past its first lease plus grace, after Sweep")
	e.inProgress(repeated, "claim of a record whose repeated claim moved its lease, after Sweep")
	e.replayEquals(completedLate, fpA, []byte("late"), "replay of a record completed after a short lease, after Sweep")
	e.takenOver(inGrace, e.token(), graced, map[string][]byte{"s": []byte("kept")},
		"claim of a record past its lease but within its grace, after Sweep (which must not delete it)")
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
	if w := e.feat.watcher; w != nil {
		done := make(chan error, 1)
		go func() { done <- w.Watch(canceled, k) }()
		select {
		case err := <-done:
			e.isErr(err, context.Canceled, "Watch with a canceled context")
		case <-time.After(watchTimeout):
			e.t.Errorf("Watch with a canceled context still blocks after %v", watchTimeout)
		}
	}
	if sw := e.feat.sweeper; sw != nil {
		_, err := sw.Sweep(canceled, 0)
		e.isErr(err, context.Canceled, "Sweep with a canceled context")
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
	w := e.feat.watcher
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
		calling := make(chan struct{})
		ctx, cancel := context.WithTimeout(e.ctx, 2*watchTimeout)
		go func() {
			close(calling)
			// A spurious wake-up before the change is allowed: watch again.
			for spurious := 0; ; spurious++ {
				err := w.Watch(ctx, k)
				if err != nil || changed.Load() {
					woke <- err
					return
				}
				if spurious == 10000 {
					woke <- errors.New("watch returned 10000 times before any change: it polls instead of waiting")
					return
				}
			}
		}()
		// Let Watch subscribe: the goroutine is about to call it (on a loaded
		// machine it may start long after the go statement).
		<-calling
		time.Sleep(100 * time.Millisecond)
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

func testCheckpointsCopied(e *env) {
	k := e.key("checkpoints-copied")
	tok := e.token()
	a := e.acquire(k, fpA, tok, e.unit, long)
	v := []byte("value one")
	e.checkpoint(k, tok, "s", v)
	copy(v, "XXXXX") // the store must have copied what it keeps
	want := map[string][]byte{"s": []byte("value one")}

	res := e.claim(k, fpA, tok, e.unit, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim by the holder")
	e.checkpointsEqual(res.Checkpoints, want, "checkpoints after the caller changed the slice it gave Checkpoint")
	scribble(res.Checkpoints)
	res = e.claim(k, fpA, tok, e.unit, long)
	e.expect(res, idempotency.OutcomeAcquired, "second repeated claim by the holder")
	e.checkpointsEqual(res.Checkpoints, want, "checkpoints after the caller changed the map and bytes an earlier claim returned")
	scribble(res.Checkpoints)

	e.passBeyond(e.unit)
	tokB := e.token()
	res = e.takenOver(k, tokB, a, want, "takeover after the caller changed what earlier claims returned")
	scribble(res.Checkpoints)
	res = e.claim(k, fpA, tokB, long, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim by the new holder")
	e.checkpointsEqual(res.Checkpoints, want, "checkpoints after the caller changed the map and bytes a takeover returned")
}

// scribble changes every byte of every value in m, and m itself, as a
// caller that owns what it was given may.
func scribble(m map[string][]byte) {
	for _, v := range m {
		for i := range v {
			v[i] ^= 0xff
		}
	}
	if m != nil {
		m["added-by-the-caller"] = []byte("x")
	}
}

func testLateHolder(e *env) {
	// Four holders whose leases end while nobody claims their keys.
	names := []string{"late-repeat", "late-writes", "late-renew", "late-release"}
	toks := map[string]idempotency.Token{}
	first := map[string]idempotency.ClaimResult{}
	for _, n := range names {
		toks[n] = e.token()
		first[n] = e.acquire(e.key(n), fpA, toks[n], e.unit, long)
		e.checkpoint(e.key(n), toks[n], "s", []byte("1"))
	}
	e.passBeyond(e.unit)

	k, tok := e.key("late-repeat"), toks["late-repeat"]
	res := e.claim(k, fpA, tok, long, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim by the holder after its lease ended, nobody having taken over")
	if res.Fence != first["late-repeat"].Fence || res.Attempt != 1 {
		e.t.Errorf("repeated claim by the holder after its lease ended: fence %d attempt %d, want fence %d attempt 1 (a repeat, not a takeover)",
			res.Fence, res.Attempt, first["late-repeat"].Fence)
	}
	e.checkpointsEqual(res.Checkpoints, map[string][]byte{"s": []byte("1")}, "checkpoints of the late repeated claim")
	e.inProgress(k, "claim by another token after the late repeated claim set the lease anew")

	k, tok = e.key("late-writes"), toks["late-writes"]
	e.checkpoint(k, tok, "t", []byte("2"))
	e.complete(k, tok, []byte("late"), long)
	e.replayEquals(k, fpA, []byte("late"), "replay of a record completed after its lease ended, nobody having taken over")

	k, tok = e.key("late-renew"), toks["late-renew"]
	e.noErr(e.s.Renew(e.ctx, k, tok, long), "Renew after the lease ended, nobody having taken over")
	e.inProgress(k, "claim by another token after the late Renew")

	k, tok = e.key("late-release"), toks["late-release"]
	e.noErr(e.s.Release(e.ctx, k, tok), "Release after the lease ended, nobody having taken over")
	e.afresh(k, fpA, e.token(), first["late-release"], "claim after a late Release")
}

func testRenewKeepsGrace(e *env) {
	// Two holders renew and vanish: one key is taken over within the
	// grace, the other is left to expire.
	over, left := e.key("renew-grace-takeover"), e.key("renew-grace-expiry")
	tokO, tokL := e.token(), e.token()
	o := e.acquire(over, fpA, tokO, e.unit, 2*e.unit)
	l := e.acquire(left, fpA, tokL, e.unit, 2*e.unit)
	e.checkpoint(over, tokO, "s", []byte("1"))
	e.checkpoint(left, tokL, "s", []byte("2"))
	e.noErr(e.s.Renew(e.ctx, over, tokO, 2*e.unit), "Renew")
	e.noErr(e.s.Renew(e.ctx, left, tokL, 2*e.unit), "Renew")
	// The renewed leases end 2 units from now, the records 2 units later.
	e.passBeyond(2 * e.unit)
	e.takenOver(over, e.token(), o, map[string][]byte{"s": []byte("1")},
		"claim after a renewed lease ended, within its grace (Renew keeps the grace)")
	e.pass(2 * e.unit)
	e.afresh(left, fpA, e.token(), l, "claim after a renewed lease and its grace ended")
}

func testRepeatedClaimGrace(e *env) {
	// Each holder repeats its claim with another grace than the first.
	longer, shorter := e.key("repeat-grace-longer"), e.key("repeat-grace-shorter")
	tokL, tokS := e.token(), e.token()
	l := e.acquire(longer, fpA, tokL, e.unit, 0)
	s := e.acquire(shorter, fpA, tokS, e.unit, 3*e.unit)
	e.checkpoint(longer, tokL, "s", []byte("1"))
	e.checkpoint(shorter, tokS, "s", []byte("2"))
	for _, r := range []struct {
		key   string
		tok   idempotency.Token
		grace time.Duration
		first idempotency.ClaimResult
	}{{longer, tokL, 3 * e.unit, l}, {shorter, tokS, 0, s}} {
		res := e.claim(r.key, fpA, r.tok, e.unit, r.grace)
		e.expect(res, idempotency.OutcomeAcquired, "repeated claim with another grace")
		if res.Fence != r.first.Fence {
			e.t.Errorf("repeated claim with another grace: fence %d, want %d", res.Fence, r.first.Fence)
		}
	}
	e.passBeyond(e.unit) // both leases ended: longer within its new grace, shorter past its new one

	e.takenOver(longer, e.token(), l, map[string][]byte{"s": []byte("1")},
		"claim within the grace a repeated claim set (the repeat's grace applies, not the first claim's)")
	e.afresh(shorter, fpA, e.token(), s,
		"claim past the lease of a repeated claim without grace (the repeat's grace applies, not the first claim's)")
}

func testCheckpointReplaces(e *env) {
	k := e.key("checkpoint-replaces")
	tok := e.token()
	a := e.acquire(k, fpA, tok, 2*e.unit, long)
	e.checkpoint(k, tok, "s", []byte("1"))
	e.checkpoint(k, tok, "t", []byte("kept"))
	e.pass(e.unit)
	e.checkpoint(k, tok, "s", []byte("2"))
	res := e.inProgress(k, "claim by another token after a Checkpoint")
	if res.RetryAfter > e.unit+e.tol {
		e.t.Errorf("RetryAfter %v after a Checkpoint 1 unit into a 2-unit lease, want at most %v: Checkpoint does not change the lease",
			res.RetryAfter, e.unit)
	}
	e.passBeyond(e.unit) // the lease as claimed has ended
	e.takenOver(k, e.token(), a, map[string][]byte{"s": []byte("2"), "t": []byte("kept")},
		"claim when the lease as claimed ended (a Checkpoint does not extend it), after one name was written twice")
}

func testCompleteDropsCheckpoints(e *env) {
	k := e.key("complete-drops")
	tok := e.token()
	first := e.acquire(k, fpA, tok, long, long)
	e.checkpoint(k, tok, "s", []byte("1"))
	e.checkpoint(k, tok, "t", []byte("2"))
	e.complete(k, tok, []byte("r"), e.unit)
	res := e.replay(k, fpA, "replay of a record completed with checkpoints")
	if len(res.Checkpoints) != 0 {
		e.t.Errorf("replay handed out checkpoints %s, want none (Complete drops them)", describeMap(res.Checkpoints))
	}
	res = e.claim(k, fpA, tok, long, long)
	e.expect(res, idempotency.OutcomeReplay, "claim by the holder of its completed record")
	if len(res.Checkpoints) != 0 {
		e.t.Errorf("the holder's claim of its completed record handed out checkpoints %s, want none", describeMap(res.Checkpoints))
	}

	e.passBeyond(e.unit) // the completed record expired
	tokB := e.token()
	e.afresh(k, fpA, tokB, first, "claim after the completed record expired (Complete drops the checkpoints)")
	res = e.claim(k, fpA, tokB, long, long)
	e.expect(res, idempotency.OutcomeAcquired, "repeated claim of the new record")
	if len(res.Checkpoints) != 0 {
		e.t.Errorf("repeated claim of the new record: checkpoints %s, want none (Complete drops them)", describeMap(res.Checkpoints))
	}
}

func testExpiredIsAbsent(e *env) {
	// Three records expire: two STARTED ones at the end of their lease (no
	// grace), a COMPLETED one at the end of its retention.
	started, reclaimed, completed := e.key("expired-started"), e.key("expired-reclaimed"), e.key("expired-completed")
	tokS, tokR, tokC := e.token(), e.token(), e.token()
	s := e.acquire(started, fpA, tokS, e.unit, 0)
	e.checkpoint(started, tokS, "s", []byte("1"))
	r := e.acquire(reclaimed, fpA, tokR, e.unit, 0)
	e.checkpoint(reclaimed, tokR, "s", []byte("1"))
	c := e.acquire(completed, fpA, tokC, long, long)
	e.complete(completed, tokC, []byte("old"), e.unit)
	e.passBeyond(e.unit)

	for _, x := range []struct {
		key  string
		tok  idempotency.Token
		what string
	}{{started, tokS, "an expired STARTED record"}, {completed, tokC, "an expired COMPLETED record"}} {
		e.isErr(e.s.Renew(e.ctx, x.key, x.tok, long), idempotency.ErrLeaseLost, "its holder's Renew of "+x.what)
		e.isErr(e.s.Checkpoint(e.ctx, x.key, x.tok, "s", []byte("2")), idempotency.ErrLeaseLost, "its holder's Checkpoint of "+x.what)
		e.isErr(e.s.Complete(e.ctx, x.key, x.tok, []byte("new"), long), idempotency.ErrLeaseLost, "its holder's Complete of "+x.what)
		e.noErr(e.s.Release(e.ctx, x.key, x.tok), "its holder's Release of "+x.what)
		e.noErr(e.s.Release(e.ctx, x.key, e.token()), "another token's Release of "+x.what)
	}
	// None of those wrote anything: even another fingerprint acquires afresh.
	e.afresh(started, fpB, e.token(), s, "claim with another fingerprint of an expired STARTED record")
	e.afresh(completed, fpB, e.token(), c, "claim with another fingerprint of an expired COMPLETED record")
	// The expired holder's own token finds no record either.
	e.afresh(reclaimed, fpA, tokR, r, "claim under the token of an expired record (not a repeat)")
}

// testDeadlineDuringOperation gives every operation a context that ends
// a little later each round, from at once to 1.5ms, so that some end
// while the store is at work.
func testDeadlineDuringOperation(e *env) {
	for round := range 32 {
		d := time.Duration(round) * 50 * time.Microsecond
		short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(e.ctx, d) }
		what := func(op string) string { return fmt.Sprintf("%s with a context that ends %v after the call", op, d) }
		k := e.key(fmt.Sprintf("deadline-%02d", round))
		tok := e.token()

		ctx, cancel := short()
		res, err := e.s.Claim(ctx, idempotency.ClaimRequest{Key: k, Fingerprint: fpA, Token: tok, Lease: long, Grace: long})
		cancel()
		if err == nil {
			e.expect(res, idempotency.OutcomeAcquired, what("Claim of an absent key"))
		}
		again := e.claim(k, fpA, tok, long, long)
		e.expect(again, idempotency.OutcomeAcquired, "repeated claim after "+what("Claim"))
		if again.Attempt != 1 || err == nil && again.Fence != res.Fence {
			e.t.Errorf("repeated claim after %s: fence %d attempt %d, want attempt 1 and the first claim's fence %d",
				what("Claim"), again.Fence, again.Attempt, res.Fence)
		}

		ctx, cancel = short()
		e.notRefused(e.s.Renew(ctx, k, tok, long), what("the holder's Renew"))
		cancel()
		ctx, cancel = short()
		e.notRefused(e.s.Checkpoint(ctx, k, tok, "s", []byte("v")), what("the holder's Checkpoint"))
		cancel()
		if round%2 == 0 {
			ctx, cancel = short()
			e.notRefused(e.s.Complete(ctx, k, tok, []byte("r"), long), what("the holder's Complete"))
			cancel()
			e.complete(k, tok, []byte("r"), long) // the first Complete or a repeat
			e.replayEquals(k, fpA, []byte("r"), "replay after "+what("Complete"))
		} else {
			ctx, cancel = short()
			e.notRefused(e.s.Release(ctx, k, tok), what("the holder's Release"))
			cancel()
			e.noErr(e.s.Release(e.ctx, k, tok), "Release after "+what("Release"))
			// No claim checks the release: a call cut short may still land
			// after later ones (a statement the server runs on after the
			// client gave up), and the round's first Claim may re-create
			// the record. The contract allows that (rule 5), and the lease
			// still protects it.
		}
	}
}

// notRefused fails the case when err is a definite refusal. The caller
// holds a live lease, so the true answer is success; an operation cut
// short must say so with an error, not with ErrLeaseLost.
func (e *env) notRefused(err error, what string) {
	e.t.Helper()
	if errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrTooLarge) {
		e.t.Errorf("%s: %v, a definite refusal of a call by a live holder: a call that may have been cut short returns an error that says so", what, err)
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
