// Package edge holds what the edges of the library (httpidem, grpcidem and
// the later ones) share beyond the root package's classification of a
// call's outcome: the key a client makes, the check of a nil executor,
// the rule that every managed call is scoped, and the client side's
// backoff. Each edge keeps its own table from [idempotency.Outcome] to its
// protocol's answer.
package edge

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency/internal/typednil"
)

// ErrTransient is the error an edge's function returns to the executor
// when the handler's answer means "try again" (an HTTP 5xx, 408 or 429, a
// gRPC code its Stored refuses), so that the key is released and a retry
// runs the handler again. Every edge exports it under the name
// ErrTransient.
var ErrTransient = errors.New("idempotency: the handler's answer means try again; released, not stored")

// NewKey returns a new idempotency key: a random (version 4) UUID.
func NewKey() string {
	var u [16]byte
	crand.Read(u[:]) // never fails (Go 1.24+)
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

// IsNil reports whether v is nil or holds a nil pointer (a typed nil such
// as a nil *idempotency.Runner), whose methods would panic on first use.
func IsNil(v any) bool { return typednil.Is(v) }

// ScopeChoice returns the message of the error that refuses an edge's
// configuration without a scope, or with both a scope and a shared key
// space, or "" when the choice is made.
func ScopeChoice(scoped, shared bool) string {
	switch {
	case !scoped && !shared:
		return "no scope: give WithScope, so that one client's key can never reach another client's stored response, or WithSharedKeySpace() if every caller is trusted to make keys no other caller can guess"
	case scoped && shared:
		return "both WithScope and WithSharedKeySpace: choose one"
	}
	return ""
}

// ScopeParts checks the parts a scope function returned: none, or an
// empty one, is a rejection (a missing tenant must not fall back to a key
// space shared with every call that lacks one). It returns "" or the
// reason.
func ScopeParts(scope []string) string {
	if len(scope) == 0 {
		return "has no scope (tenant, actor)"
	}
	for _, p := range scope {
		if p == "" {
			return "has a scope part (tenant, actor) that is empty"
		}
	}
	return ""
}

// Sleep waits d, or until ctx is done, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// MaxRetryAfter caps the delay a client takes from a Retry-After header:
// a server's typo must not park a request for years.
const MaxRetryAfter = 24 * time.Hour

// RetryAfter parses a Retry-After header's value (RFC 9110 §10.2.3):
// delay-seconds, or an HTTP-date judged by now; capped at MaxRetryAfter.
// It reports false for an empty or malformed value.
func RetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, int64(MaxRetryAfter/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), MaxRetryAfter), true
	}
	return 0, false
}

// ValidToken reports whether s is an RFC 9110 token: a header name, a
// method.
func ValidToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || c <= ' ' || c == 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}
