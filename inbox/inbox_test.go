package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
)

func newInbox(t *testing.T, consumer string) *inbox.Inbox {
	t.Helper()
	r, err := idempotency.New(memStore(nil))
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
	for _, c := range []struct {
		o    idempotency.Outcome
		err  error
		want inbox.Disposition
	}{
		{idempotency.OutcomeCompleted, nil, inbox.Ack},
		{idempotency.OutcomeReplay, nil, inbox.Ack},
		{idempotency.OutcomeCompleted, idempotency.Permanent(errors.New("x")), inbox.DeadLetter},
		{idempotency.OutcomeReplay, &idempotency.StoredError{Message: "x"}, inbox.DeadLetter},
		{idempotency.OutcomeMismatch, idempotency.ErrMismatch, inbox.DeadLetter},
		{idempotency.OutcomeInvalidKey, idempotency.ErrInvalidKey, inbox.DeadLetter},
		{idempotency.OutcomeCorrupt, idempotency.ErrCorrupt, inbox.DeadLetter},
		{idempotency.OutcomeResultNotStored, idempotency.ErrResultNotStored, inbox.DeadLetter},
		{idempotency.OutcomeInProgress, &idempotency.InProgressError{}, inbox.Retry},
		{idempotency.OutcomeStoreError, &idempotency.StoreError{Err: errors.New("down")}, inbox.Retry},
		{idempotency.OutcomeReleased, errors.New("transient"), inbox.Retry},
		{idempotency.OutcomeLeaseLost, idempotency.ErrLeaseLost, inbox.Retry},
		{idempotency.OutcomeUnknown, errors.New("who knows"), inbox.Retry},
		{idempotency.OutcomeUnknown, idempotency.ErrInvalidArgument, inbox.DeadLetter},
	} {
		if got := inbox.Decide(c.o, c.err); got != c.want {
			t.Errorf("Decide(%v, %v) = %v, want %v", c.o, c.err, got, c.want)
		}
		// An executor that does not say the outcome: DeliveryOf reads it
		// from the error, into the same disposition.
		if got := inbox.DeliveryOf(idempotency.OutcomeUnknown, c.err).Disposition; c.err != nil && c.o != idempotency.OutcomeReleased && c.o != idempotency.OutcomeCompleted && got != c.want {
			t.Errorf("DeliveryOf(unknown, %v).Disposition = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestConsumersAndSources: the same event ID from two sources is two
// events; the same event for two consumers is processed by each.
func TestConsumersAndSources(t *testing.T) {
	r, err := idempotency.New(memStore(nil))
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
			d, err := in.Handle(context.Background(), msg, func(context.Context) error {
				effects.Add(1)
				return nil
			})
			if d.Disposition == inbox.DeadLetter {
				t.Errorf("a redelivery was dead-lettered: %v", err)
			}
		})
	}
	wg.Wait()
	if d, err := in.Handle(context.Background(), msg, func(context.Context) error { effects.Add(1); return nil }); err != nil || !d.Duplicate || d.Disposition != inbox.Ack {
		t.Fatalf("late redelivery: %+v, %v", d, err)
	}
	if effects.Load() != 1 {
		t.Fatalf("effects %d, want 1", effects.Load())
	}
	// The same ID with another payload is a producer bug, not a duplicate.
	d, err := in.Handle(context.Background(), inbox.Message{Source: "s", ID: "e", Payload: []byte("other")}, func(context.Context) error { return nil })
	if !errors.Is(err, idempotency.ErrMismatch) || d.Disposition != inbox.DeadLetter || d.Outcome != idempotency.OutcomeMismatch {
		t.Fatalf("reused ID: %+v, %v", d, err)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := inbox.New(nil, "c"); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil runner: %v", err)
	}
	r, _ := idempotency.New(memStore(nil))
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
	if d, err := in.Handle(context.Background(), inbox.Message{Source: "s", ID: "e"}, nil); !errors.Is(err, idempotency.ErrInvalidArgument) || d.Disposition != inbox.DeadLetter {
		t.Errorf("nil handler: %+v, %v", d, err)
	}
}

// TestHandleBatch: a poll's messages are handled once each, in order;
// redeliveries inside the batch and in a later one are duplicates; a
// poison message, a transient failure and an invalid ID decide their own
// dispositions only.
func TestHandleBatch(t *testing.T) {
	in := newInbox(t, "c")
	msgs := []inbox.Message{
		{Source: "s", ID: "e1", Payload: []byte("1")},
		{Source: "s", ID: "e2", Payload: []byte("2")},
		{Source: "s", ID: "e1", Payload: []byte("1")}, // redelivered in the same poll
		{Source: "s", ID: "poison", Payload: []byte("x")},
		{Source: "s", ID: "busy", Payload: []byte("b")},
		{Source: "s", ID: "", Payload: []byte("no id")},
		{Source: "s", ID: "e3", Payload: []byte("3")},
	}
	var order []string
	failBusy := true
	handle := func(ctx context.Context, i int) error {
		order = append(order, msgs[i].ID)
		switch msgs[i].ID {
		case "poison":
			return idempotency.Permanent(errors.New("cannot parse"))
		case "busy":
			if failBusy {
				return errors.New("database busy")
			}
		}
		return nil
	}
	want := []inbox.Disposition{inbox.Ack, inbox.Ack, inbox.Ack, inbox.DeadLetter, inbox.Retry, inbox.DeadLetter, inbox.Ack}
	got := in.HandleBatch(context.Background(), msgs, handle)
	for i, d := range got {
		if d.Disposition != want[i] {
			t.Errorf("message %d (%q): %+v, want %v", i, msgs[i].ID, d, want[i])
		}
	}
	if !got[2].Duplicate || got[0].Duplicate {
		t.Errorf("the redelivery in the same poll: %+v, first %+v; want the second a duplicate", got[2], got[0])
	}
	if fmt.Sprint(order) != "[e1 e2 poison busy e3]" {
		t.Errorf("handled %v, want each event once, in order", order)
	}
	failBusy = false
	order = nil
	got = in.HandleBatch(context.Background(), msgs, handle)
	for i, d := range got {
		if msgs[i].ID == "busy" {
			if d.Disposition != inbox.Ack || d.Duplicate {
				t.Errorf("the redelivered busy message: %+v, want handled now", d)
			}
		} else if d.Disposition != want[i] || (msgs[i].ID != "" && !d.Duplicate) {
			t.Errorf("redelivery of message %d (%q): %+v", i, msgs[i].ID, d)
		}
	}
	if fmt.Sprint(order) != "[busy]" {
		t.Errorf("the redelivered poll handled %v, want only the message released before", order)
	}
	if d := in.HandleBatch(context.Background(), msgs[:1], nil); d[0].Disposition != inbox.DeadLetter || !errors.Is(d[0].Err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil handler: %+v", d[0])
	}
}
