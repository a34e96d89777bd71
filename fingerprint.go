package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/gowebpki/jcs"

	"github.com/exactlyonce/idempotency/internal/fphook"
)

// Fingerprint identifies the request a key was first used with, so that a
// reused key with a different request is refused ([ErrMismatch]) instead of
// replaying an unrelated result. Stores compare fingerprints for equality
// only. The helpers below produce "sha256:" and 64 hex digits; a custom
// fingerprint may be any string of at most [MaxFingerprintLen] bytes.
type Fingerprint string

// MaxFingerprintLen is the longest fingerprint [Do] accepts.
const MaxFingerprintLen = 256

// FingerprintBytes hashes b as it is. Use it for bodies whose exact bytes
// matter.
func FingerprintBytes(b []byte) Fingerprint {
	sum := sha256.Sum256(b)
	return hashFingerprint(sum)
}

// FingerprintJSON hashes the RFC 8785 (JSON Canonicalization Scheme) form of
// v, so semantically equal values match: object keys in any order, any
// spelling of the same number (1, 1.0, 1e0), any escaping of the same
// string. v may be raw JSON ([]byte or [json.RawMessage]) or any value
// encoding/json can marshal. It returns an error wrapping
// [ErrInvalidArgument] for JSON it cannot parse.
func FingerprintJSON(v any) (Fingerprint, error) {
	var raw []byte
	switch x := v.(type) {
	case []byte:
		raw = x
	case json.RawMessage:
		raw = x
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return "", fmt.Errorf("%w: fingerprint: %w", ErrInvalidArgument, err)
		}
		raw = b
	}
	sum, err := canonicalSum(raw)
	if err != nil {
		return "", fmt.Errorf("%w: fingerprint: not canonicalizable JSON: %w", ErrInvalidArgument, err)
	}
	return hashFingerprint(sum), nil
}

// canonicalSum is the SHA-256 of raw's RFC 8785 form.
func canonicalSum(raw []byte) ([sha256.Size]byte, error) {
	if start, end, ok := canonicalSpan(raw); ok {
		// Already canonical: what jcs.Transform would return.
		return sha256.Sum256(raw[start:end]), nil
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(canon), nil
}

// FingerprintParts hashes several parts (say method, path, query and a
// body's fingerprint) without ambiguity: each part is length-prefixed, so
// ("ab", "c") and ("a", "bc") differ.
func FingerprintParts(parts ...string) Fingerprint {
	// One buffer, on the stack for the usual few short parts, and one
	// hash over it: no copy per part through the hash.Hash interface.
	var stack [512]byte
	return hashFingerprint(sha256.Sum256(appendParts(stack[:0], parts...)))
}

// appendParts appends each part to b, length-prefixed.
func appendParts(b []byte, parts ...string) []byte {
	for _, p := range parts {
		b = appendLenPrefix(b, len(p))
		b = append(b, p...)
	}
	return b
}

const fingerprintPrefix = "sha256:"

// fingerprintBuf holds a fingerprint of the helpers above.
type fingerprintBuf [len(fingerprintPrefix) + 2*sha256.Size]byte

func hashFingerprint(sum [sha256.Size]byte) Fingerprint {
	var buf fingerprintBuf
	formatFingerprint(&buf, sum)
	return Fingerprint(buf[:])
}

func formatFingerprint(buf *fingerprintBuf, sum [sha256.Size]byte) {
	copy(buf[:], fingerprintPrefix)
	hex.Encode(buf[len(fingerprintPrefix):], sum[:])
}

func init() { fphook.JSONRequest = jsonRequestFingerprint }

// jsonRequestFingerprint is [fphook.JSONRequest]: FingerprintParts of the
// request's parts and FingerprintJSON of its body, with that inner
// fingerprint on the stack.
func jsonRequestFingerprint(method, path, query string, body []byte) (string, bool) {
	sum, err := canonicalSum(body)
	if err != nil {
		return "", false
	}
	var inner fingerprintBuf
	formatFingerprint(&inner, sum)
	var stack [512]byte
	b := appendParts(stack[:0], method, path, query, "json")
	b = appendLenPrefix(b, len(inner))
	b = append(b, inner[:]...)
	return string(hashFingerprint(sha256.Sum256(b))), true
}
