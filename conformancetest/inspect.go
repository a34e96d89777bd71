package conformancetest

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/exactlyonce/idempotency"
)

func needsInspector(f features) (bool, string) {
	return f.inspector != nil, "the store has no Inspector (or the test skips it)"
}

// inspector returns the store's Inspector.
func (e *env) inspector() idempotency.Inspector { return e.feat.inspector }

func (e *env) inspect(key, what string) idempotency.RecordInfo {
	e.t.Helper()
	info, err := e.inspector().Inspect(e.ctx, key)
	e.noErr(err, what)
	if info.Key != key {
		e.t.Errorf("%s: Key %s, want %s", what, short(info.Key), short(key))
	}
	return info
}

func (e *env) notFound(key, what string) {
	e.t.Helper()
	info, err := e.inspector().Inspect(e.ctx, key)
	if !errors.Is(err, idempotency.ErrNotFound) {
		e.t.Errorf("%s: Inspect = %+v, %v; want ErrNotFound", what, info, err)
	}
}

func testInspect(e *env) {
	e.notFound(e.key("absent"), "Inspect of an absent key")

	k := e.key("described")
	tok := e.token()
	lease, grace := 10*e.unit, 5*e.unit
	acq := e.acquire(k, fpA, tok, lease, grace)
	e.checkpoint(k, tok, "step", []byte("one"))
	info := e.inspect(k, "Inspect of a STARTED record")
	switch {
	case info.State != idempotency.StateStarted || info.Fingerprint != fpA:
		e.t.Errorf("STARTED record: state %q, fingerprint %q; want started, %q", info.State, info.Fingerprint, fpA)
	case info.Fence != acq.Fence || info.Attempt != 1:
		e.t.Errorf("STARTED record: fence %d, attempt %d; want the claim's %d, 1", info.Fence, info.Attempt, acq.Fence)
	case info.LeaseLeft <= lease/2 || info.LeaseLeft > lease+e.tol:
		e.t.Errorf("STARTED record: LeaseLeft %v, want the lease of %v, less the moment that passed", info.LeaseLeft, lease)
	case info.ExpiresIn < info.LeaseLeft+grace-2*e.tol || info.ExpiresIn > lease+grace+e.tol:
		e.t.Errorf("STARTED record: ExpiresIn %v with LeaseLeft %v; want the grace (%v) after the lease", info.ExpiresIn, info.LeaseLeft, grace)
	case len(info.Result) != 0:
		e.t.Errorf("STARTED record: result %s, want none", describe(info.Result))
	}
	e.checkpointsEqual(info.Checkpoints, map[string][]byte{"step": []byte("one")}, "STARTED record")
	// What Inspect returns belongs to the caller.
	for _, name := range slices.Collect(maps.Keys(info.Checkpoints)) {
		clear(info.Checkpoints[name])
		info.Checkpoints[name+"x"] = []byte("added")
	}
	e.checkpointsEqual(e.inspect(k, "second Inspect").Checkpoints, map[string][]byte{"step": []byte("one")},
		"Inspect after the caller changed the map the first returned")

	result := []byte("the result \x00\xff")
	e.complete(k, tok, result, long)
	info = e.inspect(k, "Inspect of a COMPLETED record")
	switch {
	case info.State != idempotency.StateCompleted || info.Fence != acq.Fence || info.Fingerprint != fpA:
		e.t.Errorf("COMPLETED record: state %q, fence %d, fingerprint %q; want completed, %d, %q", info.State, info.Fence, info.Fingerprint, acq.Fence, fpA)
	case !bytes.Equal(info.Result, result):
		e.t.Errorf("COMPLETED record: result %s, want %s", describe(info.Result), describe(result))
	case info.LeaseLeft != 0 || len(info.Checkpoints) != 0:
		e.t.Errorf("COMPLETED record: LeaseLeft %v, checkpoints %s; want none", info.LeaseLeft, describeMap(info.Checkpoints))
	case info.ExpiresIn <= long-lease || info.ExpiresIn > long+e.tol:
		e.t.Errorf("COMPLETED record: ExpiresIn %v, want the retention of %v", info.ExpiresIn, long)
	}
	clear(info.Result)
	if again := e.inspect(k, "Inspect after the caller changed the result"); !bytes.Equal(again.Result, result) {
		e.t.Errorf("Inspect after the caller changed the result the first returned: %s, want %s", describe(again.Result), describe(result))
	}

	expired := e.key("expired")
	e.acquire(expired, fpA, e.token(), e.unit, 0)
	e.passBeyond(e.unit)
	e.notFound(expired, "Inspect of an expired record")
}

func testPurge(e *env) {
	in := e.inspector()
	absent := e.key("absent")
	e.noErr(in.Purge(e.ctx, absent), "Purge of an absent key")
	e.noErr(in.Purge(e.ctx, absent), "Purge of an absent key, again")

	k := e.key("started")
	tok := e.token()
	acq := e.acquire(k, fpA, tok, long, long)
	e.checkpoint(k, tok, "step", []byte("done"))
	e.noErr(in.Purge(e.ctx, k), "Purge of a live STARTED record")
	e.notFound(k, "Inspect after Purge")
	e.isErr(e.s.Complete(e.ctx, k, tok, []byte("late"), long), idempotency.ErrLeaseLost, "the purged holder's Complete")
	e.isErr(e.s.Renew(e.ctx, k, tok, long), idempotency.ErrLeaseLost, "the purged holder's Renew")
	again := e.acquire(k, fpB, e.token(), long, 0)
	if again.Fence <= acq.Fence {
		e.t.Errorf("claim after Purge: fence %d, want greater than the purged record's %d", again.Fence, acq.Fence)
	}
	if len(again.Checkpoints) != 0 {
		e.t.Errorf("claim after Purge: checkpoints %s came back", describeMap(again.Checkpoints))
	}

	done := e.key("completed")
	dtok := e.token()
	first := e.acquire(done, fpA, dtok, long, 0)
	e.complete(done, dtok, []byte("r"), long)
	e.noErr(in.Purge(e.ctx, done), "Purge of a COMPLETED record")
	if next := e.acquire(done, fpA, e.token(), long, 0); next.Fence <= first.Fence {
		e.t.Errorf("claim after purging a COMPLETED record: fence %d, want greater than %d", next.Fence, first.Fence)
	}
}

func testStuck(e *env) {
	in := e.inspector()
	brief := e.unit
	want := map[string]idempotency.ClaimResult{}
	for i := range 12 {
		k := e.key("stuck-" + string(rune('a'+i)))
		want[k] = e.acquire(k, fpA, e.token(), brief, long)
	}
	e.acquire(e.key("live"), fpA, e.token(), long, long)
	done, dtok := e.key("completed"), e.token()
	e.acquire(done, fpA, dtok, brief, long)
	e.complete(done, dtok, []byte("r"), long)
	e.acquire(e.key("expired"), fpA, e.token(), brief, 0)
	renewed, rtok := e.key("renewed"), e.token()
	e.acquire(renewed, fpA, rtok, brief, long)
	e.noErr(e.s.Renew(e.ctx, renewed, rtok, long), "Renew")
	taken := e.key("taken")
	e.acquire(taken, fpA, e.token(), brief, long)
	e.passBeyond(brief)
	e.expect(e.claim(taken, fpA, e.token(), long, long), idempotency.OutcomeAcquired, "takeover")

	const limit = 5
	seen := map[string]int{}
	cursor := ""
	for page := 0; ; page++ {
		if page > 100_000 {
			e.t.Fatalf("Stuck: still listing after %d pages: the cursor does not move on", page)
		}
		infos, next, err := in.Stuck(e.ctx, cursor, limit)
		e.noErr(err, "Stuck")
		if len(infos) > limit {
			e.t.Fatalf("Stuck(limit %d) listed %d records", limit, len(infos))
		}
		for _, info := range infos {
			if !strings.HasPrefix(info.Key, e.prefix) {
				continue // another case's record, in a shared database
			}
			seen[info.Key]++
			acq, ok := want[info.Key]
			switch {
			case !ok:
				e.t.Errorf("Stuck listed %s, which is not stuck", short(info.Key))
			case info.State != idempotency.StateStarted || info.LeaseLeft != 0 || info.ExpiresIn <= 0:
				e.t.Errorf("Stuck listed %s with state %q, LeaseLeft %v, ExpiresIn %v; want started, 0, > 0", short(info.Key), info.State, info.LeaseLeft, info.ExpiresIn)
			case info.Fence != acq.Fence || info.Fingerprint != fpA || info.Attempt != 1:
				e.t.Errorf("Stuck listed %s with fence %d, fingerprint %q, attempt %d; want %d, %q, 1", short(info.Key), info.Fence, info.Fingerprint, info.Attempt, acq.Fence, fpA)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	var missing []string
	for k := range want {
		switch seen[k] {
		case 0:
			missing = append(missing, short(k))
		case 1:
		default:
			e.t.Errorf("Stuck listed %s %d times, want once", short(k), seen[k])
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		e.t.Errorf("Stuck did not list the stuck records %v", missing)
	}
}
