package outbox

import (
	crand "crypto/rand"
	"encoding/hex"
	"time"
)

// NewEventID returns a new random event ID: a version 7 UUID (RFC 9562) in
// its 36-character text form, 48 bits of Unix milliseconds and 74 random
// bits. Enqueue uses it for events without an ID; call it yourself to know
// an event's ID before enqueueing it. Being time-ordered, the IDs keep a
// receiver's index of them (its inbox) growing at its right edge.
func NewEventID() string {
	var b [16]byte
	ms := uint64(time.Now().UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	crand.Read(b[6:])       // never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x70 // version 7
	b[8] = b[8]&0x3f | 0x80 // variant 10
	const digits = "0123456789abcdef"
	var s [36]byte
	j := 0
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = digits[c>>4], digits[c&0x0f]
		j += 2
	}
	return string(s[:])
}

// newToken returns 128 random bits as 32 hex digits: a claim's token.
func newToken() string {
	var b [16]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}
