package postgres

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/exactlyonce/idempotency"
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
// r must be a Runner on a *Store, or on a wrapper of one whose method
// Unwrap() idempotency.Store returns it (its table is used); r supplies the key
// validation, codec and error policy, the Store's Options the lock wait
// and retention. A concurrent duplicate in another transaction blocks on
// the key's row lock until the first transaction ends, then replays its
// result (Result.Replayed) or, if it rolled back, runs fn itself; with
// Options.TxLockWait set it gives up after that long with an
// [*idempotency.InProgressError]. The lock wait is scoped to a savepoint,
// so giving up does not abort tx. A key held by a live lease of
// [idempotency.Do] (outside a transaction) also gives an InProgressError.
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
// fn's context carries the lease as [idempotency.Do] gives it to fn: the
// client key, the storage key, the fence and the attempt, so
// [idempotency.FromContext] and [idempotency.DownstreamKey] work inside fn
// (the downstream key is the same in every attempt of the request, also
// after a rollback). [idempotency.Step] is not supported in transactional
// mode and returns an error wrapping [idempotency.ErrInvalidArgument]
// without running its step: the transaction itself is the recovery point,
// as fn's writes commit together with the result or not at all, so there
// is no partial progress to resume.
//
// Serialization failures and deadlocks (SQLSTATE 40001, 40P01), which
// lose the whole transaction, give an error matching [ErrRetryable]: run
// the transaction again from the start, as [RunInTx] does. Other database
// errors are [*idempotency.StoreError] values wrapping pgx's error.
//
// In tx mode, DoTx needs two round trips on top of fn's: one to claim, one
// to record (or, for a replay, to release the savepoint).
func DoTx[T any](ctx context.Context, r *idempotency.Runner, tx pgx.Tx, req idempotency.Request, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (idempotency.Result[T], error) {
	res, _, err := doTx(ctx, r, tx, req, fn)
	return res, err
}

// doTx is DoTx; recorded reports that fn ran and its outcome (a value or
// a permanent error) was recorded in tx, which must then be committed for
// the outcome to last.
func doTx[T any](ctx context.Context, r *idempotency.Runner, tx pgx.Tx, req idempotency.Request, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (res idempotency.Result[T], recorded bool, err error) {
	switch {
	case r == nil:
		return res, false, fmt.Errorf("%w: postgres: nil runner", idempotency.ErrInvalidArgument)
	case tx == nil:
		return res, false, fmt.Errorf("%w: postgres: nil transaction", idempotency.ErrInvalidArgument)
	case fn == nil:
		return res, false, fmt.Errorf("%w: postgres: nil fn", idempotency.ErrInvalidArgument)
	}
	s, ok := unwrapStore(r.Store())
	if !ok {
		return res, false, fmt.Errorf("%w: postgres: DoTx needs a Runner on a *postgres.Store, not %T", idempotency.ErrInvalidArgument, r.Store())
	}
	key, err := r.StorageKey(req)
	if err != nil {
		r.Observe(ctx, idempotency.Event{Kind: idempotency.EventInvalidKey, Scope: req.Scope, Err: err})
		return res, false, err
	}
	cr := idempotency.ClaimRequest{
		Key:         key,
		Fingerprint: req.Fingerprint,
		Token:       newToken(),
		// Nobody sees the row before tx commits, and then it is COMPLETED,
		// so the lease only matters if the caller commits a claim DoTx
		// did not finish (it never does).
		Lease: r.Lease(),
	}
	out, err := s.claimTx(ctx, tx, cr)
	if err != nil {
		return res, false, err
	}
	res.Fence, res.Attempt = out.Fence, out.Attempt
	if out.Outcome != idempotency.OutcomeAcquired {
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+savepointClaim); err != nil {
			return res, false, &idempotency.StoreError{Op: "claim", Err: wrapErr(ctx, "release savepoint", err)}
		}
	}
	ev := idempotency.Event{Key: key, Scope: req.Scope, Fence: out.Fence, Attempt: out.Attempt}
	observe := func(kind idempotency.EventKind, err error) {
		ev.Kind, ev.Err = kind, err
		r.Observe(ctx, ev)
	}
	switch out.Outcome {
	case idempotency.OutcomeReplay:
		res.Replayed = true
		res.Value, err = idempotency.DecodeOutcome[T](r, out.Result)
		observe(idempotency.EventReplayed, err) // as Do: the replayed error, if any
		return res, false, err
	case idempotency.OutcomeMismatch:
		observe(idempotency.EventMismatch, nil)
		return res, false, idempotency.ErrMismatch
	case idempotency.OutcomeInProgress:
		observe(idempotency.EventInProgress, nil)
		return res, false, &idempotency.InProgressError{RetryAfter: out.RetryAfter}
	}
	observe(idempotency.EventAcquired, nil)

	// Acquired: run fn. Cleanup statements run even when ctx is canceled
	// (tx is still the caller's to commit or roll back).
	cleanup := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	}
	panicked := true
	defer func() {
		if panicked {
			cctx, cancel := cleanup()
			defer cancel()
			_ = undoClaim(cctx, tx)
		}
	}()
	fctx := idempotency.NewContext(ctx, idempotency.Info{Key: req.Key, StorageKey: key, Fence: out.Fence, Attempt: out.Attempt})
	v, fnErr := fn(fctx, tx)
	panicked = false

	stored, keep, _ := idempotency.EncodeOutcome(r, v, fnErr)
	if !keep {
		cctx, cancel := cleanup()
		defer cancel()
		if err := undoClaim(cctx, tx); err != nil {
			observe(idempotency.EventStoreError, err)
			return res, false, fmt.Errorf("%w (and undoing the claim failed, so roll the transaction back: %w)", fnErr, err)
		}
		observe(idempotency.EventReleased, fnErr)
		return res, false, fnErr
	}
	if fnErr == nil && len(stored) > s.opts.MaxValueSize {
		// The runner's limit is larger than the store's: as Do does, keep
		// a marker so a retry fails clearly instead of running fn again.
		stored = idempotency.NotStoredMarker()
	}
	if err := s.completeTx(ctx, tx, key, cr.Token, stored, r.Retention(), fnErr != nil); err != nil {
		observe(idempotency.EventStoreError, err)
		return res, false, &idempotency.StoreError{Op: "complete", Ran: true, Err: err}
	}
	observe(idempotency.EventCompleted, nil)
	if fnErr != nil {
		return res, true, fnErr
	}
	res.Value = v
	return res, true, nil
}

// claimTx runs the claim inside a savepoint of tx, under Options.TxLockWait
// if set, and leaves the savepoints set (claim, then fn) for the caller to
// release or roll back to. On an error it rolls back to the savepoint
// first, so tx stays usable unless the error lost it (40001, 40P01, a
// broken connection).
func (s *Store) claimTx(ctx context.Context, tx pgx.Tx, cr idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	wait := s.opts.TxLockWait > 0
	for i := range claimRetries {
		b := &pgx.Batch{}
		if i == 0 {
			b.Queue("SAVEPOINT " + savepointClaim)
		}
		if wait {
			// lock_timeout is set for the claim only: saved in a custom
			// setting and restored in the same batch. If the claim fails,
			// rolling back to the savepoint restores it as well.
			b.Queue("SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true)")
			b.Queue("SELECT set_config('lock_timeout', $1::text, true)", strconv.FormatInt(max(1, s.opts.TxLockWait.Milliseconds()), 10))
		}
		b.Queue(s.sql.claim, cr.Key, string(cr.Fingerprint), string(cr.Token), micros(cr.Lease), micros(cr.Grace))
		if wait {
			b.Queue("SELECT set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true)")
		}
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
				// lock_timeout: another transaction holds the key.
				return res, &idempotency.InProgressError{RetryAfter: s.opts.TxLockWait}
			}
			if _, wrapped := err.(*storeError); !wrapped {
				err = wrapErr(ctx, "claim", err)
			}
			return res, &idempotency.StoreError{Op: "claim", Err: err}
		}
		if ok {
			return res, nil
		}
		// The row was committed after the statement's snapshot: run the
		// claim again (a new statement sees it), inside the same savepoint.
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+savepointFn); err != nil {
			return res, &idempotency.StoreError{Op: "claim", Err: wrapErr(ctx, "claim", err)}
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = undoClaim(cctx, tx)
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Err: fmt.Errorf("postgres: claim: the row of key %q kept changing under the statement %d times; try again", cr.Key, claimRetries)}
}

// completeTx records stored in the row claimed in tx and releases the
// savepoints. For a permanent error (undoFn), fn's writes are rolled back
// first.
func (s *Store) completeTx(ctx context.Context, tx pgx.Tx, key string, token idempotency.Token, stored []byte, retention time.Duration, undoFn bool) error {
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
		t := time.NewTimer(time.Duration(rand.Int64N(int64(backoff) + 1)))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
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

// newToken returns 128 random bits as 32 hex digits, like the tokens of
// idempotency.Do.
func newToken() idempotency.Token {
	var b [16]byte
	crand.Read(b[:]) // never fails (Go 1.24+)
	return idempotency.Token(hex.EncodeToString(b[:]))
}

// unwrapStore finds the *Store under s: s itself, or the store a wrapper
// (an instrumenting one such as otelidem's) returns from its method
// Unwrap() idempotency.Store, through up to 8 wrappers. Transactional
// mode calls the *Store directly, inside the caller's transaction, so a
// wrapper sees none of those calls; the runner's observer still gets
// every event.
func unwrapStore(s idempotency.Store) (*Store, bool) {
	for range 8 {
		switch v := s.(type) {
		case *Store:
			return v, v != nil
		case interface{ Unwrap() idempotency.Store }:
			s = v.Unwrap()
		default:
			return nil, false
		}
	}
	return nil, false
}
