package postgres

import (
	"context"
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
