// Package canon recognizes JSON already in its RFC 8785 form and hashes
// fingerprints, for the root package's fingerprint helpers and httpidem's
// default request fingerprint, which share one canonical-JSON hash and one
// framing of parts.
package canon

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Span reports whether b is JSON already in its RFC 8785 form,
// give or take whitespace around the top-level value, and returns that
// value's bounds. For such input jcs.Transform would return b[start:end]
// unchanged, so [Sum] hashes it as it is and skips building a
// tree, sorting and re-serializing: a request body sent by a client that
// serializes canonically (sorted keys, no whitespace, shortest numbers),
// and every retry of it, costs a validating scan.
//
// It never decides what canonical form a document has: it only recognizes
// documents that need no change, and answers false, leaving the work to
// the RFC 8785 library, for anything it does not recognize with certainty:
// a \u escape or "\/", an object key with an escape or a non-ASCII
// character, keys out of order or repeated, whitespace inside the value, a
// number not written as the shortest ECMAScript form, nesting deeper than
// maxCanonicalDepth, invalid JSON.
func Span(b []byte) (start, end int, ok bool) {
	start, end = 0, len(b)
	for start < end && isJSONSpace(b[start]) {
		start++
	}
	for end > start && isJSONSpace(b[end-1]) {
		end--
	}
	if start == end {
		return 0, 0, false
	}
	s := canonScanner{b: b[:end], i: start}
	if !s.value(0) || s.i != end {
		return 0, 0, false
	}
	return start, end, true
}

// maxCanonicalDepth bounds the scanner's recursion; deeper documents go to
// the library, which has its own (higher) limit.
const maxCanonicalDepth = 64

func isJSONSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

type canonScanner struct {
	b []byte
	i int
}

func (s *canonScanner) value(depth int) bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return depth < maxCanonicalDepth && s.object(depth+1)
	case c == '[':
		return depth < maxCanonicalDepth && s.array(depth+1)
	case c == '"':
		_, ok := s.str(false)
		return ok
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	default:
		return s.number()
	}
}

func (s *canonScanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

func (s *canonScanner) object(depth int) bool {
	s.i++ // '{'
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	var prev []byte
	for first := true; ; first = false {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		key, ok := s.str(true)
		// Keys in strictly increasing order. Without escapes and with
		// ASCII only, byte order is the order of UTF-16 code units.
		if !ok || (!first && string(prev) >= string(key)) {
			return false
		}
		prev = key
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		if !s.value(depth) {
			return false
		}
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

func (s *canonScanner) array(depth int) bool {
	s.i++ // '['
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return true
	}
	for {
		if !s.value(depth) || s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str scans a string at s.i (its opening quote) and returns its contents.
// A key (asKey) must be printable ASCII without escapes.
func (s *canonScanner) str(asKey bool) ([]byte, bool) {
	s.i++
	begin := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			body := s.b[begin:s.i]
			s.i++
			return body, true
		case c < 0x20:
			return nil, false
		case c == '\\':
			if asKey || s.i+1 >= len(s.b) {
				return nil, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				// The forms RFC 8785 writes; \/ and \u are rewritten.
				s.i += 2
			default:
				return nil, false
			}
		case c < utf8.RuneSelf:
			s.i++
		default:
			if asKey {
				return nil, false
			}
			r, size := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && size <= 1 {
				return nil, false
			}
			s.i += size
		}
	}
	return nil, false
}

// number scans a number and reports whether it is valid JSON written as
// RFC 8785 writes it (ECMAScript's shortest form).
func (s *canonScanner) number() bool {
	begin := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	n := s.i - digits
	switch {
	case n == 0:
		return false
	case n > 1 && s.b[digits] == '0':
		return false // a leading zero: not JSON
	}
	simple := true
	if s.i < len(s.b) && s.b[s.i] == '.' {
		simple = false
		s.i++
		f := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		if s.i == f {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		simple = false
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		e := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		if s.i == e {
			return false
		}
	}
	lit := s.b[begin:s.i]
	if simple && n <= 15 {
		// An integer of at most 15 digits is exact in a double and written
		// back as it is, except for minus zero.
		return string(lit) != "-0"
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		return false
	}
	canon, err := jcs.NumberToJSON(f)
	return err == nil && canon == string(lit)
}

// Sum returns the SHA-256 of raw's RFC 8785 form, or the error of the RFC
// 8785 library for JSON it refuses.
func Sum(raw []byte) ([sha256.Size]byte, error) {
	if start, end, ok := Span(raw); ok {
		// Already canonical: what jcs.Transform would return.
		return sha256.Sum256(raw[start:end]), nil
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(canon), nil
}

// Prefix starts every fingerprint the helpers make.
const Prefix = "sha256:"

// Buf holds a fingerprint: Prefix and 64 hex digits.
type Buf [len(Prefix) + 2*sha256.Size]byte

// Format writes the fingerprint of sum into buf.
func Format(buf *Buf, sum [sha256.Size]byte) {
	copy(buf[:], Prefix)
	hex.Encode(buf[len(Prefix):], sum[:])
}

// Hash returns the fingerprint of sum.
func Hash(sum [sha256.Size]byte) string {
	var buf Buf
	Format(&buf, sum)
	return string(buf[:])
}

// AppendLenPrefix appends n in decimal and a colon: the prefix that frames
// a part of a storage key or of a fingerprint.
func AppendLenPrefix(b []byte, n int) []byte {
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, ':')
}

// AppendParts appends each part to b, length-prefixed, so that ("ab", "c")
// and ("a", "bc") differ.
func AppendParts(b []byte, parts ...string) []byte {
	for _, p := range parts {
		b = AppendLenPrefix(b, len(p))
		b = append(b, p...)
	}
	return b
}

// Parts returns the fingerprint of parts, framed by AppendParts: one
// buffer, on the stack for the usual few short parts, and one hash over it.
func Parts(parts ...string) string {
	var stack [512]byte
	return Hash(sha256.Sum256(AppendParts(stack[:0], parts...)))
}

// JSONRequest returns the fingerprint
//
//	Parts(method, path, query, "json", <fingerprint of body's RFC 8785 form>)
//
// with the inner fingerprint on the stack, and false when the RFC 8785
// library refuses body.
func JSONRequest(method, path, query string, body []byte) (string, bool) {
	sum, err := Sum(body)
	if err != nil {
		return "", false
	}
	var inner Buf
	Format(&inner, sum)
	var stack [512]byte
	b := AppendParts(stack[:0], method, path, query, "json")
	b = AppendLenPrefix(b, len(inner))
	b = append(b, inner[:]...)
	return Hash(sha256.Sum256(b)), true
}
