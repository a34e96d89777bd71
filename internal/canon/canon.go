package idempotency

import (
	"strconv"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// canonicalSpan reports whether b is JSON already in its RFC 8785 form,
// give or take whitespace around the top-level value, and returns that
// value's bounds. For such input jcs.Transform would return b[start:end]
// unchanged, so [FingerprintJSON] hashes it as it is and skips building a
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
func canonicalSpan(b []byte) (start, end int, ok bool) {
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
