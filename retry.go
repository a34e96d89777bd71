package idempotency

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Bounded store calls: every call [Do] makes to its store is an attempt
// bounded by the store timeout, repeated with the same token after an error
// that may be transient, which rule 4 of [Store] makes safe.

// maxStoreBackoff bounds the doubling backoff between store attempts.
const maxStoreBackoff = 5 * time.Second

// retry calls f until it succeeds, fails with an error that is not worth
// retrying, or runs out of attempts. Each call repeats the same store
// operation with the same token, which rule 4 of [Store] makes safe. With
// [WithStoreTimeout], each attempt has its own deadline. When ctx ends
// during a backoff, the error matches both ctx's error and the store's.
func (r *Runner) retry(ctx context.Context, f func(context.Context) error) error {
	return r.retryIn(ctx, nil, r.cfg.storeAttempts, f)
}

// retryIn is retry with at most attempts attempts (1 in a transaction: see
// [Transactional]) and first, when not nil, as the storage of the first
// attempt's context: a caller that makes one store call per request (the
// holder's Complete or Release) saves an allocation. first is used once.
func (r *Runner) retryIn(ctx context.Context, first *boundedCtx, attempts int, f func(context.Context) error) error {
	backoff := min(r.cfg.storeBackoff, maxStoreBackoff)
	for attempt := 1; ; attempt++ {
		err := r.attempt(ctx, first, f)
		first = nil
		if err == nil || attempt >= attempts || !Retryable(ctx, err) {
			return err
		}
		// Full jitter keeps a crowd of retries from landing together.
		d := time.Duration(rand.Int64N(int64(backoff) + 1))
		backoff = min(2*backoff, maxStoreBackoff)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ctx.Err(), err)
		case <-t.C:
		}
	}
}

func (r *Runner) attempt(ctx context.Context, storage *boundedCtx, f func(context.Context) error) error {
	if r.cfg.storeTimeout <= 0 {
		return f(ctx)
	}
	if storage == nil {
		storage = new(boundedCtx)
	}
	actx := storage.initAttempt(ctx, r.cfg.storeTimeout)
	defer actx.stop()
	return f(actx)
}

// Retryable reports whether err, the error of a store call made with ctx,
// is worth repeating the call for, with the same token (rule 4 of [Store]
// makes that safe): not when ctx is done, nor when the store gave a
// definite answer ([ErrLeaseLost], [ErrTooLarge], [ErrInvalidArgument],
// [ErrCorrupt], [ErrNotFound], a canceled context). A deadline the caller
// did not set (an attempt's, a driver's) leaves the outcome unknown, which
// a repeat resolves. err is not nil. [Do] repeats such calls, and so do
// the conformance suite's bursts.
func Retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrTooLarge) &&
		!errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrCorrupt) &&
		!errors.Is(err, ErrNotFound) && !errors.Is(err, context.Canceled)
}

// boundedCtx is a context with a deadline whose channel and timer are made
// only when someone asks for Done. It bounds two kinds of store call:
//
//   - the calls after fn returns (the holder's Complete or Release): a
//     boundedCtx with the caller's values but not its cancellation (a
//     Complete cut short by a departed caller would leave the key to be
//     taken over and fn run again), ending at a deadline, so a store that
//     hangs cannot hold the call forever;
//   - one attempt of any store call ([Runner.attempt]): the caller's
//     context, or such a boundedCtx, bounded by the store timeout.
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

// initAttempt makes c, which must be unused, ctx bounded by d from now: it
// ends when ctx does or at the deadline, whichever is first. Over a
// boundedCtx it makes a flat copy with the earlier deadline rather than a
// chain. It returns c, which may live inside a larger object.
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
