package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// TestInboxTx: an event delivered ten times concurrently and ten times
// one after another is applied once, its row and its inbox record
// committing together; a concurrent delivery that finds the first one's
// transaction still running after the lock wait is told to retry; a
// handler failure rolls both back and the redelivery applies it.
func TestInboxTx(t *testing.T) {
	e := newTxEnv(t, nil)
	in, err := inbox.New(e.runner, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	// deliver delivers msg in a transaction of its own, and reports the
	// delivery and the error of its last attempt.
	deliver := func(msg inbox.Message, fail bool) (inbox.Delivery, error) {
		var last inbox.Delivery
		err := postgres.RunInTx(t.Context(), e.pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
			d, err := postgres.InboxTx(ctx, in, tx, msg, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := e.insertEffect(msg.ID)(ctx, tx); err != nil {
					return err
				}
				if fail {
					return errors.New("downstream refused")
				}
				return nil
			})
			last = d
			return err
		})
		return last, err
	}
	msg := inbox.Message{Source: "payments", ID: "evt-1", Payload: []byte(`{"credit":1}`)}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			d, err := deliver(msg, false)
			var ip *idempotency.InProgressError
			switch {
			case errors.As(err, &ip):
				if d.Disposition != inbox.Retry {
					t.Errorf("concurrent delivery in progress: %+v; want it told to retry", d)
				}
			case err != nil:
				t.Errorf("concurrent delivery: %v", err)
			}
		})
	}
	wg.Wait()
	for range 10 {
		if d, err := deliver(msg, false); err != nil || !d.Duplicate || d.Disposition != inbox.Ack {
			t.Fatalf("sequential delivery: %+v, %v; want a duplicate to ack", d, err)
		}
	}
	if n := e.effectRows(t, "evt-1"); n != 1 {
		t.Fatalf("%d effect rows after 20 deliveries, want 1", n)
	}

	bad := inbox.Message{Source: "payments", ID: "evt-2"}
	if d, err := deliver(bad, true); err == nil || d.Disposition != inbox.Retry || d.Outcome != idempotency.OutcomeReleased {
		t.Fatalf("failing delivery: %+v, %v; want a transient error, released, to retry", d, err)
	}
	sk, _ := idempotency.StorageKey(in.Request(bad).Scope, bad.ID)
	if rows, keys := e.effectRows(t, "evt-2"), e.count(t, "SELECT count(*) FROM "+e.table+" WHERE key = $1", sk); rows != 0 || keys != 0 {
		t.Fatalf("after the failed delivery: %d rows, %d inbox records; want none", rows, keys)
	}
	if _, err := deliver(bad, false); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	if n := e.effectRows(t, "evt-2"); n != 1 {
		t.Fatalf("%d rows after the redelivery, want 1", n)
	}
	if _, err := postgres.InboxTx(t.Context(), nil, nil, msg, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("nil inbox: %v", err)
	}
}
