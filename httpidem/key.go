package httpidem

import (
	"net/http"
	"strings"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// parseKey reads the value of the key header. It accepts an RFC 8941
// sf-string ("..." with \" and \\ escapes and printable ASCII inside) and,
// as most clients send it, a bare key (the value as it is, without
// surrounding whitespace). A quoted value with anything after its closing
// quote (such as RFC 8941 parameters) is refused.
func parseKey(v string) (string, bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", false
	}
	if v[0] != '"' {
		return v, true
	}
	var b []byte // only when the string has escapes
	escaped := false
	start := 1
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", false
			}
			b = append(b, v[start:i]...)
			escaped = true // b may still be nil: an escape right after the quote
			i++
			start = i
		case c == '"':
			if i != len(v)-1 {
				return "", false
			}
			if !escaped {
				return v[1:i], true
			}
			return string(append(b, v[start:i]...)), true
		case c < 0x20 || c > 0x7e:
			return "", false
		}
	}
	return "", false // no closing quote
}

// NewKey returns a new idempotency key: a random (version 4) UUID. Make
// one per user intent (a click on "Pay", a job to submit), when the intent
// is made, and send it with every attempt of that intent, including the
// retries a user starts by hand after an error: a key made per attempt
// de-duplicates nothing.
func NewKey() string { return edge.NewKey() }

// SetKey sets req's Idempotency-Key header to key, so that a [Transport]
// retries it and the server de-duplicates it.
func SetKey(req *http.Request, key string) {
	req.Header.Set(DefaultKeyHeader, key)
}
