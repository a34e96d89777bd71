package idempotency

import "fmt"

// State is the persisted state of a record. The values are stored by
// adapters: never change them.
type State string

// The states of a record. A record that does not exist is in no state.
const (
	// StateStarted: a holder has claimed the key and its effect may be
	// running. The lease says until when the holder is presumed alive.
	StateStarted State = "started"
	// StateCompleted: the result (a value or a stored error) is recorded
	// and is replayed to every retry until retention ends.
	StateCompleted State = "completed"
)

// Outcome is what a [Store.Claim] decided. The numbers may be persisted or
// sent over the wire by adapters: never renumber them.
type Outcome uint8

// The outcomes of a claim.
const (
	// OutcomeUnknown is the zero value and never a valid result.
	OutcomeUnknown Outcome = 0
	// OutcomeAcquired: the caller holds the lease and must run the effect.
	OutcomeAcquired Outcome = 1
	// OutcomeReplay: the record is completed; the result is in the reply.
	OutcomeReplay Outcome = 2
	// OutcomeInProgress: another holder's lease is live.
	OutcomeInProgress Outcome = 3
	// OutcomeMismatch: the key was used with a different fingerprint.
	OutcomeMismatch Outcome = 4
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case OutcomeAcquired:
		return "acquired"
	case OutcomeReplay:
		return "replay"
	case OutcomeInProgress:
		return "in_progress"
	case OutcomeMismatch:
		return "mismatch"
	default:
		return fmt.Sprintf("Outcome(%d)", uint8(o))
	}
}

// The first byte of a stored result says what follows. Persisted: never
// change these values.
const (
	resultValue     byte = 'v' // codec-encoded value of fn's success
	resultError     byte = 'e' // codec-encoded message of a permanent error
	resultNotStored byte = 'x' // fn succeeded but its result could not be kept
	resultBytes     byte = 'b' // a []byte success, as it is (default codec only)
)

var errCorruptResult = fmt.Errorf("%w: stored result of unknown kind", ErrCorrupt)

// encodeResult frames payload with its kind in one allocation.
func encodeResult(kind byte, payload []byte) []byte {
	b := make([]byte, 0, 1+len(payload))
	b = append(b, kind)
	return append(b, payload...)
}

// decodeResult splits a stored result into its kind and payload.
func decodeResult(b []byte) (byte, []byte, error) {
	if len(b) == 0 {
		return 0, nil, errCorruptResult
	}
	switch b[0] {
	case resultValue, resultError, resultNotStored, resultBytes:
		return b[0], b[1:], nil
	}
	return 0, nil, errCorruptResult
}
