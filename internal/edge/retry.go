package edge

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Defaults of the client side's retries, the same on every edge.
const (
	DefaultMaxAttempts = 5
	DefaultMaxElapsed  = 30 * time.Second
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 5 * time.Second
	// DefaultMaxLeaseWait bounds how long after its first attempt a call
	// keeps retrying an answer "in progress" that tells the time left on
	// the holder's lease: twice the server's default lease (30 s), so
	// that a call whose first attempt's holder crashed outlives that lease
	// and its retry takes the record over.
	DefaultMaxLeaseWait = 2 * 30 * time.Second
	// LeaseMargin is how long past the end of the holder's lease a call
	// still retries: time for the store's clock to see the lease ended.
	LeaseMargin = time.Second
)

// ErrKeyExpired is returned by [Backoff.Retry] when the server advertised
// when the key expires and that time has passed, or would pass before the
// next attempt: after it the server no longer knows the key, and a retry
// could run the request a second time. An edge whose server advertises
// expiries exports it as ErrKeyExpired (httpidem).
var ErrKeyExpired = errors.New("idempotency: the key's advertised expiry has passed or would pass before the next attempt, so a retry could run the request again: not retried")

// Backoff is the client side's schedule of retries: at most MaxAttempts
// attempts, each wait drawn from [0, backoff] ("full jitter", so that a
// crowd of clients does not retry in lockstep) with backoff doubling from
// MinBackoff up to MaxBackoff, or the server's hint if that is longer, and
// no attempt started after MaxElapsed from the first, nor after the
// context's deadline. An answer in progress that tells the holder's lease
// ([Answer.LeaseLeft]) extends the schedule to that lease's end, within
// MaxLeaseWait from the first attempt, and does not count against
// MaxAttempts.
type Backoff struct {
	MaxAttempts            int
	MaxElapsed             time.Duration
	MinBackoff, MaxBackoff time.Duration
	MaxLeaseWait           time.Duration
	// Jitter returns a random duration in [0, d]; nil means uniform.
	Jitter func(d time.Duration) time.Duration
	// Sleep waits d or until ctx is done; nil means a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock of the schedule; nil means time.Now.
	Now func() time.Time
}

// DefaultBackoff returns the schedule of the defaults.
func DefaultBackoff() Backoff {
	return Backoff{
		MaxAttempts:  DefaultMaxAttempts,
		MaxElapsed:   DefaultMaxElapsed,
		MinBackoff:   DefaultMinBackoff,
		MaxBackoff:   DefaultMaxBackoff,
		MaxLeaseWait: DefaultMaxLeaseWait,
	}
}

// Check returns the message of the error that refuses b, naming the
// option, or "".
func (b *Backoff) Check() string {
	switch {
	case b.MaxAttempts < 1:
		return "WithMaxAttempts: must be at least 1"
	case b.MaxElapsed <= 0:
		return "WithMaxElapsed: must be positive"
	case b.MinBackoff <= 0 || b.MaxBackoff < b.MinBackoff:
		return "WithBackoff: want 0 < min <= max"
	case b.MaxLeaseWait < 0:
		return "WithMaxLeaseWait: must not be negative"
	}
	return ""
}

// An Answer is what one attempt tells [Backoff.Retry].
type Answer struct {
	// Retry reports that the attempt failed in a way a retry with the same
	// key may fix.
	Retry bool
	// Hint is the server's retry delay (Retry-After, RetryInfo); 0 for none.
	Hint time.Duration
	// LeaseLeft is, for an answer "in progress", the time left on the
	// holder's lease as the server told it; 0 for none.
	LeaseLeft time.Duration
	// Expires is the key's expiry as the server advertised it; zero for
	// none.
	Expires time.Time
	// Discard, when set, is called before waiting for the next attempt
	// (to drain and close a response that will not be returned).
	Discard func()
}

// Retry calls attempt (n counts from 1) until an answer is not to be
// retried or the schedule ends, and returns nil: the last attempt's
// answer stands. It returns ctx's error when ctx ends (the last attempt's
// answer is then not to be used), or [ErrKeyExpired] when the key's
// advertised expiry (the latest any attempt told) has passed or would
// pass before the next attempt.
func (b *Backoff) Retry(ctx context.Context, attempt func(ctx context.Context, n int) Answer) error {
	now := b.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	end := start.Add(b.MaxElapsed)
	leaseEnd := start.Add(b.MaxLeaseWait)
	backoff := b.MinBackoff
	var expires time.Time
	counted := 0
	for n := 1; ; n++ {
		a := attempt(ctx, n)
		if err := ctx.Err(); err != nil {
			return err // the caller gave up: no retry
		}
		if !a.Expires.IsZero() {
			expires = a.Expires
		}
		if !a.Retry {
			return nil
		}
		t := now()
		last := end // the latest start of the next attempt
		if a.LeaseLeft > 0 && b.MaxLeaseWait > 0 {
			// A holder that crashed: its record can be taken over once its
			// lease ends, so follow the lease (within MaxLeaseWait), and
			// do not count the attempt.
			last = maxTime(last, minTime(t.Add(a.LeaseLeft+LeaseMargin), leaseEnd))
		} else if counted++; counted >= b.MaxAttempts {
			return nil
		}
		if !t.Before(last) {
			return nil // the budget, or the lease's, has passed
		}
		wait := b.step(&backoff)
		if last != end && t.Add(wait).After(last) {
			// Following a lease: land the last attempt in it, not past it.
			wait = last.Sub(t)
		}
		wait = max(wait, a.Hint)
		next := t.Add(wait)
		if next.After(last) {
			return nil
		}
		if dl, ok := ctx.Deadline(); ok && !next.Before(dl) {
			return nil // the next attempt would start after the deadline
		}
		if !expires.IsZero() && !next.Before(expires) {
			if a.Discard != nil {
				a.Discard()
			}
			return ErrKeyExpired
		}
		if a.Discard != nil {
			a.Discard()
		}
		if err := b.wait(ctx, wait); err != nil {
			return err
		}
	}
}

func (b *Backoff) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if b.Jitter != nil {
		return b.Jitter(d)
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

func (b *Backoff) wait(ctx context.Context, d time.Duration) error {
	if b.Sleep != nil {
		return b.Sleep(ctx, d)
	}
	return Sleep(ctx, d)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Schedule is the step form of [Backoff.Retry], for a caller that
// schedules its attempts itself instead of waiting between them (the
// client queue, whose items wait in a file): the same attempts, jitter and
// doubling, and the same bounds but the lease's.
type Schedule struct {
	b       *Backoff
	start   time.Time
	backoff time.Duration
	n       int
}

// Start begins the schedule of a call whose first attempt is about to be
// made.
func (b *Backoff) Start() Schedule {
	return Schedule{b: b, start: b.now(), backoff: b.MinBackoff, n: 1}
}

// Next returns how long to wait before the next attempt, given the
// server's hint (0 for none), and false when no attempt is left:
// MaxAttempts were made, or the next would start after MaxElapsed from the
// first, or after deadline (when not zero).
func (s *Schedule) Next(hint time.Duration, deadline time.Time) (time.Duration, bool) {
	b := s.b
	if s.n >= b.MaxAttempts {
		return 0, false
	}
	s.n++
	wait := max(b.step(&s.backoff), hint)
	next := b.now().Add(wait)
	if next.Sub(s.start) > b.MaxElapsed || !deadline.IsZero() && !next.Before(deadline) {
		return 0, false
	}
	return wait, true
}

// Attempt is the number of the attempt about to be made (or last made).
func (s *Schedule) Attempt() int { return s.n }

func (b *Backoff) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// step draws a wait from [0, backoff] and doubles backoff up to
// MaxBackoff, where it stays: doubling without bound would overflow after
// a few dozen attempts into a negative backoff, and the retries would run
// in a tight loop.
func (b *Backoff) step(backoff *time.Duration) time.Duration {
	wait := b.jitter(min(*backoff, b.MaxBackoff))
	if *backoff >= b.MaxBackoff/2 {
		*backoff = b.MaxBackoff
	} else {
		*backoff *= 2
	}
	return wait
}
