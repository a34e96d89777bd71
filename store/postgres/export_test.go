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
