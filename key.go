package idempotency

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxKeyLength is the default limit on a client key, in bytes.
const DefaultMaxKeyLength = 255

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
	for _, p := range scope {
		if p == "" {
			// A missing tenant must not become a key space of its own
			// shared by every request that lacks one.
			return "", invalidKey("a scope part is empty", key)
		}
		if err := validateText(p, "scope"); err != nil {
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
		sb.Write(appendLenPrefix(num[:0], len(p)))
		sb.WriteString(p)
	}
	sb.Write(appendLenPrefix(num[:0], len(key)))
	sb.WriteString(key)
	if sb.Len() > MaxStorageKeyLen {
		return "", invalidKey("scope and key longer than "+strconv.Itoa(MaxStorageKeyLen)+" bytes", key)
	}
	return sb.String(), nil
}

func appendLenPrefix(b []byte, n int) []byte {
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, ':')
}
