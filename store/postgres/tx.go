package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Savepoints DoTx sets inside the caller's transaction. The claim's lets
// a lock timeout, a transient error of fn or a panic undo the claim and
// fn's writes without aborting the caller's transaction; fn's lets a
// permanent error undo fn's writes but keep the claim, to record the error.
const (
	savepointClaim = "idempotency_claim"
	savepointFn    = "idempotency_fn"
)

// DoTx runs fn at most once for req inside the caller's transaction tx: it
// claims the key in tx, runs fn(ctx, tx), and records fn's result in tx.
// The key, fn's writes and the result commit together when the caller
// commits tx, and vanish together if tx rolls back or the process or
// connection dies first: a later call then runs fn again, once. So writes
// fn makes through tx happen exactly once.
//
// DoTx is [idempotency.Do] itself, with ctx bound to tx for r's store: the
// same loop, the same events, call observers and store-call spans, the
// same Result (its Outcome and Ran). The store, an [idempotency.Transactional]
// store, runs its statements in tx, and Do follows the rules of a call in a
// transaction (see idempotency.Transactional): no lease renewal, as the
// claim holds the key's row lock until tx ends; one attempt per statement;
// no recovery points.
//
// r must be a Runner on a *Store, or on a wrapper of one that keeps its
// capabilities and unwraps to it (idempotency.StoreAs); r supplies the key
// validation, codec, error policy and retention, the Store's Options the
// lock wait. A concurrent duplicate in another transaction waits on the
// key's row lock for at most [Options.TxLockWait] (default
// [DefaultTxLockWait], 50 ms): if the first transaction ends within it,
// the duplicate replays its result (Result.Replayed) or, if it rolled
// back, runs fn itself; else it gives up with an
// [*idempotency.InProgressError] (Outcome OutcomeInProgress). The lock
// wait is scoped to a savepoint, so giving up does not abort tx. A key
// held by a live lease of Do (outside a transaction) also gives an
// InProgressError. The other way round is slower: a plain Do on a key a
// DoTx holds in a transaction not yet committed waits on its row until the
// transaction ends or the attempt's store timeout does, and then answers a
// store error (README: "Mixing the two modes on one key"). A call in a
// transaction never waits for another holder beyond that lock wait, even
// on a runner with [idempotency.WithWait]:
// waiting would hold tx, and its connection, for the length of the other
// call. To wait, end tx and run a new one later (a [TxExecutor] does, on
// a runner with WithWait). A replay, a mismatch or an in-progress answer
// keeps no lock on the key's row: only the transaction that claims the
// key holds it, until it ends.
//
// DoTx returns an error wrapping [idempotency.ErrInvalidArgument] when
// Options.TxLockWait is not shorter than r's store timeout
// ([idempotency.WithStoreTimeout]), which bounds the claim.
//
// What fn returns:
//   - success: the value is recorded and returned;
//   - a transient error (the default): the claim and fn's writes are
//     rolled back to a savepoint, tx stays usable, and the error is
//     returned; a later call runs fn again;
//   - a permanent error ([idempotency.Permanent], or per the Runner's
//     error policy): fn's writes are rolled back, the error is recorded in
//     tx and returned. Commit tx to make it replay to every retry; roll
//     back and a retry runs fn again;
//   - a panic: the claim and fn's writes are rolled back and the panic
//     goes on.
//
// fn's context carries the lease as Do gives it to fn: [idempotency.FromContext]
// and [idempotency.DownstreamKey] work inside fn (the downstream key is the
// same in every attempt of the request, also after a rollback), and
// [idempotency.Step] runs its step and records nothing, since the
// transaction itself is the recovery point: fn's writes commit together
// with the result or not at all. [TxFromContext] returns tx. A call of Do
// with fn's context on a runner of the same Store joins tx too.
//
// Serialization failures and deadlocks (SQLSTATE 40001, 40P01), which
// lose the whole transaction, give an error matching [ErrRetryable]: run
// the transaction again from the start, as [RunInTx] does. Other database
// errors are [*idempotency.StoreError] values wrapping pgx's error; after
// one, roll tx back.
//
// DoTx needs two round trips on top of fn's: one to claim, one to record
// (or, for a replay, to release the savepoint).
func DoTx[T any](ctx context.Context, r *idempotency.Runner, tx pgx.Tx, req idempotency.Request, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (idempotency.Result[T], error) {
	switch {
	case r == nil:
		return idempotency.Result[T]{}, fmt.Errorf("%w: postgres: DoTx: nil runner", idempotency.ErrInvalidArgument)
	case tx == nil:
		return idempotency.Result[T]{}, fmt.Errorf("%w: postgres: DoTx: nil transaction", idempotency.ErrInvalidArgument)
	case fn == nil:
		return idempotency.Result[T]{}, fmt.Errorf("%w: postgres: DoTx: nil fn", idempotency.ErrInvalidArgument)
	}
	ctx, _, err := bindTx(ctx, r, tx)
	if err != nil {
		return idempotency.Result[T]{}, err
	}
	return idempotency.Do(ctx, r, req, func(ctx context.Context) (T, error) { return fn(ctx, tx) })
}

// bindTx returns ctx bound to tx for the *Store under r's store, after
// checking that the runner's store passes the transactional mode on: a
// wrapper that did not would let Do run heartbeats on tx, concurrently with
// fn.
func bindTx(ctx context.Context, r *idempotency.Runner, tx pgx.Tx) (context.Context, *txBinding, error) {
	s, ok := idempotency.StoreAs[*Store](r.Store())
	if !ok {
		return nil, nil, fmt.Errorf("%w: postgres: the transactional mode needs a Runner on a *postgres.Store, not %T", idempotency.ErrInvalidArgument, r.Store())
	}
	if w, limit := s.opts.TxLockWait, r.StoreTimeout(); w >= limit {
		return nil, nil, fmt.Errorf("%w: postgres: Options.TxLockWait (%v) must be shorter than the runner's store timeout (idempotency.WithStoreTimeout, %v), which bounds the claim: a longer lock wait ends as a store error, not as in progress, after holding a connection for the whole store timeout", idempotency.ErrInvalidArgument, w, limit)
	}
	b := &txBinding{store: s, tx: tx}
	ctx = context.WithValue(ctx, txKey{}, b)
	if t := idempotency.CapabilitiesOf(r.Store()).Transactional; t == nil || !t.InTx(ctx) {
		return nil, nil, fmt.Errorf("%w: postgres: the runner's store (%T) does not pass on the Transactional capability of the *postgres.Store it wraps", idempotency.ErrInvalidArgument, r.Store())
	}
	return ctx, b, nil
}

// txBinding is a transaction bound to a context for one store.
type txBinding struct {
	store *Store
	tx    pgx.Tx
	// discard: Discard was called, so the next Complete rolls fn's writes
	// back first, in the same batch.
	discard bool
	// commit: Complete also commits tx (a TxExecutor's, which owns it), so
	// that a failed commit is the completion's failure, seen by Do and its
	// observers; committed says it did.
	commit, committed bool
}

type txKey struct{}

// txOf returns the transaction ctx is bound to for s, or nil.
func (s *Store) txOf(ctx context.Context) *txBinding {
	b, _ := ctx.Value(txKey{}).(*txBinding)
	if b == nil || b.store != s {
		return nil
	}
	return b
}

// dbFor returns the transaction ctx is bound to for s, or s's DB.
func (s *Store) dbFor(ctx context.Context) DB {
	if b := s.txOf(ctx); b != nil {
		return b.tx
	}
	return s.db
}

// TxFromContext returns the transaction a call runs in ([DoTx], a
// [TxExecutor]), from fn's context (for an HTTP handler, the request's
// context).
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	b, _ := ctx.Value(txKey{}).(*txBinding)
	if b == nil {
		return nil, false
	}
	return b.tx, true
}

// InTx implements [idempotency.Transactional]: it reports whether ctx is
// bound to a transaction for s ([DoTx], a [TxExecutor]).
func (s *Store) InTx(ctx context.Context) bool { return s.txOf(ctx) != nil }

// Discard implements [idempotency.Transactional]: the next Complete in
// ctx's transaction first rolls back the writes fn made since the claim
// (to the savepoint the claim set after itself), in the same round trip.
func (s *Store) Discard(ctx context.Context, key string, token idempotency.Token) error {
	b := s.txOf(ctx)
	if b == nil {
		return fmt.Errorf("%w: postgres: Discard outside a transaction", idempotency.ErrInvalidArgument)
	}
	b.discard = true
	return nil
}

// claimTx runs the claim inside a savepoint of tx, under Options.TxLockWait,
// and leaves the savepoints set (claim, then fn) for the caller to
// release or roll back to. On an error it rolls back to the savepoint
// first, so tx stays usable unless the error lost it (40001, 40P01, a
// broken connection).
func (s *Store) claimTx(ctx context.Context, tx pgx.Tx, cr idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := s.claimTxOnce(ctx, tx, cr)
	if err != nil || res.Outcome == idempotency.OutcomeAcquired || res.RetryAfter == lockWaited {
		return res, err
	}
	// Not the caller's to run (a replay, a mismatch, a key in progress):
	// the claim wrote nothing, and rolling back to its savepoint releases
	// the row lock it took, which would otherwise be held until tx ends and
	// make every other transaction's claim of the key wait for it.
	if err := undoClaim(ctx, tx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	return res, nil
}

// lockWaited marks the in-progress answer of a claim that gave up waiting
// for a lock, whose savepoints claimTxOnce has rolled back already. The
// time left on the other transaction is unknown: a retry after a second
// mostly finds it ended.
const lockWaited = time.Second + 1

// claimTxOnce runs the claim in its savepoints, which it leaves set but
// after a lock wait given up.
func (s *Store) claimTxOnce(ctx context.Context, tx pgx.Tx, cr idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	lockWait := strconv.FormatInt(max(1, (s.opts.TxLockWait+time.Millisecond-1).Milliseconds()), 10)
	for i := range claimRetries {
		b := &pgx.Batch{}
		if i == 0 {
			b.Queue("SAVEPOINT " + savepointClaim)
		}
		// lock_timeout is set for the claim only: saved in a custom
		// setting and restored in the same batch. If the claim fails,
		// rolling back to the savepoint restores it as well.
		b.Queue("SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true)")
		b.Queue("SELECT set_config('lock_timeout', $1::text, true)", lockWait)
		b.Queue(s.sql.claim, cr.Key, string(cr.Fingerprint), string(cr.Token), micros(cr.Lease), micros(cr.Grace))
		b.Queue("SELECT set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true)")
		b.Queue("SAVEPOINT " + savepointFn)

		var (
			res idempotency.ClaimResult
			ok  bool
			err error
		)
		br := tx.SendBatch(ctx, b)
		for j := range b.Len() {
			if b.QueuedQueries[j].SQL == s.sql.claim {
				res, ok, err = s.scanClaim(ctx, br.QueryRow(), cr)
			} else {
				_, err = br.Exec()
			}
			if err != nil {
				break
			}
		}
		if cerr := br.Close(); err == nil && cerr != nil {
			err = wrapErr(ctx, "claim", cerr)
		}
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			uerr := undoClaim(cctx, tx)
			cancel()
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "55P03" && uerr == nil {
				// lock_timeout: another transaction holds the key. The
				// savepoint is gone already.
				return idempotency.ClaimResult{Outcome: idempotency.OutcomeInProgress, RetryAfter: lockWaited}, nil
			}
			if _, wrapped := err.(*storeError); !wrapped {
				err = wrapErr(ctx, "claim", err)
			}
			return res, err
		}
		if ok {
			return res, nil
		}
		// The row was committed after the statement's snapshot: run the
		// claim again (a new statement sees it), inside the same savepoint.
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+savepointFn); err != nil {
			return res, wrapErr(ctx, "claim", err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = undoClaim(cctx, tx)
	return idempotency.ClaimResult{}, fmt.Errorf("postgres: claim: the row of key %q kept changing under the statement %d times; try again", cr.Key, claimRetries)
}

// completeTx records stored in the row claimed in tx and releases the
// savepoints. After Discard (a permanent error), fn's writes are rolled
// back first.
func (s *Store) completeTx(ctx context.Context, bound *txBinding, key string, token idempotency.Token, stored []byte, retention time.Duration) error {
	tx, undoFn := bound.tx, bound.discard
	bound.discard = false
	b := &pgx.Batch{}
	if undoFn {
		b.Queue("ROLLBACK TO SAVEPOINT " + savepointFn)
	}
	b.Queue(s.sql.completeTx, key, string(token), stored, micros(retention))
	b.Queue("RELEASE SAVEPOINT " + savepointClaim)
	br := tx.SendBatch(ctx, b)
	var err error
	if undoFn {
		_, err = br.Exec()
	}
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("the row claimed in this transaction is gone (was the savepoint %s rolled back or released by fn?)", savepointClaim)
		}
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && bound.commit {
		if err = tx.Commit(ctx); err != nil {
			err = wrapErr(ctx, "commit", err)
		} else {
			bound.committed = true
		}
	}
	if err != nil {
		if _, wrapped := err.(*storeError); !wrapped {
			err = wrapErr(ctx, "complete", err)
		}
	}
	return err
}

// undoClaim rolls tx back to the claim's savepoint and releases it.
func undoClaim(ctx context.Context, tx pgx.Tx) error {
	// No arguments: sent as one simple-protocol query.
	_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepointClaim+"; RELEASE SAVEPOINT "+savepointClaim)
	if err != nil {
		return wrapErr(ctx, "rollback to savepoint", err)
	}
	return nil
}

// TxBeginner starts transactions: a *pgxpool.Pool and a *pgx.Conn both
// satisfy it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// RunInTx runs fn in a transaction begun on db with opts and commits it if
// fn returns nil, or rolls it back. When fn or the commit fails with a
// serialization failure or a deadlock ([IsRetryable]), it runs the whole
// transaction again, up to maxAttempts times in all, after a short random
// backoff. The returned error is the last one; when attempts ran out it
// still matches [ErrRetryable].
//
// Use it around [DoTx] at REPEATABLE READ or SERIALIZABLE, where a
// concurrent duplicate's claim fails with 40001 instead of waiting; its
// next attempt replays the result.
func RunInTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, maxAttempts int, fn func(ctx context.Context, tx pgx.Tx) error) error {
	switch {
	case db == nil:
		return fmt.Errorf("%w: postgres: nil db", idempotency.ErrInvalidArgument)
	case fn == nil:
		return fmt.Errorf("%w: postgres: nil fn", idempotency.ErrInvalidArgument)
	case maxAttempts <= 0:
		return fmt.Errorf("%w: postgres: maxAttempts must be positive, got %d", idempotency.ErrInvalidArgument, maxAttempts)
	}
	backoff := 2 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := runTxOnce(ctx, db, opts, fn)
		if err == nil || attempt >= maxAttempts || !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		if edge.Sleep(ctx, time.Duration(rand.Int64N(int64(backoff)+1))) != nil {
			return err
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

func runTxOnce(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return wrapErr(ctx, "begin", err)
	}
	done := false
	defer func() {
		if !done {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = tx.Rollback(cctx)
			cancel()
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		return wrapErr(ctx, "commit", err)
	}
	return nil
}
