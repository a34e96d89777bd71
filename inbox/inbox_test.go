package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/memory"
)

func newInbox(t *testing.T, consumer string) *inbox.Inbox {
	t.Helper()
	r, err := idempotency.New(memory.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(r, consumer)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestDecide(t *testing.T) {
	for err, want := range map[error]inbox.Disposition{
		nil:                                              inbox.Ack,
		idempotency.Permanent(errors.New("x")):           inbox.DeadLetter,
		&idempotency.StoredError{Message: "x"}:           inbox.DeadLetter,
		idempotency.ErrMismatch:                          inbox.DeadLetter,
		idempotency.ErrInvalidKey:                        inbox.DeadLetter,
		&idempotency.InProgressError{}:                   inbox.Retry,
		&idempotency.StoreError{Err: errors.New("down")}: inbox.Retry,
		errors.New("transient"):                          inbox.Retry,
	} {
		if got := inbox.Decide(err); got != want {
			t.Errorf("Decide(%v) = %v, want %v", err, got, want)
		}
	}
}

// TestConsumersAndSources: the same event ID from two sources is two
// events; the same event for two consumers is processed by each.
func TestConsumersAndSources(t *testing.T) {
	r, err := idempotency.New(memory.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := inbox.New(r, "a")
	b, _ := inbox.New(r, "b")
	var runs atomic.Int32
	h := func(context.Context) error { runs.Add(1); return nil }
	for _, c := range []struct {
		in  *inbox.Inbox
		msg inbox.Message
	}{
		{a, inbox.Message{Source: "s1", ID: "e"}},
		{a, inbox.Message{Source: "s2", ID: "e"}},
		{b, inbox.Message{Source: "s1", ID: "e"}},
		{a, inbox.Message{Source: "s1", ID: "e"}}, // duplicate
	} {
		if _, err := c.in.Handle(context.Background(), c.msg, h); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", runs.Load())
	}
}

// TestTransientErrorRedelivers: a transient failure releases the event,
// so the redelivery processes it; the effect happens once.
func TestTransientErrorRedelivers(t *testing.T) {
	in := newInbox(t, "c")
	msg := inbox.Message{Source: "s", ID: "e"}
	var effects atomic.Int32
	fail := true
	for range 3 {
		_, err := in.Handle(context.Background(), msg, func(context.Context) error {
			if fail {
				fail = false
				return errors.New("database busy")
			}
			effects.Add(1)
			return nil
		})
		_ = err
	}
	if effects.Load() != 1 {
		t.Fatalf("effects %d, want 1", effects.Load())
	}
}

// TestConcurrentRedeliveries: ten concurrent deliveries of one event make
// one effect; the others are told to retry (in progress) or are
// duplicates.
func TestConcurrentRedeliveries(t *testing.T) {
	in := newInbox(t, "c")
	msg := inbox.Message{Source: "s", ID: "e", Payload: []byte("p")}
	var effects atomic.Int32
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			_, err := in.Handle(context.Background(), msg, func(context.Context) error {
				effects.Add(1)
				return nil
			})
			if d := inbox.Decide(err); d == inbox.DeadLetter {
				t.Errorf("a redelivery was dead-lettered: %v", err)
			}
		})
	}
	wg.Wait()
	if dup, err := in.Handle(context.Background(), msg, func(context.Context) error { effects.Add(1); return nil }); err != nil || !dup {
		t.Fatalf("late redelivery: dup=%v err=%v", dup, err)
	}
	if effects.Load() != 1 {
		t.Fatalf("effects %d, want 1", effects.Load())
	}
	// The same ID with another payload is a producer bug, not a duplicate.
	_, err := in.Handle(context.Background(), inbox.Message{Source: "s", ID: "e", Payload: []byte("other")}, func(context.Context) error { return nil })
	if !errors.Is(err, idempotency.ErrMismatch) || inbox.Decide(err) != inbox.DeadLetter {
		t.Fatalf("reused ID: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := inbox.New(nil, "c"); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil runner: %v", err)
	}
	r, _ := idempotency.New(memory.New(nil))
	if _, err := inbox.New(r, ""); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("empty consumer: %v", err)
	}
	in := newInbox(t, "c")
	if _, err := in.Handle(context.Background(), inbox.Message{Source: "", ID: "e"}, func(context.Context) error { return nil }); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Errorf("empty source: %v", err)
	}
	if _, err := in.Handle(context.Background(), inbox.Message{Source: "s", ID: ""}, func(context.Context) error { return nil }); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Errorf("empty ID: %v", err)
	}
	if _, err := in.Handle(context.Background(), inbox.Message{Source: "s", ID: "e"}, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil handler: %v", err)
	}
}
