package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// wrapped is an instrumenting wrapper of a store, as otelidem's is.
type wrapped struct{ idempotency.Store }

func (w wrapped) Unwrap() idempotency.Store { return w.Store }

// opaque wraps a store without saying what it wraps.
type opaque struct{ idempotency.Store }

// A runner on a wrapper that unwraps to a *postgres.Store runs DoTx and
// TxExecutor on that store: one effect row and one key row for two calls;
// a wrapper that does not unwrap is refused with ErrInvalidArgument.
func TestTxThroughAWrapper(t *testing.T) {
	e := newTxEnv(t, nil)
	r, err := idempotency.New(wrapped{wrapped{e.store}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var ids [2]int64
	for i := range ids {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			res, err := postgres.DoTx(ctx, r, tx, req("wrapped"), e.insertEffect("wrapped"))
			ids[i] = res.Value
			if err == nil && res.Replayed != (i == 1) {
				t.Errorf("call %d: replayed %v", i, res.Replayed)
			}
			return err
		})
		if err != nil {
			t.Fatalf("DoTx through a wrapper, call %d: %v", i, err)
		}
	}
	if ids[0] != ids[1] || e.effectRows(t, "wrapped") != 1 || e.keyRows(t, "wrapped") != 1 {
		t.Errorf("ids %v, %d effect rows, %d key rows; want one of each and the same id", ids, e.effectRows(t, "wrapped"), e.keyRows(t, "wrapped"))
	}
	if _, err := postgres.NewTxExecutor(e.pool, r, nil); err != nil {
		t.Errorf("NewTxExecutor on a wrapper: %v", err)
	}

	bad, err := idempotency.New(opaque{e.store})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := postgres.DoTx(ctx, bad, tx, req("opaque"), func(context.Context, pgx.Tx) (int64, error) {
			t.Error("fn ran on a runner whose store is not a *postgres.Store")
			return 0, nil
		})
		return err
	})
	if !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("DoTx on an opaque wrapper: %v, want ErrInvalidArgument", err)
	}
	if _, err := postgres.NewTxExecutor(e.pool, bad, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("NewTxExecutor on an opaque wrapper: %v, want ErrInvalidArgument", err)
	}
}
