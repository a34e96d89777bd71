package idempotency

import (
	"context"
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
	// that caused a release, or the reason a result was not stored.
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
