package otelidem

import (
	"context"
	"errors"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
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
	opDiscard
	opClaimBatch
	opFinishBatch
	numStoreOps
)

var storeOpNames = [numStoreOps]string{"claim", "renew", "checkpoint", "complete", "release", "watch", "inspect", "purge", "stuck", "sweep", "discard", "claim_batch", "finish_batch"}

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
// call's span under Do. The wrapper keeps exactly the capabilities of s
// (idempotency.CapabilitiesOf): its Watcher, Inspector, Sweeper and
// Transactional parts, each timed too, and its limits, so that the runner
// behaves as it does on s. Its method Unwrap returns s (see
// idempotency.StoreAs): the PostgreSQL adapter's transactional mode finds
// its store through it, and its calls, which go through the wrapper as
// every other call of Do does, are timed and traced alike.
//
// Each attempt is timed on its own: a call that the runner retries
// ([idempotency.WithStoreRetries]) is one measurement per attempt. A
// failed call has the attribute error.type: lease_lost, too_large,
// not_found (expected answers of the store contract), canceled,
// deadline_exceeded or _OTHER.
//
// Store(nil), or a typed nil, returns nil, which [idempotency.New] refuses.
func (o *Observer) Store(s idempotency.Store) idempotency.Store {
	if isNil(s) {
		return nil
	}
	b := &store{o: o, s: s}
	c := idempotency.CapabilitiesOf(s)
	b.caps.Limits = c.Limits
	if c.Watcher != nil {
		b.caps.Watcher = watchPart{b, c.Watcher}
	}
	if c.Inspector != nil {
		b.caps.Inspector = inspectPart{b, c.Inspector}
	}
	if c.Sweeper != nil {
		b.caps.Sweeper = sweepPart{b, c.Sweeper}
	}
	if c.Transactional != nil {
		b.caps.Transactional = txPart{b, c.Transactional}
	}
	if c.Batcher != nil {
		b.caps.Batcher = batchPart{b, c.Batcher}
	}
	return b
}

// store is the wrapper: its Store methods, and its parts in caps.
type store struct {
	o    *Observer
	s    idempotency.Store
	caps idempotency.Capabilities
}

// Capabilities returns the wrapped store's capabilities, each part timed.
func (s *store) Capabilities() idempotency.Capabilities { return s.caps }

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

type txPart struct {
	s  *store
	tx idempotency.Transactional
}

func (p txPart) InTx(ctx context.Context) bool { return p.tx.InTx(ctx) }

func (p txPart) Discard(ctx context.Context, key string, token idempotency.Token) error {
	sctx, span, t := p.s.start(ctx, opDiscard)
	err := p.tx.Discard(sctx, key, token)
	p.s.end(ctx, opDiscard, span, t, err)
	return err
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

// batchPart times a Batcher's calls: one measurement and one span per
// batch (with its item count), whose error.type is that of the first item
// that failed.
type batchPart struct {
	s  *store
	bt idempotency.Batcher
}

// attrBatchItems is the number of items a batch call's span reports.
const attrBatchItems = attribute.Key("idempotency.batch.items")

func (p batchPart) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	sctx, span, t := p.s.start(ctx, opClaimBatch)
	res, errs := p.bt.ClaimBatch(sctx, reqs)
	if span != nil {
		span.SetAttributes(attrBatchItems.Int(len(reqs)))
	}
	p.s.end(ctx, opClaimBatch, span, t, firstErr(errs))
	return res, errs
}

func (p batchPart) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	sctx, span, t := p.s.start(ctx, opFinishBatch)
	errs := p.bt.FinishBatch(sctx, items)
	if span != nil {
		span.SetAttributes(attrBatchItems.Int(len(items)))
	}
	p.s.end(ctx, opFinishBatch, span, t, firstErr(errs))
	return errs
}

// firstErr is the first error of errs that is not nil, or nil.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// isNil reports whether s is nil or holds a nil pointer.
func isNil(s idempotency.Store) bool { return edge.IsNil(s) }
