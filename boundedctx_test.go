package idempotency

import (
	"context"
	"errors"
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
