package conformancetest

import (
	"errors"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency"
)

// recState is a state a record reaches, as the contract describes them.
// answers_in_every_state walks records through all of them and, in each,
// asserts every field of the answers a claim gets and of what Inspect
// describes, and every operation by a token that does not hold the record.
type recState string

const (
	stFresh          recState = "fresh"            // acquired by a claim of an absent key
	stRepeated       recState = "repeated"         // claimed again by its holder
	stLate           recState = "late"             // its holder's lease ended and nobody took over
	stTakenOver      recState = "taken_over"       // taken over once
	stTakenOverAgain recState = "taken_over_again" // taken over a second time
	stCompleted      recState = "completed"        // completed by its holder
	stReleased       recState = "released"         // released by its holder: absent
	stExpired        recState = "expired"          // past lease plus grace, or retention: absent
)

// allStates lists every recState, in the order answers_in_every_state
// reaches them.
var allStates = []recState{stFresh, stRepeated, stLate, stTakenOver, stTakenOverAgain, stCompleted, stReleased, stExpired}

// Marks that are not a field or method name (see env.cover).
const (
	atOthersWrites = "writes by other tokens" // rule 2
	atStaleWrites  = "writes by a holder taken over"
	atClaimAbsent  = "claim: none/expired"
	atClaimMis     = "claim: mismatch"
	atClaimReplay  = "claim: replay"
	atClaimBusy    = "claim: in progress"
	atClaimTake    = "claim: takeover"
	atClaimRepeat  = "claim: repeat"
)

// checked tells env.cover that the case asserted at in state st.
func (e *env) checked(at string, st recState) {
	if e.cover != nil {
		e.cover(at, st)
	}
}

// expected is what a claim's answer must be.
type expected struct {
	outcome idempotency.Outcome
	// fence is the record's: an acquisition must have it, another outcome
	// it or 0 (unknown). Zero for an acquisition of a new fence, above
	// above.
	fence, above int64
	// attempt is the record's: an acquisition must have it, another
	// outcome it or 0 (unknown).
	attempt int
	// lease is, for OutcomeInProgress, the end of the holder's lease.
	lease due
	// result and cps are the result and checkpoints the answer must carry
	// (nil for none).
	result []byte
	cps    map[string][]byte
}

// claimTimed is claim, and when it ran.
func (e *env) claimTimed(key string, fp idempotency.Fingerprint, tok idempotency.Token, lease, grace time.Duration) (idempotency.ClaimResult, span) {
	e.t.Helper()
	var res idempotency.ClaimResult
	p := e.timed(func() { res = e.claim(key, fp, tok, lease, grace) })
	return res, p
}

// answerIs checks every field of res, the answer of a claim made during p
// in state st.
func (e *env) answerIs(st recState, what string, res idempotency.ClaimResult, p span, w expected) {
	e.t.Helper()
	what = fmt.Sprintf("%s, with the record %s", what, st)
	e.checked("ClaimResult.Outcome", st)
	if res.Outcome != w.outcome {
		e.t.Errorf("%s: outcome %v (fence %d, attempt %d, retry after %v), want %v", what, res.Outcome, res.Fence, res.Attempt, res.RetryAfter, w.outcome)
		return
	}
	acquired := w.outcome == idempotency.OutcomeAcquired
	switch {
	case w.outcome == idempotency.OutcomeMismatch:
		e.checked(atClaimMis, st)
	case w.outcome == idempotency.OutcomeReplay:
		e.checked(atClaimReplay, st)
	case w.outcome == idempotency.OutcomeInProgress:
		e.checked(atClaimBusy, st)
	case w.fence != 0:
		e.checked(atClaimRepeat, st)
	case w.attempt == 1:
		e.checked(atClaimAbsent, st)
	default:
		e.checked(atClaimTake, st)
	}
	e.checked("ClaimResult.Fence", st)
	switch {
	case acquired && w.fence != 0 && res.Fence != w.fence:
		e.t.Errorf("%s: fence %d, want the holder's %d", what, res.Fence, w.fence)
	case acquired && w.fence == 0 && res.Fence <= w.above:
		e.t.Errorf("%s: fence %d, want a new fence, above %d", what, res.Fence, w.above)
	case !acquired && res.Fence != 0 && res.Fence != w.fence:
		e.t.Errorf("%s: fence %d, want the record's %d (or 0 for unknown)", what, res.Fence, w.fence)
	}
	e.checked("ClaimResult.Attempt", st)
	switch {
	case acquired && res.Attempt != w.attempt:
		e.t.Errorf("%s: attempt %d, want %d (1 for a fresh record, one more for every takeover)", what, res.Attempt, w.attempt)
	case !acquired && res.Attempt != 0 && res.Attempt != w.attempt:
		e.t.Errorf("%s: attempt %d, want the record's %d (or 0 for unknown)", what, res.Attempt, w.attempt)
	}
	if w.outcome == idempotency.OutcomeInProgress {
		e.checked("ClaimResult.RetryAfter", st)
		if lo, hi := e.leftWithin(w.lease, p); res.RetryAfter < lo || res.RetryAfter > hi {
			e.t.Errorf("%s: RetryAfter %v, want the time left on the lease, within [%v, %v]", what, res.RetryAfter, lo, hi)
		}
	}
	e.checked("ClaimResult.Result", st)
	if !equalBytes(res.Result, w.result) {
		e.t.Errorf("%s: result %s, want %s", what, describe(res.Result), describe(w.result))
	}
	e.checked("ClaimResult.Checkpoints", st)
	e.checkpointsEqual(res.Checkpoints, w.cps, what)
}

// expectedInfo is what Inspect must describe; absent: ErrNotFound.
type expectedInfo struct {
	absent  bool
	state   idempotency.State
	fence   int64
	attempt int
	// lease is the end of the holder's lease; a zero lease.d (a COMPLETED
	// record, or a lease that ended) means LeaseLeft must be exactly 0.
	lease, expires due
	// grace, for a STARTED record whose lease ended, is the grace it was
	// claimed with: a store whose durations are its leases' whole-second
	// TTLs (Resolution of a second or more) has no clock to tell when
	// the lease ended, and may say ExpiresIn up to the grace.
	grace  time.Duration
	result []byte
	cps    map[string][]byte
}

// infoIs checks every field of what Inspect describes of key in state st,
// when the store has an Inspector.
func (e *env) infoIs(st recState, key string, w expectedInfo) {
	e.t.Helper()
	in := e.feat.inspector
	if in == nil {
		return
	}
	what := fmt.Sprintf("Inspect of %s, with the record %s", short(key), st)
	var info idempotency.RecordInfo
	var err error
	p := e.timed(func() { info, err = in.Inspect(e.ctx, key) })
	if w.absent {
		e.checked("Inspector.Inspect", st)
		if !errors.Is(err, idempotency.ErrNotFound) {
			e.t.Errorf("%s: %+v, %v; want ErrNotFound", what, info, err)
		}
		return
	}
	if err != nil {
		e.t.Errorf("%s: unexpected error: %v", what, err)
		return
	}
	// (Fence and Attempt share one doc comment, Fence's.)
	for _, f := range []string{"Key", "State", "Fingerprint", "Fence", "LeaseLeft", "ExpiresIn", "Result", "ResultSize", "Checkpoints"} {
		e.checked("RecordInfo."+f, st)
	}
	if info.Key != key {
		e.t.Errorf("%s: Key %s, want %s", what, short(info.Key), short(key))
	}
	if info.State != w.state || info.Fingerprint != fpA {
		e.t.Errorf("%s: state %q, fingerprint %q; want %q, %q (the fingerprint of the claim that created it)", what, info.State, info.Fingerprint, w.state, fpA)
	}
	if info.Fence != w.fence || info.Attempt != w.attempt {
		e.t.Errorf("%s: fence %d, attempt %d; want those of its last acquisition, %d and %d", what, info.Fence, info.Attempt, w.fence, w.attempt)
	}
	switch lo, hi := e.leftWithin(w.lease, p); {
	case w.lease.d == 0 && info.LeaseLeft != 0:
		e.t.Errorf("%s: LeaseLeft %v, want 0 (%s)", what, info.LeaseLeft, map[bool]string{true: "a COMPLETED record has no lease", false: "its lease ended"}[w.state == idempotency.StateCompleted])
	case w.lease.d != 0 && (info.LeaseLeft < lo || info.LeaseLeft > hi):
		e.t.Errorf("%s: LeaseLeft %v, want the time left on the lease, within [%v, %v]", what, info.LeaseLeft, lo, hi)
	}
	lo, hi := e.leftWithin(w.expires, p)
	if w.lease.d == 0 && w.grace > 0 && e.feat.resolution >= time.Second {
		hi = max(hi, w.grace+e.tol)
	}
	if info.ExpiresIn < lo-e.tol || info.ExpiresIn > hi {
		e.t.Errorf("%s: ExpiresIn %v, want the time left before the record expires, within [%v, %v]", what, info.ExpiresIn, lo-e.tol, hi)
	}
	if !equalBytes(info.Result, w.result) {
		e.t.Errorf("%s: result %s, want %s", what, describe(info.Result), describe(w.result))
	}
	if info.ResultSize != 0 && info.ResultSize != len(w.result) {
		e.t.Errorf("%s: ResultSize %d, want the result's length %d (or 0)", what, info.ResultSize, len(w.result))
	}
	e.checkpointsEqual(info.Checkpoints, w.cps, what)
}

// othersRefused checks the writes of tokens that do not hold key's record
// in state st: a token that never held it (made here) and the earlier
// holders given. Renew, Checkpoint and Complete get ErrLeaseLost; so does
// Release, unless the record is absent, when it succeeds. What these
// writes must not have changed, the observations that follow check: the
// lease (RetryAfter, LeaseLeft), the checkpoints, the state and the result.
func (e *env) othersRefused(st recState, key string, absent bool, earlier ...idempotency.Token) {
	e.t.Helper()
	for i, tok := range append([]idempotency.Token{e.token()}, earlier...) {
		who := fmt.Sprintf("a token that never held %s, with the record %s", short(key), st)
		if i > 0 {
			who = fmt.Sprintf("an earlier holder of %s, with the record %s", short(key), st)
			if st != stReleased { // a holder that released was not taken over
				e.checked(atStaleWrites, st)
			}
		}
		e.checked(atOthersWrites, st)
		e.checked("Store.Renew", st)
		e.isErr(e.s.Renew(e.ctx, key, tok, long), idempotency.ErrLeaseLost, "Renew by "+who)
		e.checked("Store.Checkpoint", st)
		e.isErr(e.s.Checkpoint(e.ctx, key, tok, "s", []byte("X")), idempotency.ErrLeaseLost, "Checkpoint of an existing name by "+who)
		e.isErr(e.s.Checkpoint(e.ctx, key, tok, "x", []byte("X")), idempotency.ErrLeaseLost, "Checkpoint of a new name by "+who)
		e.checked("Store.Complete", st)
		e.isErr(e.s.Complete(e.ctx, key, tok, []byte("X"), long), idempotency.ErrLeaseLost, "Complete by "+who)
		e.checked("Store.Release", st)
		if absent {
			e.noErr(e.s.Release(e.ctx, key, tok), "Release by "+who)
		} else {
			e.isErr(e.s.Release(e.ctx, key, tok), idempotency.ErrLeaseLost, "Release by "+who)
		}
	}
}

// startedRec is a STARTED record as a case made it.
type startedRec struct {
	key     string
	fence   int64
	attempt int
	// lease is the end of the lease; a zero lease.d: it ended.
	lease, expires due
	grace          time.Duration // see expectedInfo
	cps            map[string][]byte
}

// observeStarted checks a STARTED record in state st: other tokens' writes
// are refused, a claim with another fingerprint gets Mismatch and, while
// the lease lives, one with the same fingerprint InProgress with the time
// left; Inspect describes it as the case made it.
func (e *env) observeStarted(st recState, r startedRec, earlier ...idempotency.Token) {
	e.t.Helper()
	e.othersRefused(st, r.key, false, earlier...)
	res, p := e.claimTimed(r.key, fpB, e.token(), long, long)
	e.answerIs(st, "claim with another fingerprint", res, p, expected{outcome: idempotency.OutcomeMismatch, fence: r.fence, attempt: r.attempt})
	if r.lease.d > 0 {
		res, p := e.claimTimed(r.key, fpA, e.token(), long, long)
		e.answerIs(st, "claim by another token during the lease", res, p,
			expected{outcome: idempotency.OutcomeInProgress, fence: r.fence, attempt: r.attempt, lease: r.lease})
	}
	e.infoIs(st, r.key, expectedInfo{state: idempotency.StateStarted, fence: r.fence, attempt: r.attempt,
		lease: r.lease, expires: r.expires, grace: r.grace, cps: r.cps})
}

// observeAbsent checks a record that is gone (released, or expired):
// writes are refused, but Release succeeds, whoever calls them; Inspect
// finds nothing; and a claim, even with another fingerprint, acquires a
// fresh record with a fence above prev.
func (e *env) observeAbsent(st recState, key string, prev int64, earlier ...idempotency.Token) {
	e.t.Helper()
	e.othersRefused(st, key, true, earlier...)
	e.infoIs(st, key, expectedInfo{absent: true})
	res, p := e.claimTimed(key, fpB, e.token(), long, long)
	e.answerIs(st, "claim with another fingerprint", res, p, expected{outcome: idempotency.OutcomeAcquired, above: prev, attempt: 1})
}

// observeCompleted checks a COMPLETED record: every write by another
// token is refused, and so are its holder's Renew, Checkpoint and Release,
// while its holder's repeated Complete succeeds and changes nothing;
// claims replay the result, to anyone, without checkpoints, but not to
// another fingerprint; Inspect describes it as the case made it.
func (e *env) observeCompleted(key string, fence int64, attempt int, result []byte, expires due, holder idempotency.Token, earlier ...idempotency.Token) {
	e.t.Helper()
	st := stCompleted
	e.othersRefused(st, key, false, earlier...)
	e.checked("Store.Renew", st)
	e.isErr(e.s.Renew(e.ctx, key, holder, long), idempotency.ErrLeaseLost, "the holder's Renew of its COMPLETED record")
	e.checked("Store.Checkpoint", st)
	e.isErr(e.s.Checkpoint(e.ctx, key, holder, "s", []byte("X")), idempotency.ErrLeaseLost, "the holder's Checkpoint of its COMPLETED record")
	e.checked("Store.Release", st)
	e.isErr(e.s.Release(e.ctx, key, holder), idempotency.ErrLeaseLost, "the holder's Release of its COMPLETED record")
	e.checked("Store.Complete", st)
	e.noErr(e.s.Complete(e.ctx, key, holder, []byte("other"), 2*long), "the holder's repeated Complete, with another result and retention (it changes nothing)")

	replay := expected{outcome: idempotency.OutcomeReplay, fence: fence, attempt: attempt, result: result}
	res, p := e.claimTimed(key, fpA, e.token(), long, long)
	e.answerIs(st, "claim by another token", res, p, replay)
	res, p = e.claimTimed(key, fpA, holder, long, long)
	e.answerIs(st, "the holder's claim", res, p, replay)
	res, p = e.claimTimed(key, fpB, e.token(), long, long)
	e.answerIs(st, "claim with another fingerprint", res, p, expected{outcome: idempotency.OutcomeMismatch, fence: fence, attempt: attempt})
	e.infoIs(st, key, expectedInfo{state: idempotency.StateCompleted, fence: fence, attempt: attempt, expires: expires, result: result})
}

// testEveryState walks records through every state the contract describes
// and checks, in each, every field of every answer and every operation by
// a token that does not hold the record. A record is observed only while
// its deadlines are long (an hour): so that the many calls of an
// observation cannot outlast them; the leases meant to end are the
// shortest the store keeps, on records nothing observes until they have
// ended. So "fresh" is repeated by its holder with a shorter (but long)
// lease; "late" is taken over, with a long lease ("taken_over"); a third
// record is taken over with a short lease and then again with a long one
// ("taken_over_again"), and completes; beside them, one is held late by
// its holder, one is released, one expires STARTED and one COMPLETED.
func testEveryState(e *env) {
	cpsA := map[string][]byte{"s": []byte("A1")}

	// Fresh, then repeated by its holder with a shorter lease, which sets
	// the lease anew.
	f, tokF := e.key("states-fresh"), e.token()
	a, p := e.claimTimed(f, fpA, tokF, long, long)
	e.answerIs(stFresh, "claim of an absent key", a, p, expected{outcome: idempotency.OutcomeAcquired, attempt: 1})
	e.checkpoint(f, tokF, "s", []byte("A1"))
	e.observeStarted(stFresh, startedRec{key: f, fence: a.Fence, attempt: 1, lease: due{p, long}, expires: due{p, 2 * long}, cps: cpsA})
	res, p := e.claimTimed(f, fpA, tokF, long/2, long)
	e.answerIs(stRepeated, "the holder's repeated claim, with a shorter lease", res, p,
		expected{outcome: idempotency.OutcomeAcquired, fence: a.Fence, attempt: 1, cps: cpsA})
	e.observeStarted(stRepeated, startedRec{key: f, fence: a.Fence, attempt: 1, lease: due{p, long / 2}, expires: due{p, long/2 + long}, cps: cpsA})

	// Records whose deadlines end before the next step.
	type rec struct {
		key string
		tok idempotency.Token
		res idempotency.ClaimResult
		set span
	}
	claim := func(name string, lease, grace time.Duration, cp bool) rec {
		r := rec{key: e.key("states-" + name), tok: e.token()}
		r.set = e.timed(func() { r.res = e.acquire(r.key, fpA, r.tok, lease, grace) })
		if cp {
			e.checkpoint(r.key, r.tok, "s", []byte("A1"))
		}
		return r
	}
	late := claim("late", e.short, long, true)              // late, then taken over
	lateHolder := claim("late-holder", e.short, long, true) // late, then repeated by its holder
	twice := claim("twice", e.short, long, true)            // taken over twice
	exp := claim("expired", e.short, 0, false)              // expires STARTED
	done := claim("expired-completed", long, long, true)    // expires COMPLETED
	e.complete(done.key, done.tok, []byte("r"), e.short)
	rel := claim("released", long, long, true)
	e.noErr(e.s.Release(e.ctx, rel.key, rel.tok), "Release by the holder")
	e.observeAbsent(stReleased, rel.key, rel.res.Fence, rel.tok)

	// Now those leases and records have ended.
	e.passBeyond(e.short)
	e.observeStarted(stLate, startedRec{key: late.key, fence: late.res.Fence, attempt: 1, expires: due{late.set, e.short + long}, grace: long, cps: cpsA})
	res, p = e.claimTimed(lateHolder.key, fpA, lateHolder.tok, long, long)
	e.answerIs(stLate, "the holder's repeated claim after its lease ended", res, p,
		expected{outcome: idempotency.OutcomeAcquired, fence: lateHolder.res.Fence, attempt: 1, cps: cpsA})
	e.observeAbsent(stExpired, exp.key, exp.res.Fence, exp.tok)
	e.observeAbsent(stExpired, done.key, done.res.Fence, done.tok)

	// B takes the late record over.
	tokB := e.token()
	b, p := e.claimTimed(late.key, fpA, tokB, long, long)
	e.answerIs(stTakenOver, "takeover of an ended lease", b, p, expected{outcome: idempotency.OutcomeAcquired, above: late.res.Fence, attempt: 2, cps: cpsA})
	e.checkpoint(late.key, tokB, "t", []byte("B1"))
	cpsB := map[string][]byte{"s": []byte("A1"), "t": []byte("B1")}
	e.observeStarted(stTakenOver, startedRec{key: late.key, fence: b.Fence, attempt: 2, lease: due{p, long}, expires: due{p, 2 * long}, cps: cpsB}, late.tok)
	res, p = e.claimTimed(late.key, fpA, tokB, long, long)
	e.answerIs(stTakenOver, "the new holder's repeated claim", res, p, expected{outcome: idempotency.OutcomeAcquired, fence: b.Fence, attempt: 2, cps: cpsB})

	// The third record is taken over for the shortest lease.
	tokB2 := e.token()
	b2, p := e.claimTimed(twice.key, fpA, tokB2, e.short, long)
	e.answerIs(stTakenOver, "takeover of an ended lease, for the shortest lease", b2, p, expected{outcome: idempotency.OutcomeAcquired, above: twice.res.Fence, attempt: 2, cps: cpsA})
	e.checkpoint(twice.key, tokB2, "t", []byte("B1"))

	// Once that lease has ended, C takes it over again, and completes.
	e.passBeyond(e.short)
	tokC := e.token()
	c, p := e.claimTimed(twice.key, fpA, tokC, long, long)
	e.answerIs(stTakenOverAgain, "second takeover", c, p, expected{outcome: idempotency.OutcomeAcquired, above: b2.Fence, attempt: 3, cps: cpsB})
	e.observeStarted(stTakenOverAgain, startedRec{key: twice.key, fence: c.Fence, attempt: 3, lease: due{p, long}, expires: due{p, 2 * long}, cps: cpsB}, twice.tok, tokB2)
	result := []byte("the result \x00\xff")
	p = e.timed(func() { e.complete(twice.key, tokC, result, long) })
	e.observeCompleted(twice.key, c.Fence, 3, result, due{p, long}, tokC, twice.tok, tokB2)
}
