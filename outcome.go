package idempotency

import (
	"errors"
	"fmt"
	"time"
)

// Outcome is the library's one vocabulary for what happened to a request:
// what a store's Claim decided, how a call of [Do] ended
// ([Result.Outcome]), what an [Event] reports and what a [Call] was
// counted as. The same word means the same thing everywhere: in Result,
// events, logs and metrics (otelidem's idempotency.outcome attribute is
// [Outcome.String]).
//
// Every edge answers a call from its Outcome, with a table of its own and
// no error matching: httpidem a status and a problem type, grpcidem a code
// and a reason, mcpidem a JSON-RPC code and a reason, the inbox what to
// tell the broker. A call whose fn ran (Result.Ran) is answered with fn's
// own answer, whatever its outcome; for the others the table is:
//
//	outcome               meaning                                          HTTP  gRPC                MCP (JSON-RPC)
//	OutcomeReplay          the stored answer, replayed; fn did not run     the stored response
//	OutcomeInProgress      another holder's lease is live; retry later     409   Aborted             -33005
//	OutcomeMismatch        the key was used with another request           422   FailedPrecondition  -33006
//	OutcomeInvalidKey      the key or scope was refused; nothing written   400   InvalidArgument     -33002
//	OutcomeResultNotStored fn succeeded before, its result was not kept    410   FailedPrecondition  -33008
//	OutcomeCorrupt         the stored result cannot be decoded             500   DataLoss            -33009
//	OutcomeStoreError      the store failed; nothing happened; retry       503   Unavailable         -33007
//	OutcomeUnknown         no call was made (a nil runner or fn)           500   Internal            -33010
//
// The values are persisted and exported by adapters and observers: never
// renumber them. A store's Claim returns one of the first four.
type Outcome uint8

// The outcomes.
const (
	// OutcomeUnknown is the zero value: no outcome was decided.
	OutcomeUnknown Outcome = 0

	// OutcomeAcquired: the claim was acquired, fresh or by takeover; the
	// caller holds the lease and runs fn. (Claim, events.)
	OutcomeAcquired Outcome = 1
	// OutcomeReplay: the record is completed and its stored result (a
	// value, or a permanent error replayed as a [*StoredError]) was
	// replayed; fn did not run. Its word is "replayed", as in
	// Result.Replayed. (Claim, calls, events.)
	OutcomeReplay Outcome = 2
	// OutcomeInProgress: another holder's lease is live (or the call gave
	// up waiting for it, [WithWait]). (Claim, calls, events.)
	OutcomeInProgress Outcome = 3
	// OutcomeMismatch: the key was used with another fingerprint. (Claim,
	// calls, events.)
	OutcomeMismatch Outcome = 4

	// OutcomeCompleted: fn ran and its outcome (a value, a permanent error,
	// or the marker of [ErrResultNotStored]) was recorded. (Calls, events.)
	OutcomeCompleted Outcome = 5
	// OutcomeReleased: fn failed transiently (or panicked) and the key was
	// released, so a retry runs fn again. (Calls, events.)
	OutcomeReleased Outcome = 6
	// OutcomeLeaseLost: the lease was lost while fn ran or when its
	// outcome was to be recorded. (Calls, events.)
	OutcomeLeaseLost Outcome = 7
	// OutcomeStoreError: a store call failed after its retries; Result.Ran
	// says whether fn had run. (Calls, events.)
	OutcomeStoreError Outcome = 8
	// OutcomeInvalidKey: the key, a scope part or the fingerprint was
	// refused before the store was touched. (Calls, events.)
	OutcomeInvalidKey Outcome = 9
	// OutcomeResultNotStored: an earlier run succeeded but its result could
	// not be stored ([ErrResultNotStored]); fn is not run again. (Calls,
	// events.)
	OutcomeResultNotStored Outcome = 10
	// OutcomeCorrupt: the stored result cannot be decoded ([ErrCorrupt]);
	// fn is not run again for it. (Calls, events.)
	OutcomeCorrupt Outcome = 11
	// OutcomePurged: an operator deleted the record ([Runner.Purge]).
	// (Events.)
	OutcomePurged Outcome = 12

	numOutcomes = 13
)

var outcomeNames = [numOutcomes]string{
	OutcomeUnknown:         "unknown",
	OutcomeAcquired:        "acquired",
	OutcomeReplay:          "replayed",
	OutcomeInProgress:      "in_progress",
	OutcomeMismatch:        "mismatch",
	OutcomeCompleted:       "completed",
	OutcomeReleased:        "released",
	OutcomeLeaseLost:       "lease_lost",
	OutcomeStoreError:      "store_error",
	OutcomeInvalidKey:      "invalid_key",
	OutcomeResultNotStored: "result_not_stored",
	OutcomeCorrupt:         "corrupt",
	OutcomePurged:          "purged",
}

// String returns the outcome's word, such as "in_progress".
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// MinRetryAfter is the shortest delay [RetryAfter] tells a client: never
// zero, which some clients read as "retry at once, forever". (HTTP's
// Retry-After counts whole seconds: httpidem rounds up.)
const MinRetryAfter = 10 * time.Millisecond

// storeRetryAfter is the delay told a client after a store failure: long
// enough for a failover or a restart to begin, short enough for a user.
const storeRetryAfter = time.Second

// RetryAfter returns the delay an edge tells its client to wait before it
// retries, under the same key, a call that ended with res (the client may
// do so exactly when the delay is positive): for OutcomeInProgress the
// time left on the other holder's lease (Result.RetryAfter), for a store
// failure before fn ran a second; at least [MinRetryAfter] and at most
// limit. It is 0 for every other outcome: those answers are final for the
// key, or fn's own. Every edge clamps its hint here, so that they agree.
func RetryAfter[T any](res Result[T], limit time.Duration) time.Duration {
	var d time.Duration
	switch {
	case res.Ran:
		return 0
	case res.Outcome == OutcomeInProgress:
		d = res.RetryAfter
	case res.Outcome == OutcomeStoreError:
		d = storeRetryAfter
	default:
		return 0
	}
	return max(min(d, limit), MinRetryAfter)
}

// OutcomeOf returns the outcome that err, an error [Do] returns, tells
// of: for an [Executor] of one's own that reports errors without setting
// Result.Outcome. It is OutcomeUnknown for nil and for an error that is
// none of Do's.
func OutcomeOf(err error) Outcome {
	var se *StoredError
	switch {
	case err == nil:
		return OutcomeUnknown
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrInvalidKey):
		return OutcomeInvalidKey
	case errors.Is(err, ErrResultNotStored):
		return OutcomeResultNotStored
	case errors.Is(err, ErrCorrupt):
		return OutcomeCorrupt
	case errors.Is(err, ErrLeaseLost):
		return OutcomeLeaseLost
	case errors.Is(err, ErrStore):
		return OutcomeStoreError
	case errors.As(err, &se):
		return OutcomeReplay
	}
	return OutcomeUnknown
}
