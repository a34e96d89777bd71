package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// EventKind says what happened to a call of [Do].
type EventKind uint8

// The kinds of events. Never renumber: observers may export them.
const (
	// EventAcquired: the claim was acquired (fresh or by takeover); fn runs.
	EventAcquired EventKind = iota + 1
	// EventReplayed: a stored result was replayed; fn did not run.
	EventReplayed
	// EventInProgress: another holder's lease is live.
	EventInProgress
	// EventMismatch: the key was used with another fingerprint.
	EventMismatch
	// EventLeaseLost: the holder's lease was lost.
	EventLeaseLost
	// EventReleased: fn failed transiently or panicked; the key was released.
	EventReleased
	// EventCompleted: the result (a value, a permanent error or a
	// not-stored marker) was recorded.
	EventCompleted
	// EventStoreError: a store call failed after its retries.
	EventStoreError
	// EventPurged: an operator deleted the record ([Runner.Purge]).
	EventPurged
	// EventInvalidKey: [Do] refused the request's key or scope (or its
	// fingerprint) before touching the store; Err says why. Key is empty:
	// there is no valid storage key.
	EventInvalidKey
)

var eventNames = [...]string{
	EventAcquired:   "acquired",
	EventReplayed:   "replayed",
	EventInProgress: "in_progress",
	EventMismatch:   "mismatch",
	EventLeaseLost:  "lease_lost",
	EventReleased:   "released",
	EventCompleted:  "completed",
	EventStoreError: "store_error",
	EventPurged:     "purged",
	EventInvalidKey: "invalid_key",
}

// String returns the event kind's name.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event describes one outcome of a call of [Do].
type Event struct {
	// Kind says what happened.
	Kind EventKind
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
	// Duration is, for EventCompleted and EventReleased, the time from
	// acquisition to the end of the call; otherwise the time the store
	// call took, retries included.
	Duration time.Duration
	// Err is the error involved, if any: the store's error, the fn error
	// that caused a release, the reason a result was not stored, why a
	// key was refused, or, for EventReplayed, the error replayed (a
	// [*StoredError] or [ErrResultNotStored]; nil for a replayed value).
	Err error
}

// Observer receives every outcome of [Do], for logs and metrics. Observe
// is called synchronously on the caller's goroutine (and on the heartbeat's
// for EventLeaseLost), so it must be fast and safe for concurrent use.
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
	if e.Kind == EventLeaseLost || e.Kind == EventStoreError {
		level = slog.LevelWarn
	}
	if !o.l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("event", e.Kind.String()),
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
// call of [Do] (and so of [Runner.Execute]) as a whole: to put a trace
// span around it, or to count it once by its final outcome. [New] looks for
// it once; a runner whose observer does not implement it, or that has no
// observer, pays nothing for it.
//
// Other execution modes (an adapter's transactional [Executor], the
// reconciler) report their events through Observe only.
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
	// Replayed, Fence and Attempt are those of the [Result] (Fence and
	// Attempt are zero when no claim was decided).
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

// doCall is Do for a runner whose observer is a CallObserver: it brackets
// the call with StartCall and EndCall and times fn.
func doCall[T any](ctx context.Context, r *Runner, req Request, fn func(ctx context.Context) (T, error)) (res Result[T], err error) {
	co := r.cfg.calls
	ctx = co.StartCall(ctx, req.Scope)
	c := Call{Scope: req.Scope, Err: ErrFnPanicked}
	defer func() {
		// Also when fn panics: c.Err is then still ErrFnPanicked.
		c.Replayed, c.Fence, c.Attempt = res.Replayed, res.Fence, res.Attempt
		co.EndCall(ctx, c)
	}()
	res, err = do(ctx, r, req, func(ctx context.Context) (T, error) {
		c.Ran = true
		fnStart := time.Now()
		defer func() { c.FnDuration = time.Since(fnStart) }()
		return fn(ctx)
	})
	c.Err = err
	return res, err
}
