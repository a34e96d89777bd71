package idempotency

import (
	"context"
	"math"
	"sync"
	"time"
)

// boundedCtx is a context with a deadline whose channel and timer are made
// only when someone asks for Done. It serves two purposes:
//
//   - the context of the store calls made after fn returns
//     ([newBoundedCtx]): it keeps the caller's values but not its
//     cancellation (a Complete cut short by a departed caller would leave
//     the key to be taken over and fn run again), and ends at a deadline,
//     so a store that hangs cannot hold the call forever;
//   - the context of one store attempt ([withAttemptTimeout]): the
//     caller's context, or a boundedCtx, bounded by the store timeout.
//
// context.WithTimeout costs a timer, three allocations and, over a parent
// of a type it does not know, a goroutine, on every store call. A store
// that only checks Err (the in-memory store) makes none of that happen
// here: Err follows the clock and the inherited cancellation. A store that
// asks for Done (a network client) gets a channel closed at the deadline
// or when the inherited context ends.
//
// One difference with the standard contexts: context.Cause of a
// boundedCtx that ended by its own deadline is the cause of the context
// it inherits from (nil while that one is live), since Cause looks for the
// nearest context of the standard library's own type.
//
// It is small (72 bytes) because the holder of every Do carries two: the
// deadline is a reading of the monotonic clock, and what only Done needs
// is allocated by Done.
type boundedCtx struct {
	values   context.Context // for Value
	cancel   context.Context // whose cancellation it inherits; nil for none
	deadline mono

	mu  sync.Mutex
	err error      // set once the context ended (or stop was called)
	ch  *doneState // made by the first Done
}

// doneState is what a boundedCtx needs once Done was asked for.
type doneState struct {
	done   chan struct{}
	timer  *time.Timer
	unwait func() bool // stops the context.AfterFunc on cancel
	afters []*afterFunc
}

// mono is a reading of the monotonic clock: nanoseconds since monoBase.
// Reading it costs about half of time.Now, which also reads the wall
// clock.
type mono int64

var monoBase = time.Now()

func monoNow() mono { return mono(time.Since(monoBase)) }

// monoOf returns t as a mono, saturating far from now.
func monoOf(t time.Time) mono { return mono(t.Sub(monoBase)) }

// since returns the time elapsed since m.
func (m mono) since() time.Duration { return time.Duration(monoNow() - m) }

// time returns m as a time with a monotonic reading.
func (m mono) time() time.Time { return monoBase.Add(time.Duration(m)) }

// add returns m plus d, saturating instead of overflowing.
func (m mono) add(d time.Duration) mono {
	if d > 0 && m > math.MaxInt64-mono(d) {
		return math.MaxInt64
	}
	if d < 0 && m < math.MinInt64-mono(d) {
		return math.MinInt64
	}
	return m + mono(d)
}

// afterFunc is a function registered by AfterFunc, the hook through which
// the context package attaches children without a goroutine each.
type afterFunc struct {
	f       func()
	removed bool
}

// newBoundedCtx returns a context with parent's values, not its
// cancellation, that ends d from now.
func newBoundedCtx(parent context.Context, d time.Duration) *boundedCtx {
	return &boundedCtx{values: parent, deadline: monoNow().add(d)}
}

// withAttemptTimeout returns ctx bounded by d from now: it ends when ctx
// does or at the deadline, whichever is first. Over a boundedCtx it makes
// a flat copy with the earlier deadline rather than a chain.
func withAttemptTimeout(ctx context.Context, d time.Duration) *boundedCtx {
	return new(boundedCtx).initAttempt(ctx, d)
}

// initAttempt makes c, which must be unused, what withAttemptTimeout
// returns, and returns it: c may live inside a larger object.
func (c *boundedCtx) initAttempt(ctx context.Context, d time.Duration) *boundedCtx {
	deadline := monoNow().add(d)
	if p, ok := ctx.(*boundedCtx); ok {
		deadline = min(deadline, p.deadline)
		c.values, c.cancel, c.deadline = p.values, p.cancel, deadline
		p.mu.Lock()
		c.err = p.err // already ended: so is the copy
		p.mu.Unlock()
		return c
	}
	if pd, ok := ctx.Deadline(); ok {
		deadline = min(deadline, monoOf(pd))
	}
	c.values, c.deadline = ctx, deadline
	if ctx.Done() != nil {
		c.cancel = ctx
	}
	return c
}

func (c *boundedCtx) Deadline() (time.Time, bool) { return c.deadline.time(), true }

func (c *boundedCtx) Value(key any) any { return c.values.Value(key) }

func (c *boundedCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		return c.ch.done
	}
	c.ch = &doneState{done: make(chan struct{})}
	if c.err == nil && c.cancel != nil {
		c.err = c.cancel.Err()
	}
	left := time.Duration(c.deadline - monoNow())
	if c.err == nil && left <= 0 {
		c.err = context.DeadlineExceeded
	}
	if c.err != nil {
		close(c.ch.done)
		return c.ch.done
	}
	c.ch.timer = time.AfterFunc(left, func() { c.end(context.DeadlineExceeded) })
	if c.cancel != nil {
		parent := c.cancel
		c.ch.unwait = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	}
	return c.ch.done
}

// Err is consistent with Done once Done has been asked for; before that,
// nobody can observe Done, and the inherited context and the clock decide.
func (c *boundedCtx) Err() error {
	c.mu.Lock()
	err, made := c.err, c.ch != nil
	c.mu.Unlock()
	if err != nil || made {
		return err
	}
	if c.cancel != nil {
		if err := c.cancel.Err(); err != nil {
			return err
		}
	}
	if monoNow() >= c.deadline {
		return context.DeadlineExceeded
	}
	return nil
}

// AfterFunc runs f in its own goroutine once the context ends, as
// context.AfterFunc does. The context package uses it to attach a child
// context without starting a goroutine to watch this one.
func (c *boundedCtx) AfterFunc(f func()) (stop func() bool) {
	c.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	c.ch.afters = append(c.ch.afters, a)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if a.removed {
			return false
		}
		a.removed = true
		return true
	}
}

// end ends the context with err, once, and releases its timer and its
// watch of the inherited context.
func (c *boundedCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.ch
	if c.err == nil {
		c.err = err
		if ch != nil {
			close(ch.done)
			for _, a := range ch.afters {
				if !a.removed {
					a.removed = true
					go a.f()
				}
			}
			ch.afters = nil
		}
	}
	if ch == nil {
		return
	}
	if ch.timer != nil {
		ch.timer.Stop()
	}
	if ch.unwait != nil {
		ch.unwait()
	}
}

// stop ends the context, as a CancelFunc does, releasing its timer, if
// Done made one.
func (c *boundedCtx) stop() { c.end(context.Canceled) }
