package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
	"github.com/jackc/pgx/v5"
)

// DefaultTxAttempts is how many times a [TxExecutor] runs a transaction
// lost to a serialization failure or a deadlock, the first included.
const DefaultTxAttempts = 3

// TxExecutorOptions configure a [TxExecutor]. The zero value (or nil)
// means defaults.
type TxExecutorOptions struct {
	// TxOptions are the options of every transaction (isolation level,
	// access mode). Default: the server's default isolation (READ
	// COMMITTED), read-write. At READ COMMITTED a concurrent duplicate
	// waits on the key's row lock for at most [Options.TxLockWait] and
	// then replays, or answers in progress; at REPEATABLE READ or
	// SERIALIZABLE it fails with a serialization failure and its next
	// attempt replays.
	TxOptions pgx.TxOptions
	// MaxAttempts bounds how many times a transaction that fails with a
	// serialization failure or a deadlock ([IsRetryable]) is run again
	// from the start, fn included (its earlier run was rolled back).
	// Default: [DefaultTxAttempts].
	MaxAttempts int
}

// TxExecutor runs functions in transactional mode: each call begins a
// transaction on its DB, runs fn under [DoTx] in it and commits, so the
// idempotency key, every write fn makes through the transaction and fn's
// stored result commit together or not at all. It is an
// [idempotency.Executor]: give it to the HTTP middleware
// (httpidem.New(executor, ...)) to run handlers this way; a handler
// reaches the transaction with [TxFromContext].
//
// Execute reports what [DoTx] reports, and:
//   - a transient error from fn rolls the transaction back and is returned
//     (a retry runs fn again); a permanent one is recorded and committed,
//     and replayed to every retry;
//   - a transaction that cannot begin, record or commit is rolled back and
//     reported as an [*idempotency.StoreError] with Ran false, even when fn
//     ran: its writes were rolled back with the key, so a retry does not
//     repeat them (a commit whose reply was lost may have committed; then
//     the retry replays). An HTTP client then gets 503, never a response
//     whose writes did not commit;
//   - a concurrent duplicate waits on the key's row lock for at most
//     [Options.TxLockWait] (default 50 ms) and replays the first call's
//     result if it commits within that (or runs fn, if it rolled back);
//     else it gives up with an [*idempotency.InProgressError] (HTTP 409).
//     Its transaction, and the connection, are held only for that wait,
//     never for the length of the other call. On a runner with
//     [idempotency.WithWait] it then waits between transactions, holding
//     no connection: it rolls back, pauses (the lock wait at first,
//     doubling up to a second, never past the other holder's retry hint
//     or the end of the runner's wait) and runs a new transaction, until
//     the first call's result replays, fn runs (the first call rolled
//     back) or the wait is over. Each transaction is one call of [DoTx]
//     for the runner's observers.
//
// Beginning and committing are bounded by the runner's store timeout
// ([idempotency.WithStoreTimeout]), so a database that stops answering
// fails the call instead of hanging it; fn's own statements are bounded
// by fn. [idempotency.Step] runs its step without recording it (see
// [DoTx]). Effects outside the database (a call to a payment gateway) are
// not rolled back: give them a downstream key ([idempotency.DownstreamKey]).
type TxExecutor struct {
	db     TxBeginner
	runner *idempotency.Runner
	store  *Store // the runner's
	opts   TxExecutorOptions
}

var _ idempotency.Executor = (*TxExecutor)(nil)

// NewTxExecutor returns an executor that begins its transactions on db (a
// *pgxpool.Pool or a *pgx.Conn; never closed) and runs [DoTx] with r,
// which must be a Runner on a [*Store] (or on a wrapper of one, as for
// [DoTx]). It returns an error wrapping
// [idempotency.ErrInvalidArgument] for a nil db or runner, a runner on
// another store, a store whose [Options.TxLockWait] is not shorter than
// the runner's store timeout, or invalid options.
func NewTxExecutor(db TxBeginner, r *idempotency.Runner, opts *TxExecutorOptions) (*TxExecutor, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: postgres: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
	}
	switch {
	case db == nil:
		return nil, invalid("nil db")
	case r == nil:
		return nil, invalid("nil runner")
	}
	_, b, err := bindTx(context.Background(), r, nil)
	if err != nil {
		return nil, err
	}
	e := &TxExecutor{db: db, runner: r, store: b.store}
	if opts != nil {
		e.opts = *opts
	}
	switch {
	case e.opts.MaxAttempts < 0:
		return nil, invalid("TxExecutorOptions.MaxAttempts must not be negative, got %d", e.opts.MaxAttempts)
	case e.opts.MaxAttempts == 0:
		e.opts.MaxAttempts = DefaultTxAttempts
	}
	return e, nil
}

// Retention is the runner's retention ([idempotency.Runner.Retention]),
// so that an edge on this executor can tell when a key expires.
func (e *TxExecutor) Retention() time.Duration { return e.runner.Retention() }

// Execute runs fn at most once for req in a transaction of its own, as
// [TxExecutor] describes.
func (e *TxExecutor) Execute(ctx context.Context, req idempotency.Request, fn func(ctx context.Context) ([]byte, error)) (idempotency.Result[[]byte], error) {
	if fn == nil {
		return idempotency.Result[[]byte]{}, fmt.Errorf("%w: postgres: nil fn", idempotency.ErrInvalidArgument)
	}
	backoff := 2 * time.Millisecond
	// A duplicate of a running call waits for it between transactions
	// (this one rolled back already), until waited ends.
	waited, stopWait := ctx, context.CancelFunc(func() {})
	if w := e.runner.Wait(); w > 0 {
		waited, stopWait = context.WithTimeout(ctx, w)
	}
	defer stopWait()
	pause := e.store.opts.TxLockWait
	for attempt := 1; ; {
		res, err := e.once(ctx, req, fn)
		if res.Outcome == idempotency.OutcomeInProgress && waited != ctx && waited.Err() == nil {
			if err := edge.Sleep(waited, min(pause, max(res.RetryAfter, time.Millisecond))); err != nil && ctx.Err() != nil {
				return res, ctx.Err()
			}
			// After the last pause (the wait is over), one more
			// transaction, whose answer is the call's.
			pause = min(2*pause, time.Second)
			continue
		}
		if err == nil || attempt >= e.opts.MaxAttempts || !IsRetryable(err) || ctx.Err() != nil {
			return res, err
		}
		attempt++
		if edge.Sleep(ctx, time.Duration(rand.Int64N(int64(backoff)+1))) != nil {
			return res, err
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// once runs one transaction: the completion commits it, inside Do, so
// that a failed commit is seen as the completion's failure by Do and its
// observers.
func (e *TxExecutor) once(ctx context.Context, req idempotency.Request, fn func(ctx context.Context) ([]byte, error)) (res idempotency.Result[[]byte], err error) {
	timeout := e.runner.StoreTimeout()
	bctx, cancel := context.WithTimeout(ctx, timeout)
	tx, err := e.db.BeginTx(bctx, e.opts.TxOptions)
	cancel()
	if err != nil {
		res.Outcome = idempotency.OutcomeStoreError
		return res, &idempotency.StoreError{Op: "begin", Err: wrapErr(bctx, "begin", err)}
	}
	tctx, bound, err := bindTx(ctx, e.runner, tx)
	if err != nil {
		return res, err
	}
	bound.commit = true
	defer func() {
		// Also when fn panicked: the panic goes on after the rollback.
		if !bound.committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	res, err = idempotency.Do(tctx, e.runner, req, fn)
	if res.Outcome == idempotency.OutcomeStoreError && res.Ran {
		// fn's writes were rolled back with the key (or, if the reply of a
		// commit was lost after it, committed: then a retry replays), so a
		// retry repeats nothing that happened.
		res.Ran = false
		res.Value = nil
		var se *idempotency.StoreError
		if errors.As(err, &se) && se.Ran {
			op := se.Op
			if pe := (*storeError)(nil); errors.As(se.Err, &pe) && pe.op == "commit" {
				op = "commit" // the completion's commit, not its statement
			}
			err = &idempotency.StoreError{Op: op, Err: se.Err}
		}
	}
	return res, err
}
