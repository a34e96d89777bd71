package conformancetest

import (
	"fmt"
	"slices"
	"time"

	"github.com/exactlyonce/idempotency"
)

// probe is one check of testDurationsAsDeclared, made at a planned time.
type probe struct {
	at  time.Time // by e.now
	run func()
}

// testDurationsAsDeclared checks the store's durations against what its
// Limits declare (idempotency.CapabilitiesOf). Every duration is no whole
// number of seconds, nor of the case's unit, and on the controlled clock
// the case starts off a whole second: a lease, a grace, a retention, a
// renewed lease and the declared MinLease must each last no less than
// asked (the record still holds a moment before its end, counted from the
// start of the call that set it) and no more than the declared Resolution
// longer (it is over once that and a margin passed, counted from the end
// of that call), and a claim during a lease must be told the time left.
func testDurationsAsDeclared(e *env) {
	u := e.unit
	odd := (u / 3).Round(time.Millisecond)
	lease, grace, retention, renewed := 2*u+odd, u+odd, 2*u+odd, u+2*odd
	// early is how long before a deadline the record must still hold, late
	// how long after it it must be over.
	early, late := time.Millisecond, e.tol+e.slack
	if !e.caps.ControlledClock {
		early = e.slack
	}
	res := "no Resolution (a millisecond or finer)"
	if e.feat.resolution > 0 {
		res = fmt.Sprintf("a Resolution of %v", e.feat.resolution)
	}
	declared := fmt.Sprintf("the store declares %s: a duration may end up to that much later than asked, never sooner", res)
	if m := e.feat.minLease; m > 0 {
		declared += fmt.Sprintf("; and a MinLease of %v, which it keeps faithfully", m)
	}
	var probes []probe

	// A lease, from a claim and from a Renew, and the declared MinLease.
	type leaseCheck struct {
		name  string
		lease time.Duration
		renew bool // set by a Renew after a claim of a long lease
	}
	leases := []leaseCheck{{"lease", lease, false}, {"renewed", renewed, true}}
	if m := e.feat.minLease; m > 0 {
		leases = append(leases, leaseCheck{"min-lease", m, false})
	}
	for _, l := range leases {
		k, tok := e.key("durations-"+l.name), e.token()
		var first idempotency.ClaimResult
		how := fmt.Sprintf("a claim's lease of %v", l.lease)
		var set span
		if l.renew {
			first = e.acquire(k, fpA, tok, long, long)
			set = e.timed(func() { e.noErr(e.s.Renew(e.ctx, k, tok, l.lease), fmt.Sprintf("Renew(%v)", l.lease)) })
			how = fmt.Sprintf("a lease renewed for %v", l.lease)
		} else {
			set = e.timed(func() { first = e.acquire(k, fpA, tok, l.lease, long) })
		}
		var res idempotency.ClaimResult
		p := e.timed(func() { res = e.inProgress(k, "claim by another token right after "+how) })
		if lo, hi := e.leftWithin(due{set, l.lease}, p); res.RetryAfter < lo || res.RetryAfter > hi {
			e.t.Errorf("RetryAfter %v right after %s, want within [%v, %v]: %s", res.RetryAfter, how, lo, hi, declared)
		}
		probes = append(probes,
			probe{set.from.Add(l.lease - early), func() {
				res, p := e.claimTimed(k, fpA, e.token(), long, long)
				_, hi := e.leftWithin(due{set, l.lease}, p)
				if res.Outcome != idempotency.OutcomeInProgress {
					e.t.Errorf("claim by another token %v before the end of %s: outcome %v (attempt %d), want in_progress: the lease ended sooner than asked; %s",
						early, how, res.Outcome, res.Attempt, declared)
				} else if res.RetryAfter <= 0 || res.RetryAfter > hi {
					e.t.Errorf("RetryAfter %v %v before the end of %s, want within (0, %v]: %s", res.RetryAfter, early, how, hi, declared)
				}
			}},
			probe{set.to.Add(l.lease + late), func() {
				e.takenOver(k, e.token(), first, nil, fmt.Sprintf("claim by another token %v after the end of %s (the lease must be over: %s)", late, how, declared))
			}})
	}

	// A grace: the record holds for a takeover until lease plus grace,
	// then expires. The lease is one the store keeps faithfully (at least
	// MinLease), and the grace long enough that the lease is over, even
	// its declared Resolution late, before the probe within the grace.
	gl, gg := max(u, e.short), grace+late+early
	how := fmt.Sprintf("a lease of %v and a grace of %v", gl, gg)
	for i, name := range []string{"within", "after"} {
		k, tok := e.key("durations-grace-"+name), e.token()
		var first idempotency.ClaimResult
		set := e.timed(func() { first = e.acquire(k, fpA, tok, gl, gg) })
		e.checkpoint(k, tok, "s", []byte("1"))
		if i == 0 {
			probes = append(probes, probe{set.from.Add(gl + gg - early), func() {
				e.takenOver(k, e.token(), first, map[string][]byte{"s": []byte("1")},
					fmt.Sprintf("claim %v before the end of %s (the record must still hold its checkpoints: %s)", early, how, declared))
			}})
		} else {
			probes = append(probes, probe{set.to.Add(gl + gg + late), func() {
				e.afresh(k, fpA, e.token(), first, fmt.Sprintf("claim %v after the end of %s (the record must have expired: %s)", late, how, declared))
			}})
		}
	}

	// A retention: the result replays until it ends, then the record is
	// absent.
	k, tok := e.key("durations-retention"), e.token()
	done := e.acquire(k, fpA, tok, long, long)
	set := e.timed(func() { e.complete(k, tok, []byte("r"), retention) })
	kept := fmt.Sprintf("a retention of %v", retention)
	probes = append(probes,
		probe{set.from.Add(retention - early), func() {
			e.replayEquals(k, fpA, []byte("r"), fmt.Sprintf("claim %v before the end of %s (the result must still replay: %s)", early, kept, declared))
		}},
		probe{set.to.Add(retention + late), func() {
			e.afresh(k, fpB, e.token(), done, fmt.Sprintf("claim %v after the end of %s (the record must have expired: %s)", late, kept, declared))
		}})

	slices.SortStableFunc(probes, func(a, b probe) int { return a.at.Compare(b.at) })
	for _, p := range probes {
		e.passUntil(p.at)
		p.run()
	}
}
