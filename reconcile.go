package idempotency

import (
	"context"
	"errors"
	"fmt"
)

// A record can be left STARTED by a holder that died: a retry takes it
// over once the lease ends, but a key nobody retries stays in limbo, and
// its effect may have happened (the gateway charged, the response was
// lost). Reconcile finds such records and hands each to a resolver that
// finds out what happened (typically: asks the payment gateway by the
// downstream key) and records it, under the same rules as a takeover.

// Resolution is a resolver's decision about a stuck record: made by
// [CompleteWith], [FailWith] or [ReleaseForRetry].
type Resolution[T any] struct {
	kind  resolutionKind
	value T
	err   error
}

type resolutionKind uint8

const (
	resolveComplete resolutionKind = iota + 1
	resolveFail
	resolveRelease
	// Outcomes of reconcileOne that are not a resolution.
	outcomeLeft    // the resolver did not decide
	outcomeSkipped // the record was not stuck any more
	outcomeFailed  // a store call failed
)

// CompleteWith records v as the result of the stuck request, as if its fn
// had returned it: every retry gets v replayed.
func CompleteWith[T any](v T) Resolution[T] { return Resolution[T]{kind: resolveComplete, value: v} }

// FailWith records err as the permanent error of the stuck request (the
// effect did not happen and must not be tried again): every retry gets it
// replayed as a [*StoredError].
func FailWith[T any](err error) Resolution[T] {
	if err == nil {
		err = errors.New("idempotency: failed by the reconciler")
	}
	return Resolution[T]{kind: resolveFail, err: err}
}

// ReleaseForRetry deletes the stuck record, so that the client's next
// retry runs fn again: for a record whose effect is known not to have
// happened.
func ReleaseForRetry[T any]() Resolution[T] { return Resolution[T]{kind: resolveRelease} }

// StuckRecord is what a resolver gets: the stuck record, now held by the
// reconciler.
type StuckRecord struct {
	// Scope and Key are the request's scope parts and client key.
	Scope []string
	Key   string
	// Listed is the record as [Runner.Stuck] listed it, before the
	// reconciler took it over.
	Listed RecordInfo
	// Fence and Attempt are the reconciler's own, after the takeover.
	Fence   int64
	Attempt int
	// Checkpoints are the recovery points the crashed holder recorded
	// ([Step]): which steps it finished, and their results.
	Checkpoints map[string][]byte
}

// ReconcileReport counts what [Reconcile] did.
type ReconcileReport struct {
	// Listed is how many stuck records were listed.
	Listed int
	// Completed and Failed count the records completed with a value or a
	// permanent error; Released those deleted for a retry.
	Completed, Failed, Released int
	// Left counts the records whose resolver returned an error (or
	// panicked): they stay STARTED, their lease runs out, and a later pass
	// lists them again.
	Left int
	// Skipped counts the records that changed between the listing and the
	// takeover (a retry took them over, completed or released them): they
	// are not stuck any more.
	Skipped int
	// Errors counts the records whose store calls failed.
	Errors int
}

// errRelease and forcedPermanent carry a resolution through [run];
// leaveError carries a resolver's error.
var errRelease = errors.New("idempotency: released by the reconciler")

type forcedPermanent struct{ err error }

func (e *forcedPermanent) Error() string { return e.err.Error() }
func (e *forcedPermanent) Unwrap() error { return e.err }
func (e *forcedPermanent) Is(target error) bool {
	return target == ErrPermanent
}

type leaveError struct{ err error }

func (e *leaveError) Error() string { return "idempotency: resolver: " + e.err.Error() }
func (e *leaveError) Unwrap() error { return e.err }

// Reconcile resolves up to limit stuck records of r's store (see
// [Runner.Stuck]): for each, it takes the record over exactly as a retry
// would (a Claim with the record's fingerprint and a new token, which
// acquires only if the lease has ended, with a greater fence), then calls
// resolve under that lease, with the heartbeat renewing it. The context
// resolve gets works with [FromContext], [DownstreamKey] and [Step].
// resolve decides with [CompleteWith], [FailWith] or [ReleaseForRetry];
// an error, or a panic (which goes on), leaves the record to its lease.
// A record that a retry takes over, completes or releases first is
// skipped, so the reconciler never races a live holder or a retry into two
// effects.
//
// Records are resolved one after another. The error joins the errors of
// the listing and of the records that failed (at most ten); the report
// counts every outcome. The store must implement [Inspector].
func Reconcile[T any](ctx context.Context, r *Runner, limit int, resolve func(ctx context.Context, s StuckRecord) (Resolution[T], error)) (ReconcileReport, error) {
	var rep ReconcileReport
	switch {
	case r == nil:
		return rep, invalidArg("Reconcile: nil runner")
	case resolve == nil:
		return rep, invalidArg("Reconcile: nil resolver")
	case limit <= 0:
		return rep, invalidArg("Reconcile: limit must be positive, got %d", limit)
	}
	var errs []error
	note := func(err error) {
		if len(errs) < 10 {
			errs = append(errs, err)
		}
	}
	cursor := ""
	for rep.Listed < limit {
		infos, next, err := r.Stuck(ctx, cursor, min(limit-rep.Listed, 100))
		if err != nil {
			note(err)
			break
		}
		for _, info := range infos {
			kind, err := reconcileOne(ctx, r, info, resolve)
			if err = rep.count(info.Key, kind, err); err != nil {
				note(err)
			}
			if ctx.Err() != nil {
				return rep, errors.Join(append(errs, ctx.Err())...)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	return rep, errors.Join(errs...)
}

// count adds the record under key, resolved as kind, to the report, and
// returns the error to report for it.
func (rep *ReconcileReport) count(key string, kind resolutionKind, err error) error {
	rep.Listed++
	switch kind {
	case outcomeFailed:
		rep.Errors++
		return err
	case outcomeLeft:
		rep.Left++
		return fmt.Errorf("%q left stuck: %w", key, err)
	case resolveComplete:
		rep.Completed++
	case resolveFail:
		rep.Failed++
	case resolveRelease:
		rep.Released++
	default:
		rep.Skipped++
	}
	return nil
}

// ReconcileKey resolves the one record of req's scope and key (its
// fingerprint is not used) as [Reconcile] resolves each record it lists,
// for an operator who found out by hand what happened downstream (see
// idemctl's complete and release): when the record is stuck (STARTED,
// its lease ended), it takes it over as a retry would (only an ended
// lease, with a greater fence) and hands it to resolve under that lease.
// The report counts the record as Reconcile would: Listed is 0 when the
// record was not stuck when inspected (a live lease, or COMPLETED), and
// Skipped 1 when a retry took it over, completed or released it before
// the takeover. It returns an error wrapping [ErrNotFound] when there is
// no record, [ErrInvalidKey] for an invalid key, and the resolver's or
// the store's error as Reconcile does. The store must implement
// [Inspector].
func ReconcileKey[T any](ctx context.Context, r *Runner, req Request, resolve func(ctx context.Context, s StuckRecord) (Resolution[T], error)) (ReconcileReport, error) {
	var rep ReconcileReport
	switch {
	case r == nil:
		return rep, invalidArg("ReconcileKey: nil runner")
	case resolve == nil:
		return rep, invalidArg("ReconcileKey: nil resolver")
	}
	info, err := r.Inspect(ctx, req, false)
	if err != nil {
		return rep, err
	}
	if info.State != StateStarted || info.LeaseLeft > 0 {
		return rep, nil
	}
	kind, err := reconcileOne(ctx, r, info, resolve)
	return rep, rep.count(info.Key, kind, err)
}

// reconcileOne takes info's record over and resolves it. It returns the
// resolution carried out, or outcomeSkipped, outcomeLeft (with the
// resolver's error) or outcomeFailed (with the store's).
func reconcileOne[T any](ctx context.Context, r *Runner, info RecordInfo, resolve func(ctx context.Context, s StuckRecord) (Resolution[T], error)) (resolutionKind, error) {
	scope, key, err := ParseStorageKey(info.Key)
	if err != nil {
		return outcomeFailed, err
	}
	claim := ClaimRequest{Key: info.Key, Fingerprint: info.Fingerprint, Token: newToken(), Lease: r.cfg.lease, Grace: r.cfg.grace}
	start := monoNow()
	var cr ClaimResult
	err = r.retry(ctx, func(ctx context.Context) error {
		var err error
		cr, err = r.store.Claim(ctx, claim)
		return err
	})
	if err != nil {
		r.observe(ctx, Event{Outcome: OutcomeStoreError, Key: info.Key, Scope: scope, Duration: start.since(), Err: err})
		return outcomeFailed, &StoreError{Op: "claim", Err: err}
	}
	if cr.Outcome != OutcomeAcquired {
		return outcomeSkipped, nil
	}
	r.observe(ctx, Event{Outcome: OutcomeAcquired, Key: info.Key, Scope: scope, Fence: cr.Fence, Attempt: cr.Attempt, Duration: start.since()})
	h := &holder{parent: ctx, r: r, key: info.Key, scope: scope, clientKey: key, token: claim.Token,
		fence: cr.Fence, attempt: cr.Attempt, points: cr.Checkpoints, attempts: int32(r.cfg.storeAttempts), leaveOnPanic: true}
	var kind resolutionKind
	_, err = run(ctx, h, start, Result[T]{}, func(ctx context.Context) (T, error) {
		var zero T
		res, err := resolve(ctx, StuckRecord{Scope: scope, Key: key, Listed: info,
			Fence: cr.Fence, Attempt: cr.Attempt, Checkpoints: cloneCheckpoints(cr.Checkpoints)})
		switch {
		case err != nil:
			return zero, &leaveError{err}
		case res.kind == 0:
			return zero, &leaveError{errors.New("no resolution (use CompleteWith, FailWith or ReleaseForRetry)")}
		}
		kind = res.kind
		switch res.kind {
		case resolveFail:
			return zero, &forcedPermanent{res.err}
		case resolveRelease:
			return zero, errRelease
		}
		return res.value, nil
	})
	var le *leaveError
	switch {
	case errors.As(err, &le):
		return outcomeLeft, le.err
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrStore):
		return outcomeFailed, err
	case err == nil, kind == resolveFail && errors.Is(err, ErrPermanent), kind == resolveRelease && errors.Is(err, errRelease):
		return kind, nil
	}
	return outcomeFailed, err
}

func cloneCheckpoints(m map[string][]byte) map[string][]byte {
	if m == nil {
		return nil
	}
	c := make(map[string][]byte, len(m))
	for k, v := range m {
		c[k] = append([]byte(nil), v...)
	}
	return c
}
