package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
)

// What a record holds: a state, and once COMPLETED, the stored result: a
// value, a permanent error, or a marker that fn succeeded without its
// result being kept. This file is the record's persisted form on the
// library's side; store.go is the store's.

// State is the persisted state of a record. The values are stored by
// adapters: never change them.
//
// A record is created STARTED by a claim and moves to COMPLETED by its
// holder's Complete; a takeover keeps it STARTED under a new holder; a
// Release, a purge or its expiry deletes it (see [Store]).
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

// DescribeResult tells what a stored result (RecordInfo.Result) holds:
// kind "value" with the codec-encoded value, "bytes" with a []byte result
// stored as it is (the default codec's form of []byte results), "error"
// with the codec-encoded message of a permanent error, or "not_stored" for
// the marker of a success whose result could not be kept. Bytes of no
// known kind give an error matching [ErrCorrupt].
func DescribeResult(stored []byte) (kind string, payload []byte, err error) {
	k, p, err := decodeResult(stored)
	if err != nil {
		return "", nil, err
	}
	switch k {
	case resultValue:
		return "value", p, nil
	case resultBytes:
		return "bytes", p, nil
	case resultError:
		return "error", p, nil
	}
	return "not_stored", nil, nil
}

// encodeOutcome turns fn's outcome into the bytes to store. keep is false
// when fnErr is transient under the runner's error policy: nothing is to be
// stored and the key is to be released. A success whose value cannot be
// encoded, or is larger than the configured limit (or the store's), becomes
// the marker that replays as [ErrResultNotStored]; the reason is returned
// as err, for the observer.
func encodeOutcome[T any](r *Runner, v T, fnErr error) (stored []byte, keep bool, err error) {
	if fnErr != nil {
		var forced *forcedPermanent
		if errors.Is(fnErr, errRelease) || (!errors.As(fnErr, &forced) && !r.cfg.permanent(fnErr)) {
			return nil, false, nil
		}
		msg, err := r.cfg.codec.Marshal(fnErr.Error())
		if err != nil {
			// Still a permanent error, without its message.
			return []byte{resultError}, true, fmt.Errorf("idempotency: encode error message: %w", err)
		}
		return encodeResult(resultError, msg), true, nil
	}
	if isBytes[T]() && r.rawBytes {
		// Bytes as they are: no base64 inside JSON, a third smaller and
		// no encoding. A nil slice goes through the codec, so that it
		// replays as nil.
		if b := any(v).([]byte); b != nil {
			if len(b) > r.maxPayload {
				return []byte{resultNotStored}, true, fmt.Errorf("%w: result of %d bytes, limit %d", ErrTooLarge, len(b), r.maxPayload)
			}
			return encodeResult(resultBytes, b), true, nil
		}
	}
	payload, err := r.cfg.codec.Marshal(v)
	switch {
	case err != nil:
		return []byte{resultNotStored}, true, fmt.Errorf("idempotency: encode result: %w", err)
	case len(payload) > r.maxPayload:
		return []byte{resultNotStored}, true, fmt.Errorf("%w: result of %d bytes, limit %d", ErrTooLarge, len(payload), r.maxPayload)
	}
	return encodeResult(resultValue, payload), true, nil
}

// isBytes reports whether T is []byte.
func isBytes[T any]() bool {
	_, ok := any((*T)(nil)).(*[]byte)
	return ok
}

// decodeOutcome turns stored bytes made by encodeOutcome back into the
// value, or the error to replay, and the outcome of the replay:
// OutcomeReplay for a value or a permanent error (a [*StoredError]),
// OutcomeResultNotStored for the marker, OutcomeCorrupt for bytes it cannot
// decode (written by another codec, or damaged). A []byte value may share
// memory with stored.
func decodeOutcome[T any](r *Runner, stored []byte) (T, Outcome, error) {
	kind, payload, err := decodeResult(stored)
	if err == nil && kind == resultBytes && isBytes[T]() {
		return any(payload).(T), OutcomeReplay, nil // without the codec's allocations
	}
	return decodeValue[T](r, kind, payload, err)
}

// decodeValue is decodeOutcome's path through the codec, a function of
// its own so that the bytes' path above allocates nothing.
func decodeValue[T any](r *Runner, kind byte, payload []byte, err error) (T, Outcome, error) {
	var v T
	if err != nil {
		return v, OutcomeCorrupt, err
	}
	switch kind {
	case resultBytes:
		// Stored from a []byte, read as another type: decode what the
		// codec would have stored.
		enc, err := r.cfg.codec.Marshal(payload)
		if err == nil {
			err = r.cfg.codec.Unmarshal(enc, &v)
		}
		if err != nil {
			var zero T
			return zero, OutcomeCorrupt, fmt.Errorf("%w: result: %w", ErrCorrupt, err)
		}
		return v, OutcomeReplay, nil
	case resultValue:
		if err := r.cfg.codec.Unmarshal(payload, &v); err != nil {
			var zero T // not what the codec left half done
			return zero, OutcomeCorrupt, fmt.Errorf("%w: result: %w", ErrCorrupt, err)
		}
		return v, OutcomeReplay, nil
	case resultError:
		if len(payload) == 0 {
			return v, OutcomeReplay, &StoredError{Message: "idempotency: permanent error (its message could not be stored)"}
		}
		var msg string
		if err := r.cfg.codec.Unmarshal(payload, &msg); err != nil {
			return v, OutcomeCorrupt, fmt.Errorf("%w: stored error message: %w", ErrCorrupt, err)
		}
		return v, OutcomeReplay, &StoredError{Message: msg}
	default:
		return v, OutcomeResultNotStored, ErrResultNotStored
	}
}

// Codec encodes the values that are stored.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec encodes values with encoding/json, and so keeps what JSON
// keeps: a string is stored as text, and bytes in it that are not valid
// UTF-8 are replaced with U+FFFD, so the replay of a string result (or a
// recovery point) holding such bytes differs from the value fn returned.
// Return binary data as []byte (stored in base64, exactly), or use a codec
// of your own ([WithCodec]).
type JSONCodec struct{}

// Marshal encodes v as JSON.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON data into v.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
