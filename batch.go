package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// BatchResult is one item's answer of [DoBatch]: what [Do] would have
// returned for it.
type BatchResult[T any] struct {
	Result[T]
	Err error
}

// DoBatch runs fn for each of reqs at most once, with every guarantee of
// [Do] per item, and returns one answer per request, in order. A consumer
// that receives hundreds of messages per poll pays two store round trips
// for the whole batch instead of two per message: the claims of every item
// go to the store in one call, and the completions and releases in one
// more, through the store's [Batcher] (a store without one gets one call
// per item, with the same answers).
//
// fn(ctx, i) runs for the items acquired, one after another in request
// order; ctx is item i's as Do gives it to fn ([FromContext],
// [DownstreamKey] and [Step] work in it, and it is canceled with cause
// [ErrLeaseLost] if item i's lease is lost). Every item acquired holds its
// lease, renewed by the heartbeat, from the claim until its completion:
// fn's of later items may run long. Items are independent:
//
//   - each is answered as Do answers it (Result.Outcome, the error); an
//     invalid key fails its item only ([ErrInvalidKey]);
//   - fn's error for one item releases or stores that item only, by the
//     error policy; a store failure for one item fails that item only;
//   - items with the same storage key (the same scope and key) are one
//     request: fn runs once, for the first, and the others get its answer
//     (Replayed, Ran false); one with another fingerprint gets
//     [ErrMismatch];
//   - a concurrent duplicate of an item (another call holding its lease)
//     gets [ErrInProgress] at once: a batch never waits ([WithWait] is not
//     applied), so that one busy key does not hold the rest of the batch.
//
// A crash in the middle of a batch leaves the items whose completion landed
// replayable and the rest STARTED, taken over once their lease ends. A
// panic in fn stops the batch: the items that ran before are completed,
// the item that panicked and those not run yet are released, and the panic
// goes on. A batch larger than the store takes at once ([Limits] MaxBatch)
// is sent in several calls. In a transaction of the caller's
// ([Transactional]) the items run one by one, as calls of Do, so that each
// keeps its own savepoints.
//
// A runner's [CallObserver] sees each item as a call of its own; the
// batch's store calls are made with ctx, outside the items' spans.
func DoBatch[T any](ctx context.Context, r *Runner, reqs []Request, fn func(ctx context.Context, i int) (T, error)) []BatchResult[T] {
	out := make([]BatchResult[T], len(reqs))
	var bad error
	switch {
	case r == nil:
		bad = invalidArg("nil runner")
	case fn == nil:
		bad = invalidArg("nil fn")
	case ctx == nil:
		bad = invalidArg("nil context")
	}
	if bad != nil {
		for i := range out {
			out[i].Err = bad
		}
		return out
	}
	if r.caps.Transactional != nil && r.caps.Transactional.InTx(ctx) {
		for i, req := range reqs {
			out[i].Result, out[i].Err = Do(ctx, r, req, func(ctx context.Context) (T, error) { return fn(ctx, i) })
		}
		return out
	}
	size := len(reqs)
	if m := r.caps.Limits.MaxBatch; m > 0 {
		size = m
	}
	for start := 0; start < len(reqs); start += size {
		b := &batch[T]{r: r, ctx: ctx, reqs: reqs, out: out, fn: fn, lo: start, hi: min(start+size, len(reqs))}
		b.run()
	}
	return out
}

// batch is one chunk of a DoBatch: reqs[lo:hi].
type batch[T any] struct {
	r      *Runner
	ctx    context.Context
	reqs   []Request
	out    []BatchResult[T]
	fn     func(ctx context.Context, i int) (T, error)
	lo, hi int

	items []*batchItem[T] // the leaders: the first item of each storage key
	// calls are the observer's views of the items, by index from lo; nil
	// without a CallObserver.
	calls []batchCall
}

// batchCall is what the CallObserver gets of one item.
type batchCall struct {
	ctx  context.Context
	call Call
}

// batchItem is the first item of a storage key in a batch, and the others
// with the same key.
type batchItem[T any] struct {
	i         int // index in reqs
	key       string
	callCtx   context.Context // the CallObserver's, or the batch's
	claim     ClaimRequest
	cr        ClaimResult
	h         *holder // when acquired
	fnCtx     context.Context
	start     mono
	followers []int

	ran   bool
	skip  error // why fn did not run, for an item held but not run
	v     T
	fnErr error
}

func (b *batch[T]) run() {
	b.prepare()
	defer b.endCalls()

	// Claims: one store call for every item, repeated for the items whose
	// error may be transient, with the same tokens.
	var pending []*batchItem[T]
	for _, it := range b.items {
		if !b.answered(it) {
			pending = append(pending, it)
		}
	}
	b.claimAll(pending)

	var held []*batchItem[T]
	for _, it := range pending {
		if b.decide(it) {
			held = append(held, it)
		}
	}
	if len(held) == 0 {
		return
	}
	for _, it := range held {
		// Every item's context exists before its heartbeat starts: a
		// heartbeat that loses the lease cancels it, even before fn runs.
		var cancel context.CancelCauseFunc
		it.fnCtx, cancel = context.WithCancelCause(it.h)
		it.h.cancel = cancel
		defer cancel(nil)
		it.h.startHeartbeat(it.start)
	}
	ran := 0
	defer func() {
		if ran == len(held) {
			return
		}
		// fn panicked: finish what ran, release the rest, and let the
		// panic go on.
		held[ran].ran, held[ran].skip = false, ErrFnPanicked
		if c := b.call(held[ran].i); c != nil {
			c.call.Err = ErrFnPanicked
		}
		for _, it := range held[ran+1:] {
			it.skip = errors.New("idempotency: not run: an earlier item of the batch panicked")
		}
		b.finish(held)
	}()
	for _, it := range held {
		b.runFn(it)
		ran++
	}
	b.finish(held)
}

// call returns item i's view for the CallObserver, or nil.
func (b *batch[T]) call(i int) *batchCall {
	if b.calls == nil {
		return nil
	}
	return &b.calls[i-b.lo]
}

// prepare validates every request, groups those with the same storage key
// under their first, and starts the calls the observer sees.
func (b *batch[T]) prepare() {
	r := b.r
	if co := r.cfg.calls; co != nil {
		b.calls = make([]batchCall, b.hi-b.lo)
		for i := b.lo; i < b.hi; i++ {
			b.calls[i-b.lo] = batchCall{ctx: co.StartCall(b.ctx, b.reqs[i].Scope), call: Call{Scope: b.reqs[i].Scope}}
		}
	}
	leaders := make(map[string]*batchItem[T], b.hi-b.lo)
	for i := b.lo; i < b.hi; i++ {
		req := b.reqs[i]
		callCtx := b.ctx
		if c := b.call(i); c != nil {
			callCtx = c.ctx
		}
		key, err := r.StorageKey(req)
		if err != nil {
			b.out[i].Outcome, b.out[i].Err = OutcomeInvalidKey, err
			r.observe(callCtx, Event{Outcome: OutcomeInvalidKey, Scope: req.Scope, Err: err})
			continue
		}
		if it, ok := leaders[key]; ok {
			it.followers = append(it.followers, i)
			continue
		}
		it := &batchItem[T]{i: i, key: key, callCtx: callCtx,
			claim: ClaimRequest{Key: key, Fingerprint: req.Fingerprint, Token: newToken(), Lease: r.cfg.lease, Grace: r.cfg.grace}}
		leaders[key] = it
		b.items = append(b.items, it)
	}
}

// answered answers it from the replay cache, and reports whether it did.
func (b *batch[T]) answered(it *batchItem[T]) bool {
	if b.r.cache == nil {
		return false
	}
	e, ok := b.r.cache.get(it.key)
	if !ok {
		return false
	}
	b.out[it.i].Result, b.out[it.i].Err = replayCached[T](it.callCtx, b.r, b.reqs[it.i], e)
	return true
}

// claimAll claims the items, through the store's Batcher or one call each,
// attempting again those whose error may be transient.
func (b *batch[T]) claimAll(items []*batchItem[T]) {
	r := b.r
	reqs := make([]ClaimRequest, len(items))
	for j, it := range items {
		reqs[j] = it.claim
		it.start = monoNow()
	}
	errs := make([]error, len(items))
	b.attempts(len(items), errs, func(ctx context.Context, idx []int) []error {
		sub := make([]ClaimRequest, len(idx))
		for k, j := range idx {
			sub[k] = reqs[j]
		}
		var results []ClaimResult
		var ferrs []error
		if bt := r.caps.Batcher; bt != nil {
			results, ferrs = bt.ClaimBatch(ctx, sub)
		} else {
			// One call per item, each bounded by the store timeout as a
			// call of Do is: not the batch's one attempt for them all.
			results, ferrs = make([]ClaimResult, len(sub)), make([]error, len(sub))
			for k, req := range sub {
				_ = r.attempt(b.ctx, nil, func(ctx context.Context) error {
					results[k], ferrs[k] = r.store.Claim(ctx, req)
					return nil
				})
			}
		}
		if len(results) != len(sub) || len(ferrs) != len(sub) {
			err := fmt.Errorf("store's ClaimBatch returned %d results and %d errors for %d claims", len(results), len(ferrs), len(sub))
			ferrs = make([]error, len(sub))
			for k := range ferrs {
				ferrs[k] = err
			}
			return ferrs
		}
		for k, j := range idx {
			if ferrs[k] == nil {
				items[j].cr = results[k]
			}
		}
		return ferrs
	})
	for j, it := range items {
		if errs[j] != nil {
			it.cr = ClaimResult{}
			b.claimFailed(it, errs[j])
		}
	}
}

// attempts calls call with the indexes of the n items not yet done, up to
// the runner's store attempts, each bounded by the store timeout, keeping
// in errs the last error of each item; an item whose error is not worth
// repeating (a definite answer, the caller's context done) is done.
func (b *batch[T]) attempts(n int, errs []error, call func(ctx context.Context, idx []int) []error) {
	r := b.r
	idx := make([]int, n)
	for j := range idx {
		idx[j] = j
	}
	backoff := min(r.cfg.storeBackoff, maxStoreBackoff)
	for attempt := 1; len(idx) > 0; attempt++ {
		var got []error
		_ = r.attempt(b.ctx, nil, func(ctx context.Context) error {
			got = call(ctx, idx)
			return nil
		})
		var again []int
		for k, j := range idx {
			errs[j] = got[k]
			if got[k] != nil && attempt < r.cfg.storeAttempts && Retryable(b.ctx, got[k]) {
				again = append(again, j)
			}
		}
		idx = again
		if len(idx) == 0 {
			return
		}
		d := time.Duration(rand.Int64N(int64(backoff) + 1))
		backoff = min(2*backoff, maxStoreBackoff)
		t := time.NewTimer(d)
		select {
		case <-b.ctx.Done():
			t.Stop()
			for _, j := range idx {
				errs[j] = errors.Join(b.ctx.Err(), errs[j])
			}
			return
		case <-t.C:
		}
	}
}

func (b *batch[T]) claimFailed(it *batchItem[T], err error) {
	o := &b.out[it.i]
	o.Outcome, o.Err = OutcomeStoreError, &StoreError{Op: "claim", Err: err}
	b.r.observe(it.callCtx, Event{Outcome: OutcomeStoreError, Key: it.key, Scope: b.reqs[it.i].Scope, Duration: it.start.since(), Err: err})
}

// decide answers it from its claim, or makes its holder and reports true
// when it acquired.
func (b *batch[T]) decide(it *batchItem[T]) bool {
	r, cr := b.r, it.cr
	o := &b.out[it.i]
	if o.Err != nil {
		return false // the claim failed
	}
	req := b.reqs[it.i]
	o.Fence, o.Attempt = cr.Fence, cr.Attempt
	ev := Event{Key: it.key, Scope: req.Scope, Fence: cr.Fence, Attempt: cr.Attempt, Duration: it.start.since()}
	switch cr.Outcome {
	case OutcomeAcquired:
		ev.Outcome = OutcomeAcquired
		r.observe(it.callCtx, ev)
		it.h = &holder{parent: it.callCtx, r: r, key: it.key, scope: req.Scope, clientKey: req.Key, fingerprint: req.Fingerprint,
			token: it.claim.Token, fence: cr.Fence, attempt: cr.Attempt, points: cr.Checkpoints, attempts: int32(r.cfg.storeAttempts)}
		return true
	case OutcomeReplay:
		o.Err = replayClaim(r, &o.Result, it.start, it.key, req.Fingerprint, cr)
		ev.Outcome, ev.Err = o.Outcome, o.Err
	case OutcomeMismatch:
		o.Outcome, o.Err = OutcomeMismatch, ErrMismatch
		ev.Outcome = OutcomeMismatch
	case OutcomeInProgress:
		o.Outcome, o.RetryAfter, o.Err = OutcomeInProgress, cr.RetryAfter, &InProgressError{RetryAfter: cr.RetryAfter}
		ev.Outcome = OutcomeInProgress
	default:
		err := fmt.Errorf("store returned invalid outcome %v", cr.Outcome)
		o.Outcome, o.Err = OutcomeStoreError, &StoreError{Op: "claim", Err: err}
		ev.Outcome, ev.Err = OutcomeStoreError, err
	}
	r.observe(it.callCtx, ev)
	return false
}

// runFn runs fn for one acquired item. A panic goes on to run's caller,
// after run's deferred finish.
func (b *batch[T]) runFn(it *batchItem[T]) {
	if it.h.wasLost() {
		// Taken over (or not renewable) while earlier items ran: another
		// holder may run it now.
		it.skip = ErrLeaseLost
		return
	}
	it.ran = true
	b.out[it.i].Ran = true
	if c := b.call(it.i); c != nil {
		c.call.Ran = true
		start := time.Now()
		defer func() { c.call.FnDuration = time.Since(start) }()
	}
	it.v, it.fnErr = b.fn(it.fnCtx, it.i)
}

// finish completes or releases every held item in one store call (and
// one more for the results the store refused as too large), stopping
// their heartbeats once it is done.
func (b *batch[T]) finish(held []*batchItem[T]) {
	r := b.r
	type op struct {
		it     *batchItem[T]
		f      Finish
		encErr error
	}
	var ops []op
	for _, it := range held {
		if it.ran && it.fnErr != nil {
			if o, leave := leavesRecord(it.fnErr); leave {
				it.h.stopHeartbeat()
				b.out[it.i].Outcome, b.out[it.i].Err = o, it.fnErr
				continue
			}
		}
		var f Finish
		var encErr error
		if !it.ran {
			f = Finish{Key: it.key, Token: it.claim.Token, Release: true}
		} else {
			stored, keep, e := encodeOutcome(r, it.v, it.fnErr)
			encErr = e
			if keep {
				f = Finish{Key: it.key, Token: it.claim.Token, Result: stored, Retention: r.cfg.retention}
			} else {
				f = Finish{Key: it.key, Token: it.claim.Token, Release: true}
			}
		}
		ops = append(ops, op{it: it, f: f, encErr: encErr})
	}
	if len(ops) == 0 {
		return
	}
	// The store calls after fn must happen even when the caller's context
	// is canceled, but not for longer than the leases could hold.
	after := &boundedCtx{values: b.ctx, deadline: monoNow().add(r.cfg.lease)}
	defer after.stop()
	fb := &batch[T]{r: r, ctx: after}
	finishAll := func(ops []op) []error {
		errs := make([]error, len(ops))
		fb.attempts(len(ops), errs, func(ctx context.Context, idx []int) []error {
			sub := make([]Finish, len(idx))
			for k, j := range idx {
				sub[k] = ops[j].f
			}
			if bt := r.caps.Batcher; bt != nil {
				got := bt.FinishBatch(ctx, sub)
				if len(got) != len(sub) {
					err := fmt.Errorf("store's FinishBatch returned %d errors for %d items", len(got), len(sub))
					got = make([]error, len(sub))
					for k := range got {
						got[k] = err
					}
				}
				return got
			}
			got := make([]error, len(sub))
			for k, f := range sub {
				got[k] = r.attempt(fb.ctx, nil, func(ctx context.Context) error {
					if f.Release {
						return r.store.Release(ctx, f.Key, f.Token)
					}
					return r.store.Complete(ctx, f.Key, f.Token, f.Result, f.Retention)
				})
			}
			return got
		})
		return errs
	}
	sent := monoNow()
	errs := finishAll(ops)
	// A result the store refused as too large: the marker instead, so that
	// fn is never run again for it.
	var again []op
	var at []int
	for j, o := range ops {
		if errors.Is(errs[j], ErrTooLarge) && !o.f.Release && o.it.fnErr == nil {
			o.encErr, o.f.Result = errs[j], []byte{resultNotStored}
			ops[j] = o
			again, at = append(again, o), append(at, j)
		}
	}
	if len(again) > 0 {
		for k, err := range finishAll(again) {
			errs[at[k]] = err
		}
	}
	for j, o := range ops {
		o.it.h.stopHeartbeat()
		b.settle(o.it, o.f, o.encErr, errs[j], sent)
	}
}

// settle records an item's answer after its completion or release, as
// [run] does for a call of Do.
func (b *batch[T]) settle(it *batchItem[T], f Finish, encErr, err error, sent mono) {
	r, h := b.r, it.h
	out := &b.out[it.i]
	lost := h.wasLost() || errors.Is(err, ErrLeaseLost)
	ev := Event{Key: it.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: it.start.since()}
	switch {
	case !it.ran:
		out.Ran = false
		out.Outcome, out.Err = OutcomeReleased, it.skip
		ev.Outcome, ev.Err = OutcomeReleased, it.skip
		switch {
		case lost:
			out.Outcome, ev.Outcome = OutcomeLeaseLost, OutcomeLeaseLost
			if errors.Is(it.skip, ErrLeaseLost) {
				out.Err = fmt.Errorf("%w: taken over before its turn in the batch; not run", ErrLeaseLost)
			}
		case err != nil:
			out.Outcome, ev.Outcome, ev.Err = OutcomeStoreError, OutcomeStoreError, err
		}
	case f.Release:
		ev.Outcome, ev.Err = OutcomeReleased, it.fnErr
		out.Outcome, out.Err = OutcomeReleased, it.fnErr
		switch {
		case lost:
			out.Outcome, out.Err = OutcomeLeaseLost, fmt.Errorf("%w: %w", ErrLeaseLost, it.fnErr)
			ev.Outcome, ev.Err = OutcomeLeaseLost, err
		case err != nil:
			out.Outcome = OutcomeStoreError
			ev.Outcome, ev.Err = OutcomeStoreError, err
		}
	case lost:
		out.Outcome = OutcomeLeaseLost
		out.Err = fmt.Errorf("%w: fn ran but its result was not recorded", ErrLeaseLost)
		if it.fnErr != nil {
			out.Err = fmt.Errorf("%w: %w", ErrLeaseLost, it.fnErr)
		}
		out.Value = it.v
		ev.Outcome, ev.Err = OutcomeLeaseLost, err
	case err != nil:
		out.Outcome, out.Value = OutcomeStoreError, it.v
		out.Err = &StoreError{Op: "complete", Ran: true, Err: err}
		ev.Outcome, ev.Err = OutcomeStoreError, err
	default:
		out.Outcome, out.Err = OutcomeCompleted, it.fnErr
		if it.fnErr == nil {
			out.Value = it.v
		}
		out.ExpiresAt = h.completed(f.Result, sent)
		ev.Outcome, ev.Err = OutcomeCompleted, encErr
	}
	r.observe(it.callCtx, ev)
}

// endCalls gives the items with the same key as an earlier one that
// one's answer, and ends the calls the observer sees.
func (b *batch[T]) endCalls() {
	for _, it := range b.items {
		lead := b.out[it.i]
		for _, i := range it.followers {
			o := &b.out[i]
			o.Result, o.Err = lead.Result, lead.Err
			o.Ran = false
			switch {
			case b.reqs[i].Fingerprint != b.reqs[it.i].Fingerprint && lead.Outcome != OutcomeMismatch:
				o.Result = Result[T]{Outcome: OutcomeMismatch, Fence: lead.Fence, Attempt: lead.Attempt}
				o.Err = ErrMismatch
			case lead.Outcome == OutcomeCompleted:
				o.Outcome, o.Replayed = OutcomeReplay, true
			}
		}
	}
	co := b.r.cfg.calls
	if co == nil {
		return
	}
	for i := b.lo; i < b.hi; i++ {
		c, res := b.call(i), b.out[i]
		call := c.call
		if call.Err != ErrFnPanicked {
			call.Err = res.Err
		}
		call.Outcome, call.Replayed, call.Fence, call.Attempt = res.Outcome, res.Replayed, res.Fence, res.Attempt
		co.EndCall(c.ctx, call)
	}
}
