package idempotency

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

type ctxKey struct{}

func TestBoundedCtx(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	c := newBoundedCtx(parent, 50*time.Millisecond)
	defer c.stop()
	cancel()
	if c.Err() != nil {
		t.Fatalf("the caller's cancellation reached the detached context: %v", c.Err())
	}
	if c.Value(ctxKey{}) != "v" {
		t.Fatal("values are lost")
	}
	if d, ok := c.Deadline(); !ok || d.IsZero() {
		t.Fatal("no deadline")
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done never closed")
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err after Done: %v", c.Err())
	}

	// Without Done, Err follows the clock.
	c2 := newBoundedCtx(context.Background(), -time.Second)
	if !errors.Is(c2.Err(), context.DeadlineExceeded) {
		t.Fatalf("past deadline: %v", c2.Err())
	}
	select {
	case <-c2.Done():
	default:
		t.Fatal("Done of a past deadline is not closed")
	}
	// A child context sees the deadline through Done.
	child, ccancel := context.WithCancel(newBoundedCtx(context.Background(), 20*time.Millisecond))
	defer ccancel()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a child never saw the deadline")
	}
}

func TestAttemptCtx(t *testing.T) {
	// It ends with the caller's context, whether or not Done was asked
	// for before.
	for _, early := range []bool{false, true} {
		parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		c := withAttemptTimeout(parent, time.Minute)
		var done <-chan struct{}
		if early {
			done = c.Done()
		}
		if c.Err() != nil || c.Value(ctxKey{}) != "v" {
			t.Fatalf("early=%v: Err %v, value %v", early, c.Err(), c.Value(ctxKey{}))
		}
		cancel()
		if early {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Done never closed after the caller's cancellation")
			}
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("early=%v: Err after the caller's cancellation: %v", early, c.Err())
		}
		c.stop()
	}

	// Over a bounded context: the earlier deadline, and not the caller's
	// cancellation, which the bounded context dropped.
	parent, cancel := context.WithCancel(context.Background())
	b := newBoundedCtx(parent, 30*time.Millisecond)
	c := withAttemptTimeout(b, time.Minute)
	cancel()
	if d, _ := c.Deadline(); !d.Equal(b.deadline.time()) || c.Err() != nil {
		t.Fatalf("deadline %v (want %v), Err %v", d, b.deadline.time(), c.Err())
	}
	child, ccancel := context.WithCancel(c)
	defer ccancel()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a child never saw the deadline")
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err after the deadline: %v", c.Err())
	}
	c.stop()
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("stop changed the error of an ended context: %v", c.Err())
	}
	// Once stopped, a context that had not ended is canceled.
	s := withAttemptTimeout(context.Background(), time.Minute)
	s.stop()
	if !errors.Is(s.Err(), context.Canceled) {
		t.Fatalf("Err after stop: %v", s.Err())
	}
}

// newBoundedCtx returns a context with parent's values, not its
// cancellation, that ends d from now.
func newBoundedCtx(parent context.Context, d time.Duration) *boundedCtx {
	return &boundedCtx{values: parent, deadline: monoNow().add(d)}
}

// withAttemptTimeout returns ctx bounded by d from now, as an attempt's
// context is.
func withAttemptTimeout(ctx context.Context, d time.Duration) *boundedCtx {
	return new(boundedCtx).initAttempt(ctx, d)
}

// Retryable repeats what may be a passing failure, never a definite answer
// or a call whose caller's context is done.
func TestRetryable(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	transient := errors.New("etcdserver: request timed out")
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want bool
	}{
		{live, transient, true},
		{live, fmt.Errorf("postgres: claim: %w", context.DeadlineExceeded), true}, // an attempt's deadline
		{done, transient, false},
		{live, context.Canceled, false},
		{live, fmt.Errorf("store: %w", ErrLeaseLost), false},
		{live, ErrTooLarge, false},
		{live, ErrInvalidArgument, false},
		{live, ErrCorrupt, false},
		{live, ErrNotFound, false},
	} {
		if got := Retryable(c.ctx, c.err); got != c.want {
			t.Errorf("Retryable(ctx done: %v, %v) = %v, want %v", c.ctx.Err() != nil, c.err, got, c.want)
		}
	}
}
