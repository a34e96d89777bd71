package httpidem

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
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
func NewKey() string {
	var u [16]byte
	rand.Read(u[:]) // never fails (Go 1.24+)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// SetKey sets req's Idempotency-Key header to key, so that a [Transport]
// retries it and the server de-duplicates it.
func SetKey(req *http.Request, key string) {
	req.Header.Set(DefaultKeyHeader, key)
}
