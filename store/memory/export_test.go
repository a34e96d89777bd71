package memory

// NewWithHash returns a store that places keys by hash instead of by a
// seeded maphash, so that a test can make keys collide.
func NewWithHash(opts *Options, hash func(key string) uint64) *Store {
	s, err := New(opts)
	if err != nil {
		panic(err)
	}
	s.hashKey = hash
	return s
}

// ExpiryEntries reports the entries of the expiry heap and of the queue
// of completed records, those of deleted records included.
func (s *Store) ExpiryEntries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.expiry) + s.done.len
}
