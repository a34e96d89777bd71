package idempotency

// EncodeOutcome and DecodeOutcome expose the stored-result framing to the
// external tests (fuzzing and format cases), which build stored records
// as Do would.
func EncodeOutcome[T any](r *Runner, v T, fnErr error) ([]byte, bool, error) {
	return encodeOutcome(r, v, fnErr)
}

func DecodeOutcome[T any](r *Runner, stored []byte) (T, error) {
	v, _, err := decodeOutcome[T](r, stored)
	return v, err
}
