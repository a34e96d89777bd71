package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Event describes one step of a call of [Do] (the claim acquired, the
// outcome recorded, a renewal that failed) or of an operator's call
// ([Runner.Purge]), in the words of [Outcome].
type Event struct {
	// Outcome says what happened: OutcomeAcquired when a claim was
	// acquired (fresh or by takeover; Attempt says which), then how the
	// call ended (OutcomeCompleted, OutcomeReleased, OutcomeLeaseLost,
	// OutcomeStoreError); a call that did not acquire reports how it ended
	// (OutcomeReplay, OutcomeInProgress, OutcomeMismatch, OutcomeInvalidKey,
	// OutcomeResultNotStored, OutcomeCorrupt); [Runner.Purge] reports
	// OutcomePurged. A renewal that fails but may still succeed is an
	// OutcomeStoreError event during the call.
	Outcome Outcome
	// Key is the storage key (scope and client key). It holds the
	// client's key: fine in a log line, but never a metric label.
	Key string
	// Scope is the request's scope parts (tenant, actor, operation or
	// route, as the caller gave them in [Request.Scope]), shared with the
	// caller: do not modify it. Observers label metrics with the parts
	// they know to be of low cardinality (the route, not the tenant).
	Scope []string
	// Fence is the record's fence, when known.
	Fence int64
	// Attempt is the record's attempt count, when known.
	Attempt int
	// Duration is, for OutcomeCompleted and OutcomeReleased, the time from
	// acquisition to the end of the call; otherwise the time the store
	// call took, retries included.
	Duration time.Duration
	// Err is the error involved, if any: the store's error, the fn error
	// that caused a release, the reason a result was not stored, why a
	// key was refused, or, for a replay, the error replayed (a
	// [*StoredError], [ErrResultNotStored] or [ErrCorrupt]; nil for a
	// replayed value).
	Err error
}

// Observer receives every outcome of [Do], for logs and metrics. Observe
// is called synchronously on the caller's goroutine (and on the heartbeat's
// for a lease lost or a renewal that failed), so it must be fast and safe
// for concurrent use.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to [Observer].
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// NewSlogObserver returns an Observer that logs every event to l: lease
// losses and store errors at Warn, the rest at Debug.
func NewSlogObserver(l *slog.Logger) Observer {
	return slogObserver{l: l}
}

type slogObserver struct{ l *slog.Logger }

func (o slogObserver) Observe(ctx context.Context, e Event) {
	level := slog.LevelDebug
	if e.Outcome == OutcomeLeaseLost || e.Outcome == OutcomeStoreError {
		level = slog.LevelWarn
	}
	if !o.l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("outcome", e.Outcome.String()),
		slog.String("key", e.Key),
		slog.Any("scope", e.Scope),
		slog.Int64("fence", e.Fence),
		slog.Int("attempt", e.Attempt),
		slog.Duration("duration", e.Duration),
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("error", e.Err))
	}
	o.l.LogAttrs(ctx, level, "idempotency", attrs...)
}

// CallObserver is implemented by an [Observer] that also wants to see each
// call of [Do] (and so of [Runner.Execute], and of an adapter's
// transactional mode, which runs Do) as a whole: to put a trace span around
// it, or to count it once by its final outcome. [New] looks for it once; a
// runner whose observer does not implement it, or that has no observer,
// pays nothing for it. [Reconcile] reports its events through Observe only.
type CallObserver interface {
	Observer
	// StartCall is called when a call of Do begins, before its request is
	// checked, with the caller's context. The context it returns stands in
	// for ctx for the rest of the call: the store calls, fn, the Observe
	// calls of the call's events and EndCall get it or a context derived
	// from it, so it may carry a span or the observer's state of the call.
	// It must return a context derived from ctx (or ctx itself).
	StartCall(ctx context.Context, scope []string) context.Context
	// EndCall is called once, when the call returns or fn panics, with the
	// context StartCall returned.
	EndCall(ctx context.Context, c Call)
}

// Call summarizes one call of [Do], for [CallObserver.EndCall].
type Call struct {
	// Scope is the request's scope parts, shared with the caller: do not
	// modify it.
	Scope []string
	// Outcome, Replayed, Fence, Attempt and Ran are those of the [Result]
	// (Fence and Attempt are zero when no claim was decided); Outcome is
	// OutcomeReleased when fn panicked.
	Outcome  Outcome
	Replayed bool
	Fence    int64
	Attempt  int
	// Ran reports that fn was called in this call; FnDuration is then how
	// long it ran. (The call's own duration is the observer's to measure,
	// from StartCall to EndCall: a clock reading costs every call.)
	Ran        bool
	FnDuration time.Duration
	// Err is the error Do returned, or [ErrFnPanicked] when fn panicked
	// (the panic goes on after EndCall).
	Err error
}

// ErrFnPanicked is the Err of a [Call] whose fn panicked.
var ErrFnPanicked = errors.New("idempotency: fn panicked")
