package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/jackc/pgx/v5"
)

// InboxTx is the transactional form of [inbox.Inbox.Handle]: it processes
// msg at most once for in's consumer inside the caller's transaction tx,
// where the inbox record commits together with what handle writes
// through tx, or rolls back with it. So a consumer whose effects are rows
// in this database applies each event exactly once, and a crash between
// the effect and the acknowledgement leaves nothing half done: the
// redelivery finds the event recorded, or nothing at all.
//
// in's runner must be a Runner on a [*Store]. It reports the delivery as
// [inbox.Inbox.Handle] does (its Disposition says what to tell the broker)
// and the error of [DoTx]; a concurrent
// delivery of the same event waits for this transaction for at most
// [Options.TxLockWait] and then finds the event processed, or gives up
// with an [*idempotency.InProgressError]. Commit tx when the error is nil or
// permanent (so that a poison message is recorded as such), and roll it
// back otherwise.
func InboxTx(ctx context.Context, in *inbox.Inbox, tx pgx.Tx, msg inbox.Message, handle func(ctx context.Context, tx pgx.Tx) error) (inbox.Delivery, error) {
	var err error
	switch {
	case in == nil:
		err = fmt.Errorf("%w: postgres: nil inbox", idempotency.ErrInvalidArgument)
	case handle == nil:
		err = fmt.Errorf("%w: postgres: nil handler", idempotency.ErrInvalidArgument)
	}
	if err != nil {
		return inbox.DeliveryOf(idempotency.OutcomeUnknown, err), err
	}
	res, err := DoTx(ctx, in.Runner(), tx, in.Request(msg), func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		return struct{}{}, handle(ctx, tx)
	})
	return inbox.DeliveryOf(res.Outcome, err), err
}

// InboxBatchTx is the transactional form of [inbox.Inbox.HandleBatch]: it
// handles msgs in one transaction begun on db, each message through
// [InboxTx], so that the inbox records of the batch commit together with
// what handle(ctx, tx, i) writes through tx for msgs[i], or not at all. A
// crash anywhere leaves each event processed with its effects, or not at
// all. in's runner must be a Runner on a [*Store] of the same database.
//
// It returns one Delivery per message, in order. The transaction commits
// when every message got a definite answer (handled now or before, a
// permanent error, a concurrent delivery busy elsewhere); a store error
// rolls it back, and then every message of the batch is [inbox.Retry].
// handle's transient error undoes that message's writes only (a
// savepoint), and that message is Retry.
//
// In a transaction the messages of a batch are claimed one by one: two
// round trips each, on top of handle's, and one to begin and one to
// commit per batch.
//
// A nil inbox, database or handler, an inbox whose runner is not on a
// *Store, and a configuration that InboxTx refuses (Options.TxLockWait
// not shorter than the runner's store timeout) make every message Retry
// with an error wrapping [idempotency.ErrInvalidArgument]: a configuration
// mistake dead-letters nothing.
func InboxBatchTx(ctx context.Context, in *inbox.Inbox, db TxBeginner, msgs []inbox.Message, handle func(ctx context.Context, tx pgx.Tx, i int) error) []inbox.Delivery {
	out := make([]inbox.Delivery, len(msgs))
	retryAll := func(err error) []inbox.Delivery {
		for i := range out {
			out[i] = inbox.DeliveryOf(idempotency.OutcomeStoreError, err)
			out[i].Disposition = inbox.Retry // also for an invalid argument
		}
		return out
	}
	var err error
	switch {
	case in == nil:
		err = fmt.Errorf("%w: postgres: InboxBatchTx: nil inbox", idempotency.ErrInvalidArgument)
	case db == nil:
		err = fmt.Errorf("%w: postgres: InboxBatchTx: nil database", idempotency.ErrInvalidArgument)
	case handle == nil:
		err = fmt.Errorf("%w: postgres: InboxBatchTx: nil handler", idempotency.ErrInvalidArgument)
	}
	if err == nil {
		if _, ok := idempotency.StoreAs[*Store](in.Runner().Store()); !ok {
			err = fmt.Errorf("%w: postgres: InboxBatchTx: the inbox's runner is on a %T, not a *postgres.Store", idempotency.ErrInvalidArgument, in.Runner().Store())
		}
	}
	if err != nil {
		return retryAll(err)
	}
	if len(msgs) == 0 {
		return out
	}
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return retryAll(&idempotency.StoreError{Op: "begin", Err: err})
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit: a no-op
	for i, msg := range msgs {
		d, err := InboxTx(ctx, in, tx, msg, func(ctx context.Context, tx pgx.Tx) error { return handle(ctx, tx, i) })
		var se *idempotency.StoreError
		if errors.As(err, &se) || errors.Is(err, ErrRetryable) || errors.Is(err, idempotency.ErrInvalidArgument) {
			return retryAll(err) // tx is lost, or cannot work: roll everything back
		}
		out[i] = d
	}
	if err := tx.Commit(ctx); err != nil {
		// Maybe committed: a redelivery then finds its event processed.
		return retryAll(&idempotency.StoreError{Op: "commit", Err: err})
	}
	return out
}
