package idempotency

import (
	"context"
	"sync"
	"time"
)

// boundedCtx is the context of the store calls made after fn returns: it
// keeps the caller's values but not its cancellation (a Complete cut short
// by a departed caller would leave the key to be taken over and fn run
// again), and it ends at a deadline, so a store that hangs cannot hold the
// call forever. It costs one allocation: the channel and timer of Done are
// made only when a store asks for Done (the in-memory store only checks
// Err), where context.WithTimeout would always cost four.
type boundedCtx struct {
	parent   context.Context // for values only
	deadline time.Time

	mu    sync.Mutex
	done  chan struct{} // made by the first Done
	timer *time.Timer
}

func newBoundedCtx(parent context.Context, d time.Duration) *boundedCtx {
	return &boundedCtx{parent: parent, deadline: time.Now().Add(d)}
}

func (c *boundedCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *boundedCtx) Value(key any) any { return c.parent.Value(key) }

func (c *boundedCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if d := time.Until(c.deadline); d <= 0 {
			close(c.done)
		} else {
			done := c.done
			c.timer = time.AfterFunc(d, func() { close(done) })
		}
	}
	return c.done
}

// Err is consistent with Done once Done has been asked for; before that,
// nobody can observe Done, and the clock decides.
func (c *boundedCtx) Err() error {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done != nil {
		select {
		case <-done:
			return context.DeadlineExceeded
		default:
			return nil
		}
	}
	if time.Now().Before(c.deadline) {
		return nil
	}
	return context.DeadlineExceeded
}

// stop releases the timer, if Done made one.
func (c *boundedCtx) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}
