package otelidem

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// storeOp is a store operation, as the value of idempotency.store.operation.
type storeOp uint8

const (
	opClaim storeOp = iota
	opRenew
	opCheckpoint
	opComplete
	opRelease
	opWatch
	opInspect
	opPurge
	opStuck
	opSweep
	numStoreOps
)

var storeOpNames = [numStoreOps]string{"claim", "renew", "checkpoint", "complete", "release", "watch", "inspect", "purge", "stuck", "sweep"}

// spanNames are the store calls' span names, made once.
var spanNames = func() (n [numStoreOps]string) {
	for i, s := range storeOpNames {
		n[i] = "idempotency.store." + s
	}
	return n
}()

var internalSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}

// errorType is the value of error.type on a failed store call.
type errorType uint8

const (
	errNone errorType = iota
	errLeaseLost
	errTooLarge
	errNotFound
	errCanceled
	errDeadline
	errOther
	numErrorTypes
)

var errorTypeNames = [numErrorTypes]string{"", "lease_lost", "too_large", "not_found", "canceled", "deadline_exceeded", "_OTHER"}

func errorTypeOf(err error) errorType {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, idempotency.ErrLeaseLost):
		return errLeaseLost
	case errors.Is(err, idempotency.ErrTooLarge):
		return errTooLarge
	case errors.Is(err, idempotency.ErrNotFound):
		return errNotFound
	case errors.Is(err, context.Canceled):
		return errCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return errDeadline
	}
	return errOther
}

// Store returns s with every call timed (idempotency.store.operation.duration)
// and, when tracing is on, made a child span of the context it gets: the
// call's span under Do. The wrapper implements the optional interfaces
// that s implements, and only those ([idempotency.Watcher],
// [idempotency.Inspector], [idempotency.Sweeper]), so that the runner
// behaves as it does on s; it always implements
// [idempotency.LimitedStore], with s's limits or none.
//
// Each attempt is timed on its own: a call that the runner retries
// ([idempotency.WithStoreRetries]) is one measurement per attempt. A
// failed call has the attribute error.type: lease_lost, too_large,
// not_found (expected answers of the store contract), canceled,
// deadline_exceeded or _OTHER.
//
// The wrapper's method Unwrap() idempotency.Store returns s.
// Store(nil), or a typed nil, returns nil, which [idempotency.New] refuses.
// An execution mode that needs the adapter's own store type (the
// PostgreSQL adapter's DoTx and TxExecutor need a *postgres.Store) finds
// it through Unwrap and calls it directly, so the wrapper sees none of
// those calls; the Observer still counts them from their events.
func (o *Observer) Store(s idempotency.Store) idempotency.Store {
	if isNil(s) {
		return nil
	}
	b := &store{o: o, s: s}
	w, isW := s.(idempotency.Watcher)
	in, isI := s.(idempotency.Inspector)
	sw, isS := s.(idempotency.Sweeper)
	wp, ip, sp := watchPart{b, w}, inspectPart{b, in}, sweepPart{b, sw}
	switch {
	case isW && isI && isS:
		return struct {
			*store
			watchPart
			inspectPart
			sweepPart
		}{b, wp, ip, sp}
	case isW && isI:
		return struct {
			*store
			watchPart
			inspectPart
		}{b, wp, ip}
	case isW && isS:
		return struct {
			*store
			watchPart
			sweepPart
		}{b, wp, sp}
	case isI && isS:
		return struct {
			*store
			inspectPart
			sweepPart
		}{b, ip, sp}
	case isW:
		return struct {
			*store
			watchPart
		}{b, wp}
	case isI:
		return struct {
			*store
			inspectPart
		}{b, ip}
	case isS:
		return struct {
			*store
			sweepPart
		}{b, sp}
	}
	return b
}

// store is the wrapper's Store part.
type store struct {
	o *Observer
	s idempotency.Store
}

// start begins a store call: its span, when traced, and its clock.
func (s *store) start(ctx context.Context, op storeOp) (context.Context, trace.Span, time.Time) {
	var span trace.Span
	if s.o.tracer != nil && trace.SpanFromContext(ctx).IsRecording() {
		// Only under a span that records: a store call is never a trace
		// of its own.
		ctx, span = s.o.tracer.Start(ctx, spanNames[op], internalSpan...)
	}
	return ctx, span, time.Now()
}

// end records a store call's latency and ends its span.
func (s *store) end(ctx context.Context, op storeOp, span trace.Span, start time.Time, err error) {
	took := time.Since(start)
	et := errorTypeOf(err)
	s.o.storeLatency.Record(ctx, took.Seconds(), s.o.storeOpts[op][et]...)
	if span != nil {
		if err != nil {
			span.SetAttributes(AttrErrorType.String(errorTypeNames[et]))
			if et != errLeaseLost && et != errNotFound {
				span.SetStatus(codes.Error, err.Error())
			}
		}
		span.End()
	}
}

func (s *store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	sctx, span, t := s.start(ctx, opClaim)
	cr, err := s.s.Claim(sctx, r)
	if span != nil && err == nil {
		span.SetAttributes(attrClaimOutcome.String(cr.Outcome.String()), AttrFence.Int64(cr.Fence), AttrAttempt.Int(cr.Attempt))
	}
	s.end(ctx, opClaim, span, t, err)
	return cr, err
}

// attrClaimOutcome is the outcome a claim's span reports.
const attrClaimOutcome = attribute.Key("idempotency.claim.outcome")

func (s *store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	sctx, span, t := s.start(ctx, opRenew)
	err := s.s.Renew(sctx, key, token, lease)
	s.end(ctx, opRenew, span, t, err)
	return err
}

func (s *store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	sctx, span, t := s.start(ctx, opCheckpoint)
	err := s.s.Checkpoint(sctx, key, token, name, value)
	s.end(ctx, opCheckpoint, span, t, err)
	return err
}

func (s *store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	sctx, span, t := s.start(ctx, opComplete)
	err := s.s.Complete(sctx, key, token, result, retention)
	s.end(ctx, opComplete, span, t, err)
	return err
}

func (s *store) Release(ctx context.Context, key string, token idempotency.Token) error {
	sctx, span, t := s.start(ctx, opRelease)
	err := s.s.Release(sctx, key, token)
	s.end(ctx, opRelease, span, t, err)
	return err
}

// Limits returns the wrapped store's limits, if it has any.
func (s *store) Limits() idempotency.Limits {
	if ls, ok := s.s.(idempotency.LimitedStore); ok {
		return ls.Limits()
	}
	return idempotency.Limits{}
}

// Unwrap returns the wrapped store.
func (s *store) Unwrap() idempotency.Store { return s.s }

type watchPart struct {
	s *store
	w idempotency.Watcher
}

func (p watchPart) Watch(ctx context.Context, key string) error {
	sctx, span, t := p.s.start(ctx, opWatch)
	err := p.w.Watch(sctx, key)
	p.s.end(ctx, opWatch, span, t, err)
	return err
}

type inspectPart struct {
	s  *store
	in idempotency.Inspector
}

func (p inspectPart) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	sctx, span, t := p.s.start(ctx, opInspect)
	info, err := p.in.Inspect(sctx, key)
	p.s.end(ctx, opInspect, span, t, err)
	return info, err
}

func (p inspectPart) Purge(ctx context.Context, key string) error {
	sctx, span, t := p.s.start(ctx, opPurge)
	err := p.in.Purge(sctx, key)
	p.s.end(ctx, opPurge, span, t, err)
	return err
}

func (p inspectPart) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	sctx, span, t := p.s.start(ctx, opStuck)
	infos, next, err := p.in.Stuck(sctx, cursor, limit)
	p.s.end(ctx, opStuck, span, t, err)
	return infos, next, err
}

type sweepPart struct {
	s  *store
	sw idempotency.Sweeper
}

func (p sweepPart) Sweep(ctx context.Context, limit int) (int, error) {
	sctx, span, t := p.s.start(ctx, opSweep)
	n, err := p.sw.Sweep(sctx, limit)
	p.s.end(ctx, opSweep, span, t, err)
	return n, err
}

// isNil reports whether s is nil or holds a nil pointer.
func isNil(s idempotency.Store) bool {
	if s == nil {
		return true
	}
	v := reflect.ValueOf(s)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
