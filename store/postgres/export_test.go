package postgres

import "time"

// SetListenIdle sets how long s's listener stays connected after its last
// waiter left.
func SetListenIdle(s *Store, d time.Duration) {
	s.listener.mu.Lock()
	s.listener.idleAfter = d
	s.listener.mu.Unlock()
}

// ChannelName is the notification channel of s's table.
func ChannelName(s *Store) string { return channelName(s.opts) }

// SetMigrateTimeout sets the bound of Migrate under a context without a
// deadline, and returns a function that restores it.
func SetMigrateTimeout(d time.Duration) (restore func()) {
	old := migrateTimeout
	migrateTimeout = d
	return func() { migrateTimeout = old }
}

// PinClaimOrder fixes which of Claim's plain statements runs first (the
// read when readFirst), instead of choosing from the recent claims; it
// must be called before s is used.
func PinClaimOrder(s *Store, readFirst bool) {
	s.order.pin = pinInsert
	if readFirst {
		s.order.pin = pinRead
	}
}

// ClaimReadsFirst reports whether s's next claim starts with the read.
func ClaimReadsFirst(s *Store) bool { return s.order.readFirst() }

// SetStuckScan sets how many blocks of the table one Stuck call of s reads
// at most; it must be called before s is used.
func SetStuckScan(s *Store, n int) { s.stuckScan = n }
