package conformancetest

import (
	"sync"
	"time"
)

// Clock is a manual clock for stores that take an injectable clock: it
// stands still until [Clock.Advance] moves it. It is safe for concurrent
// use. Wire its Now method into the store (for the memory store,
// memory.Options{Now: clock.Now}) and declare
// [Capabilities.ControlledClock], and the suite advances it instead of
// sleeping.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d. A negative d is ignored: the
// clock never runs backwards.
func (c *Clock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
