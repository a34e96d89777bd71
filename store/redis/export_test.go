package redis

import "time"

// SetClockSkew moves the clock of s's claims by d (negative: back), as a
// server clock stepped back would.
func SetClockSkew(s *Store, d time.Duration) { s.clockSkew = d.Microseconds() }

// FenceKey returns the key of the fence mark of storageKey's shard.
func FenceKey(s *Store, storageKey string) string {
	k, _ := s.keys(storageKey)
	return k[1]
}

// Wrap is s's wrapping of an operation's error.
func Wrap(s *Store, op string, err error) error { return s.wrap(op, err) }
