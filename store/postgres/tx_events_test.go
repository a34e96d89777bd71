package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// TestTxEvents: DoTx reports its outcomes as Do does, so an observer
// (such as otelidem's) classifies them alike: a refused key is
// OutcomeInvalidKey, and a replay carries the error it replays.
func TestTxEvents(t *testing.T) {
	e := newTxEnv(t, nil)
	var mu sync.Mutex
	var events []idempotency.Event
	r, err := idempotency.New(e.store, idempotency.WithObserver(idempotency.ObserverFunc(func(ctx context.Context, ev idempotency.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	declined := func(ctx context.Context, tx pgx.Tx) (int, error) {
		return 0, idempotency.Permanent(errors.New("declined"))
	}
	key := "events-" + randomHex(4)
	for range 2 {
		err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
			_, err := postgres.DoTx(ctx, r, tx, req(key), declined)
			if errors.Is(err, idempotency.ErrPermanent) {
				return nil // stored: commit it
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err = postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
		_, err := postgres.DoTx(ctx, r, tx, req(""), declined)
		return err
	})
	if !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var kinds []idempotency.Outcome
	for _, ev := range events {
		kinds = append(kinds, ev.Outcome)
	}
	want := []idempotency.Outcome{idempotency.OutcomeAcquired, idempotency.OutcomeCompleted, idempotency.OutcomeReplay, idempotency.OutcomeInvalidKey}
	if len(kinds) != len(want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("events %v, want %v", kinds, want)
		}
	}
	var se *idempotency.StoredError
	if !errors.As(events[2].Err, &se) || se.Message != "declined" {
		t.Errorf("replay event's error: %v, want the stored error", events[2].Err)
	}
	if !errors.Is(events[3].Err, idempotency.ErrInvalidKey) {
		t.Errorf("invalid key event's error: %v", events[3].Err)
	}
}
