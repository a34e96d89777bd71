package idempotency

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/exactlyonce/idempotency/internal/canon"
)

// Request names one request: the scope it belongs to, the client's key and
// the fingerprint of what was asked.
type Request struct {
	// Scope parts (tenant, authenticated actor, operation or route) are
	// part of the storage key, encoded without ambiguity, so a key from one
	// scope never reaches another's record. Each part must be non-empty,
	// valid UTF-8 without control characters ([ErrInvalidKey] otherwise).
	// No parts at all means one key space for every caller.
	Scope []string
	// Key is the client's idempotency key: non-empty, at most the
	// configured length (255 bytes by default), valid UTF-8 without control
	// characters.
	Key string
	// Fingerprint identifies the request (see [FingerprintJSON]); a reused
	// key with another fingerprint gets [ErrMismatch]. An empty fingerprint
	// only matches an empty one.
	Fingerprint Fingerprint
}

// DefaultMaxKeyLength is the default limit on a client key, in bytes.
const DefaultMaxKeyLength = 255

// StorageKey validates req's key and scope and returns the storage key
// handed to the store. It returns an error wrapping [ErrInvalidKey] or
// [ErrInvalidArgument] for a request [Do] would refuse.
func (r *Runner) StorageKey(req Request) (string, error) {
	if len(req.Fingerprint) > MaxFingerprintLen {
		return "", invalidArg("fingerprint longer than %d bytes", MaxFingerprintLen)
	}
	return storageKey(req.Scope, req.Key, r.cfg.maxKeyLen)
}

// StorageKey encodes scope parts and a client key into the storage key
// handed to a [Store]. Every part is length-prefixed ("6:tenant3:abc"), so
// no choice of parts can produce another scope's key: ("a:b", "c") and
// ("a", "b:c") encode differently. It validates the parts as [Do] does
// with the default key length limit; [Runner.StorageKey] applies the
// runner's own limit.
func StorageKey(scope []string, key string) (string, error) {
	return storageKey(scope, key, DefaultMaxKeyLength)
}

func storageKey(scope []string, key string, max int) (string, error) {
	if err := validateKey(key, max); err != nil {
		return "", err
	}
	n := len(key) + 4
	for i, p := range scope {
		if p == "" {
			// A missing tenant must not become a key space of its own
			// shared by every request that lacks one.
			return "", invalidKey("scope part "+strconv.Itoa(i+1)+" of "+strconv.Itoa(len(scope))+" is empty (is a tenant or an actor missing?)", key)
		}
		if err := validateText(p, "scope part "+strconv.Itoa(i+1)); err != nil {
			return "", err
		}
		n += len(p) + 4
	}
	if n > MaxStorageKeyLen+4 {
		return "", invalidKey("scope and key longer than "+strconv.Itoa(MaxStorageKeyLen)+" bytes", key)
	}
	var sb strings.Builder
	sb.Grow(n)
	var num [20]byte
	for _, p := range scope {
		sb.Write(canon.AppendLenPrefix(num[:0], len(p)))
		sb.WriteString(p)
	}
	sb.Write(canon.AppendLenPrefix(num[:0], len(key)))
	sb.WriteString(key)
	if sb.Len() > MaxStorageKeyLen {
		return "", invalidKey("scope and key longer than "+strconv.Itoa(MaxStorageKeyLen)+" bytes", key)
	}
	return sb.String(), nil
}

// validateKey checks a client key: not empty, at most max bytes, valid
// UTF-8, no control characters.
func validateKey(key string, max int) error {
	switch {
	case key == "":
		return invalidKey("empty", key)
	case len(key) > max:
		return invalidKey("longer than "+strconv.Itoa(max)+" bytes", key)
	}
	return validateText(key, "key")
}

// validateText refuses invalid UTF-8 and control characters, which no
// backend stores faithfully (PostgreSQL text refuses NUL) and which are
// never meant in a key.
func validateText(s, what string) error {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return invalidKey(what+" has a control character", s)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return invalidKey(what+" is not valid UTF-8", s)
		}
		if unicode.IsControl(r) {
			return invalidKey(what+" has a control character", s)
		}
		i += size
	}
	return nil
}

func invalidKey(why string, key string) error {
	if len(key) > 64 {
		key = key[:64] + "..."
	}
	return fmt.Errorf("%w: %s: %s", ErrInvalidKey, why, strconv.Quote(key))
}

// ParseStorageKey splits a storage key made by [StorageKey] (or a Runner)
// back into its scope parts and client key. It returns an error wrapping
// [ErrInvalidKey] for a string that is not such a key.
func ParseStorageKey(encoded string) (scope []string, key string, err error) {
	var parts []string
	for s := encoded; s != ""; {
		i := 0
		for i < len(s) && i < 5 && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 || i >= len(s) || s[i] != ':' || (i > 1 && s[0] == '0') {
			return nil, "", invalidKey("not a storage key", encoded)
		}
		n, _ := strconv.Atoi(s[:i])
		s = s[i+1:]
		if n > len(s) {
			return nil, "", invalidKey("not a storage key", encoded)
		}
		parts = append(parts, s[:n])
		s = s[n:]
	}
	if len(parts) == 0 {
		return nil, "", invalidKey("not a storage key", encoded)
	}
	scope, key = parts[:len(parts)-1], parts[len(parts)-1]
	// Only what StorageKey makes: no empty scope part or key, no control
	// characters, valid UTF-8 (the key's length is the runner's to limit).
	if _, err := storageKey(scope, key, len(key)); err != nil {
		return nil, "", fmt.Errorf("%w (not a storage key: %w)", ErrInvalidKey, err)
	}
	return scope, key, nil
}

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
	return Fingerprint(canon.Hash(sha256.Sum256(b)))
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
	sum, err := canon.Sum(raw)
	if err != nil {
		return "", fmt.Errorf("%w: fingerprint: not canonicalizable JSON: %w", ErrInvalidArgument, err)
	}
	return Fingerprint(canon.Hash(sum)), nil
}

// FingerprintParts hashes several parts (say method, path, query and a
// body's fingerprint) without ambiguity: each part is length-prefixed, so
// ("ab", "c") and ("a", "bc") differ.
func FingerprintParts(parts ...string) Fingerprint {
	return Fingerprint(canon.Parts(parts...))
}
