package idempotency

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is; the messages may change.
var (
	// ErrInvalidKey: the client key or a scope part is empty, too long,
	// not valid UTF-8 or holds control characters. Nothing was written.
	ErrInvalidKey = errors.New("idempotency: invalid key")

	// ErrInvalidArgument: a nil store, runner or function, a non-positive
	// duration, or another argument that cannot work. Nothing was written.
	ErrInvalidArgument = errors.New("idempotency: invalid argument")

	// ErrInProgress: another holder's lease on the key is live. The error
	// is an *InProgressError carrying a retry-after hint. HTTP: 409.
	ErrInProgress = errors.New("idempotency: request in progress")

	// ErrMismatch: the key was used before with a different request
	// fingerprint. It is never taken over or replayed. HTTP: 422.
	ErrMismatch = errors.New("idempotency: key reused with a different request")

	// ErrLeaseLost: the lease this holder had is gone (expired and taken
	// over, or the record expired). Returned by stores for a stale token,
	// and set as the cause of fn's context when a heartbeat finds it.
	ErrLeaseLost = errors.New("idempotency: lease lost")

	// ErrTooLarge: the store cannot keep a value this large. Returned by
	// stores before writing anything.
	ErrTooLarge = errors.New("idempotency: value too large to store")

	// ErrResultNotStored: an earlier call ran fn successfully, but its
	// result could not be stored (too large, or not encodable), so it cannot
	// be replayed. fn is not run again.
	ErrResultNotStored = errors.New("idempotency: earlier run succeeded but its result was not stored")

	// ErrCorrupt: a stored result or recovery point cannot be decoded: it
	// was written by another version or another codec ([WithCodec]), or
	// it is damaged. What it records is never run again because of it:
	// [Do] returns the error for a completed record without running fn,
	// and [Step] returns it without running its step (and if fn returns
	// it, the record is neither completed nor released: it stays STARTED
	// until its lease ends and is listed by [Runner.Stuck], so that the
	// recovery points are not dropped and the step is not run again).
	ErrCorrupt = errors.New("idempotency: stored value cannot be decoded")

	// ErrNotFound: the store has no live record under the key ([Inspector],
	// [Runner.Inspect]).
	ErrNotFound = errors.New("idempotency: no such record")

	// ErrStore: the store failed. The error is a *StoreError; see its Ran
	// field for whether fn may have run.
	ErrStore = errors.New("idempotency: store failed")

	// ErrPermanent is matched by errors marked with [Permanent] and by
	// replayed stored errors.
	ErrPermanent = errors.New("idempotency: permanent error")
)

// InProgressError is returned (wrapped in nothing) when another holder's
// lease on the key is live. It matches ErrInProgress.
type InProgressError struct {
	// RetryAfter is the time left on the other holder's lease, as judged by
	// the store: a sensible delay before retrying.
	RetryAfter time.Duration
}

// Error says the request is in progress and when to retry.
func (e *InProgressError) Error() string {
	return "idempotency: request in progress, retry after " + e.RetryAfter.String()
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// StoreError reports that a store operation failed. It unwraps to the
// store's own error (a driver error, a context error), and matches ErrStore.
type StoreError struct {
	// Op is the store operation: "claim", "renew", "checkpoint",
	// "complete" or "release"; an [Executor] of a transactional mode adds
	// "begin" and "commit".
	Op string
	// Ran reports that fn had already run when the store failed, so its
	// effect may have happened although no result was recorded. The record
	// stays STARTED until its lease ends; a retry after that takes it over
	// (with a greater fence and the recovery points made so far). In a
	// transactional mode, where fn's writes roll back with the key, Ran is
	// false even after fn ran: a retry repeats nothing that happened.
	Ran bool
	// Err is the store's error.
	Err error
}

// Error names the store operation that failed, whether fn ran, and the
// store's error.
func (e *StoreError) Error() string {
	s := "idempotency: store " + e.Op + " failed"
	if e.Ran {
		s += " after fn ran (its effect may have happened)"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStore.
func (e *StoreError) Is(target error) bool { return target == ErrStore }

// permanentError marks an error as permanent.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
func (e *permanentError) Is(target error) bool {
	return target == ErrPermanent
}

// Permanent marks err as permanent: when fn returns it, the error is stored
// and replayed to every retry instead of releasing the key, so a retry
// cannot succeed after the state changed underneath it (a validation error,
// "payment exceeds balance"). Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// StoredError is a permanent error replayed from the store. Only its
// message survives storage.
type StoredError struct {
	// Message is the original error's message.
	Message string
}

// Error returns the original error's message.
func (e *StoredError) Error() string { return e.Message }

// Is reports whether target is ErrPermanent.
func (e *StoredError) Is(target error) bool { return target == ErrPermanent }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

func isMarkedPermanent(err error) bool { return errors.Is(err, ErrPermanent) }
