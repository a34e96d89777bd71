package bench

import "sync/atomic"

// Trips returns the counter of the backend's round trips, for the
// comparisons of [Compare] (it counts nothing for the memory backend).
func (b *Backend) Trips() *atomic.Int64 { return &b.trips }
