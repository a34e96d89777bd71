package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres/outbox"
)

// Backlog reports, by the server's clock, what waits (and how much of it
// failed an attempt), what a relay holds, what is dead and how old the
// oldest undelivered event is, through a relay's whole cycle: enqueued,
// claimed and being sent, recorded after the relay stopped mid-send, and
// redriven.
func TestBacklog(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	ctx := context.Background()
	backlog := func(what string) outbox.Backlog {
		t.Helper()
		b, err := tb.Backlog(ctx)
		if err != nil {
			t.Fatalf("Backlog (%s): %v", what, err)
		}
		return b
	}
	check := func(what string, got, want outbox.Backlog) {
		t.Helper()
		got.OldestPending, want.OldestPending = 0, 0
		if got != want {
			t.Errorf("Backlog %s: %+v, want %+v", what, got, want)
		}
	}
	check("of an empty outbox", backlog("empty"), outbox.Backlog{})

	// 3 delivered, 2 held by the sender until the relay stops, 2
	// dead-lettered at once, 1 failing with a long backoff.
	var evs []outbox.Event
	for topic, n := range map[string]int{"ok": 3, "block": 2, "perm": 2, "fail": 1} {
		for range n {
			evs = append(evs, outbox.Event{ID: outbox.NewEventID(), Topic: topic})
		}
	}
	enqueue(t, pool, tb, len(evs), evs)
	const aged = 50 * time.Millisecond
	time.Sleep(aged)
	b := backlog("enqueued")
	check("enqueued", b, outbox.Backlog{Pending: 8})
	if b.OldestPending < aged || b.OldestPending > time.Hour {
		t.Errorf("OldestPending %v after waiting %v", b.OldestPending, aged)
	}

	var blocked sync.WaitGroup
	blocked.Add(2)
	send := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		switch m.Topic {
		case "block":
			blocked.Done()
			<-ctx.Done()
			return ctx.Err()
		case "perm":
			return idempotency.Permanent(errors.New("410 gone"))
		case "fail":
			return errors.New("503")
		}
		return nil
	})
	stop := start(t, newRelay(t, tb, send, outbox.RelayOptions{Parallelism: 8, Backoff: time.Hour, MaxBackoff: time.Hour}))
	blocked.Wait()
	// The batch is claimed and not recorded: all of it is in flight.
	check("while the relay sends", backlog("sending"), outbox.Backlog{InFlight: 8})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The interrupted sends count as attempts and are available again;
	// the failed one waits out its backoff.
	b = backlog("stopped")
	check("after the relay stopped", b, outbox.Backlog{Pending: 3, Retrying: 3, Dead: 2})
	if b.OldestPending < aged {
		t.Errorf("OldestPending %v, want at least %v", b.OldestPending, aged)
	}

	if n, err := tb.RedriveAll(ctx); err != nil || n != 2 {
		t.Fatalf("RedriveAll: %d, %v; want 2", n, err)
	}
	check("after RedriveAll", backlog("redriven"), outbox.Backlog{Pending: 5, Retrying: 3})
	if n, err := tb.RedriveAll(ctx); err != nil || n != 0 {
		t.Fatalf("RedriveAll of no dead letters: %d, %v", n, err)
	}
}

// RedriveAll redrives every event dead when it is called, in statements
// of CleanupBatch events, each once: with a relay running whose receiver
// still refuses every event, the redriven events die again while it
// works, and it neither redrives them twice nor runs forever. Once the
// receiver is fixed, one more call delivers them all.
func TestRedriveAll(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, &outbox.Options{CleanupBatch: 2})
	rec := newRecorder()
	var mu sync.Mutex
	broken := true
	rec.setFail(func(m outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if broken {
			return idempotency.Permanent(errors.New("410 gone"))
		}
		return nil
	})
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
	evs := events(5, nil)
	enqueue(t, pool, tb, 5, evs)
	waitDead(t, tb, 5)

	n, err := tb.RedriveAll(context.Background())
	if err != nil || n != 5 {
		t.Fatalf("RedriveAll with the receiver still refusing: %d, %v; want 5", n, err)
	}
	waitDead(t, tb, 5)
	for _, e := range evs {
		if got := rec.triesOf(e.ID); got != 2 {
			t.Errorf("event %s sent %d times, want 2 (before and after the redrive)", e.ID, got)
		}
	}

	mu.Lock()
	broken = false
	mu.Unlock()
	if n, err := tb.RedriveAll(context.Background()); err != nil || n != 5 {
		t.Fatalf("RedriveAll: %d, %v; want 5", n, err)
	}
	waitFor(t, 15*time.Second, "the redriven events", func() bool { return rec.distinct() == 5 })
	// The receiver has them all; the relay marks each delivered after the
	// receiver's answer, so the backlog empties a moment later (CI saw
	// InFlight 5 when it was read at once).
	waitFor(t, 15*time.Second, "an empty backlog after delivering everything", func() bool {
		b, err := tb.Backlog(context.Background())
		return err == nil && b == (outbox.Backlog{})
	})
}

// Run returns nil when its context ends, by cancellation or deadline: that
// is how a relay is stopped, not a failure.
func TestRunReturnsNilWhenStopped(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	r := newRelay(t, tb, newRecorder(), outbox.RelayOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(50 * time.Millisecond) // running, idle
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context was canceled: %v, want nil", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	if err := r.Run(dctx); err != nil {
		t.Fatalf("Run after its context's deadline: %v, want nil", err)
	}
}
