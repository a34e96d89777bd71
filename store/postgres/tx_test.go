package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txEnv is a store, a runner on it and an effects table without a unique
// constraint: only the idempotency key can keep a second row out.
type txEnv struct {
	pool    *pgxpool.Pool
	store   *postgres.Store
	runner  *idempotency.Runner
	table   string // qualified store table
	effects string // qualified effects table
	// hold, when set, is called by payServer's handler after its insert,
	// with the request's key.
	hold func(key string)
}

func newTxEnv(t *testing.T, opts *postgres.Options) *txEnv {
	t.Helper()
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	var o postgres.Options
	if opts != nil {
		o = *opts
	}
	o.Table = "tx_" + randomHex(6)
	s := newStore(t, pool, &o)
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	e := &txEnv{pool: pool, store: s, runner: r,
		table:   testSchema + "." + o.Table,
		effects: testSchema + ".effects_" + randomHex(6)}
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+e.effects+" (id bigserial, key text NOT NULL, note text)"); err != nil {
		t.Fatal(err)
	}
	return e
}

// withRunner replaces e's runner by one on its store with opts.
func (e *txEnv) withRunner(t *testing.T, opts ...idempotency.Option) {
	t.Helper()
	r, err := idempotency.New(e.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	e.runner = r
}

// insertEffect is fn's effect: one row in the effects table. It returns the
// row's id, so every caller can compare the result it got.
func (e *txEnv) insertEffect(key string) func(ctx context.Context, tx pgx.Tx) (int64, error) {
	return func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var id int64
		err := tx.QueryRow(ctx, "INSERT INTO "+e.effects+" (key) VALUES ($1) RETURNING id", key).Scan(&id)
		return id, err
	}
}

func (e *txEnv) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *txEnv) effectRows(t *testing.T, key string) int {
	return e.count(t, "SELECT count(*) FROM "+e.effects+" WHERE key = $1", key)
}

// keyRows counts the store's rows for a client key (no scope).
func (e *txEnv) keyRows(t *testing.T, key string) int {
	sk, err := idempotency.StorageKey(nil, key)
	if err != nil {
		t.Fatal(err)
	}
	return e.count(t, "SELECT count(*) FROM "+e.table+" WHERE key = $1", sk)
}

func req(key string) idempotency.Request {
	return idempotency.Request{Key: key, Fingerprint: idempotency.FingerprintBytes([]byte("body of " + key))}
}

// 32 transactions race on one key, each inserting a row through DoTx: the
// effects table, which has no unique constraint, ends with exactly one row,
// and every caller gets the same result. At READ COMMITTED the duplicates
// wait on the first transaction's row lock (for the default lock wait; one
// that gives up in progress runs its transaction again a little later) and
// replay; at REPEATABLE READ and SERIALIZABLE they fail with 40001 and
// RunInTx runs them again, and then they replay.
func TestTxConcurrentDuplicatesOneEffect(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			e := newTxEnv(t, nil)
			const n = 32
			key := "pay-" + randomHex(4)
			var (
				wg       sync.WaitGroup
				ran      atomic.Int32
				start    = make(chan struct{})
				results  = make([]idempotency.Result[int64], n)
				errs     = make([]error, n)
				attempts = make([]int, n)
			)
			for i := range n {
				wg.Go(func() {
					<-start
					for {
						errs[i] = postgres.RunInTx(t.Context(), e.pool, pgx.TxOptions{IsoLevel: iso}, 50, func(ctx context.Context, tx pgx.Tx) error {
							attempts[i]++
							res, err := postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
								ran.Add(1)
								return e.insertEffect(key)(ctx, tx)
							})
							results[i] = res
							return err
						})
						if !errors.Is(errs[i], idempotency.ErrInProgress) {
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
				})
			}
			close(start)
			wg.Wait()
			fresh := 0
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("caller %d: %v", i, errs[i])
				}
				if !results[i].Replayed {
					fresh++
				}
				if results[i].Value != results[0].Value {
					t.Errorf("caller %d got effect id %d, caller 0 got %d: every caller must get the same result", i, results[i].Value, results[0].Value)
				}
			}
			if fresh != 1 {
				t.Errorf("%d callers were not replays, want exactly 1", fresh)
			}
			if got := e.effectRows(t, key); got != 1 {
				t.Errorf("effects table has %d rows for the key, want exactly 1 (fn ran %d times, commits of the others must have been refused)", got, ran.Load())
			}
			retried := 0
			for _, a := range attempts {
				if a > 1 {
					retried++
				}
			}
			t.Logf("%s: fn ran %d times (rolled-back runs included), %d callers needed more than one attempt", iso, ran.Load(), retried)
		})
	}
}

// After a rollback neither the key nor the effect exists, and the next call
// runs fn exactly once; the call after that replays.
func TestTxRollbackThenRunOnce(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	key := "rb-" + randomHex(4)

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := postgres.DoTx(ctx, e.runner, tx, req(key), e.insertEffect(key))
	if err != nil || res.Replayed {
		t.Fatalf("first DoTx: %+v, %v", res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.effectRows(t, key); n != 0 {
		t.Fatalf("after rollback: %d effect rows, want 0", n)
	}
	if n := e.keyRows(t, key); n != 0 {
		t.Fatalf("after rollback: %d key rows, want 0", n)
	}

	var ran atomic.Int32
	run := func() idempotency.Result[int64] {
		var res idempotency.Result[int64]
		err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
				ran.Add(1)
				return e.insertEffect(key)(ctx, tx)
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first := run()
	second := run()
	if ran.Load() != 1 || first.Replayed || !second.Replayed || first.Value != second.Value {
		t.Fatalf("after the rollback: fn ran %d times, results %+v then %+v; want one run, then a replay of the same value", ran.Load(), first, second)
	}
	if n := e.effectRows(t, key); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

// fn's context in DoTx carries the lease as Do's does: FromContext gives
// the client key, storage key, fence and attempt of the claim, and
// DownstreamKey is the same when the caller rolls its transaction back and
// runs the request again, and when DoTx takes over a record a crashed Do
// holder left STARTED. Step runs its step and records nothing: the
// transaction is the recovery point.
func TestTxContextCarriesLease(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()

	type run struct {
		info    idempotency.Info
		ok      bool
		down    string
		downErr error
		stepErr error
		stepRan bool
	}
	var runs []run
	fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
		var r run
		r.info, r.ok = idempotency.FromContext(ctx)
		r.down, r.downErr = idempotency.DownstreamKey(ctx, "pay")
		_, r.stepErr = idempotency.Step(ctx, "charge", func(context.Context) (int, error) {
			r.stepRan = true
			return 1, nil
		})
		runs = append(runs, r)
		return r.down, r.downErr
	}
	errRollback := errors.New("the caller rolls back")
	// doTx runs DoTx for rq in a transaction that commits, or rolls back
	// after DoTx succeeded.
	doTx := func(rq idempotency.Request, commit bool) idempotency.Result[string] {
		t.Helper()
		var res idempotency.Result[string]
		err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = postgres.DoTx(ctx, e.runner, tx, rq, fn)
			if err == nil && !commit {
				err = errRollback
			}
			return err
		})
		if commit && err != nil || !commit && !errors.Is(err, errRollback) {
			t.Fatalf("DoTx(%s), commit %v: %v", rq.Key, commit, err)
		}
		return res
	}
	// check compares what fn saw in its last run with the claim's result.
	check := func(what string, rq idempotency.Request, res idempotency.Result[string], attempt int) run {
		t.Helper()
		sk, err := e.runner.StorageKey(rq)
		if err != nil {
			t.Fatal(err)
		}
		r := runs[len(runs)-1]
		want := idempotency.Info{Key: rq.Key, StorageKey: sk, Fence: res.Fence, Attempt: attempt}
		if !r.ok || r.info != want || res.Attempt != attempt {
			t.Errorf("%s: FromContext in fn = %+v, %v (result attempt %d); want %+v", what, r.info, r.ok, res.Attempt, want)
		}
		if r.downErr != nil || !strings.HasPrefix(r.down, "pay:") || len(r.down) != len("pay:")+32 {
			t.Errorf("%s: DownstreamKey in fn = %q, %v", what, r.down, r.downErr)
		}
		if r.stepErr != nil || !r.stepRan {
			t.Errorf("%s: Step in fn: %v, step ran %v; want the step run, without an error (the transaction is the recovery point)", what, r.stepErr, r.stepRan)
		}
		return r
	}

	// A request run, rolled back by the caller, run again and committed,
	// then replayed.
	rq := req("ctx-" + randomHex(4))
	rolledBack := doTx(rq, false)
	a := check("first run (rolled back)", rq, rolledBack, 1)
	committed := doTx(rq, true)
	b := check("second run (committed)", rq, committed, 1)
	if a.down != b.down {
		t.Errorf("DownstreamKey changed across the rollback: %q, then %q", a.down, b.down)
	}
	if committed.Fence <= rolledBack.Fence {
		t.Errorf("fence %d after the rollback, not above the rolled-back claim's %d", committed.Fence, rolledBack.Fence)
	}
	replay := doTx(rq, true)
	if !replay.Replayed || replay.Value != b.down || len(runs) != 2 {
		t.Fatalf("third call: %+v after %d runs of fn; want a replay of %q without running fn", replay, len(runs), b.down)
	}
	if _, ok := idempotency.FromContext(ctx); ok {
		t.Error("FromContext outside fn reports a lease")
	}

	// Another request: rolled back once, then its key is claimed by a
	// holder (as Do claims it) that dies; DoTx takes the record over
	// once the lease is over, in attempt 2, with the same downstream key.
	rq2 := req("ctx2-" + randomHex(4))
	c := check("other request (rolled back)", rq2, doTx(rq2, false), 1)
	if c.down == a.down {
		t.Errorf("two requests share the downstream key %q", c.down)
	}
	sk2, err := e.runner.StorageKey(rq2)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := e.store.Claim(ctx, idempotency.ClaimRequest{Key: sk2, Fingerprint: rq2.Fingerprint, Token: "dead-holder", Lease: time.Millisecond, Grace: time.Hour})
	if err != nil || dead.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim of the dying holder: %+v, %v", dead, err)
	}
	time.Sleep(50 * time.Millisecond) // past the 1ms lease; the record stays an hour
	took := doTx(rq2, true)
	d := check("takeover", rq2, took, 2)
	if d.down != c.down {
		t.Errorf("DownstreamKey changed in the takeover: %q, then %q", c.down, d.down)
	}
	if took.Fence <= dead.Fence {
		t.Errorf("takeover fence %d not above the dead holder's %d", took.Fence, dead.Fence)
	}
}

// The backend is killed with pg_terminate_backend after DoTx claimed the
// key and fn wrote its effect, before the commit: nothing of it survives,
// and a retry runs fn once.
func TestTxKilledBackend(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	key := "kill-" + randomHex(4)

	conn, err := pgx.Connect(ctx, testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	pid := conn.PgConn().PID()

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
		id, err := e.insertEffect(key)(ctx, tx)
		if err != nil {
			return 0, err
		}
		// Kill our own backend from another connection, mid-transaction.
		var killed bool
		if err := e.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
			t.Errorf("pg_terminate_backend(%d): %v, %v", pid, killed, err)
		}
		return id, nil
	})
	// DoTx's completion runs on the dead connection: it must fail, not
	// pretend the result was recorded.
	if err == nil {
		t.Fatalf("DoTx on a killed backend returned %+v and no error", res)
	}
	var se *idempotency.StoreError
	if !errors.As(err, &se) || !se.Ran {
		t.Errorf("DoTx error %v: want a *idempotency.StoreError with Ran set", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit on a killed backend succeeded")
	}
	if n := e.effectRows(t, key); n != 0 {
		t.Fatalf("after the kill: %d effect rows, want 0", n)
	}
	if n := e.keyRows(t, key); n != 0 {
		t.Fatalf("after the kill: %d key rows, want 0", n)
	}

	var ran int
	for range 2 {
		err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
			_, err := postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
				ran++
				return e.insertEffect(key)(ctx, tx)
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if ran != 1 || e.effectRows(t, key) != 1 {
		t.Fatalf("retries after the kill ran fn %d times and left %d effect rows; want 1 and 1", ran, e.effectRows(t, key))
	}
}

// A duplicate waits on the first transaction's row lock and then replays
// its result.
func TestTxDuplicateWaitsThenReplays(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	key := "wait-" + randomHex(4)

	first, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(context.Background())
	res1, err := postgres.DoTx(ctx, e.runner, first, req(key), e.insertEffect(key))
	if err != nil {
		t.Fatal(err)
	}

	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	type outcome struct {
		res idempotency.Result[int64]
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		o.err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			o.res, err = postgres.DoTx(ctx, e.runner, tx, req(key), e.insertEffect(key))
			return err
		})
		done <- o
	}()
	waitForLockWait(t, e.pool, pid)
	select {
	case o := <-done:
		t.Fatalf("the duplicate returned %+v, %v while the first transaction was open", o.res, o.err)
	default:
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || !o.res.Replayed || o.res.Value != res1.Value {
		t.Fatalf("duplicate after the commit: %+v, %v; want a replay of %d", o.res, o.err, res1.Value)
	}
	if n := e.effectRows(t, key); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

// waitForLockWait waits until the backend pid is blocked on a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		err := pool.QueryRow(t.Context(), "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("backend %d never waited on a lock", pid)
}

// With TxLockWait set, a duplicate gives up after that long with an
// InProgressError, and its own transaction is not aborted: it can still
// write and commit.
func TestTxLockWaitInProgress(t *testing.T) {
	const wait = 150 * time.Millisecond
	e := newTxEnv(t, &postgres.Options{TxLockWait: wait})
	ctx := t.Context()
	key := "lw-" + randomHex(4)

	first, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(context.Background())
	if _, err := postgres.DoTx(ctx, e.runner, first, req(key), e.insertEffect(key)); err != nil {
		t.Fatal(err)
	}

	second, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback(context.Background())
	if _, err := second.Exec(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = postgres.DoTx(ctx, e.runner, second, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
		ran = true
		return 0, nil
	})
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || !errors.Is(err, idempotency.ErrInProgress) || ran {
		t.Fatalf("duplicate with a lock wait: %v (fn ran: %v); want an *idempotency.InProgressError without running fn", err, ran)
	}
	// The caller's transaction survived, with its own lock_timeout back.
	var lt string
	if err := second.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt); err != nil {
		t.Fatalf("the caller's transaction was aborted by the lock wait: %v", err)
	}
	if lt != "7s" {
		t.Errorf("lock_timeout after DoTx is %q, want the caller's 7s", lt)
	}
	if _, err := second.Exec(ctx, "INSERT INTO "+e.effects+" (key, note) VALUES ($1, 'other work')", key+"-other"); err != nil {
		t.Fatal(err)
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.effectRows(t, key+"-other"); n != 1 {
		t.Fatalf("the second transaction's own write: %d rows, want 1", n)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.effectRows(t, key); n != 1 {
		t.Fatalf("%d effect rows for the key, want 1", n)
	}
}

// A transient error from fn undoes the claim and fn's writes but leaves the
// caller's transaction usable; a permanent one undoes fn's writes, is
// recorded, and replays after the commit.
func TestTxErrors(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()

	t.Run("transient", func(t *testing.T) {
		key := "transient-" + randomHex(4)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		boom := errors.New("gateway timeout")
		_, err = postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
			if _, err := e.insertEffect(key)(ctx, tx); err != nil {
				return 0, err
			}
			// A failing statement aborts the transaction; the savepoint
			// must repair that.
			_, _ = tx.Exec(ctx, "SELECT 1/0")
			return 0, boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("DoTx: %v, want fn's error", err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key, note) VALUES ($1, 'after')", key); err != nil {
			t.Fatalf("the caller's transaction is unusable after a transient error: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t, "SELECT count(*) FROM "+e.effects+" WHERE key = $1 AND note IS NULL", key); n != 0 {
			t.Errorf("fn's write survived a transient error: %d rows", n)
		}
		if n := e.keyRows(t, key); n != 0 {
			t.Errorf("the key survived a transient error: %d rows", n)
		}
	})

	t.Run("permanent", func(t *testing.T) {
		key := "permanent-" + randomHex(4)
		declined := idempotency.Permanent(errors.New("card declined"))
		var ran int
		for i := range 2 {
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res, err := postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
				ran++
				if _, err := e.insertEffect(key)(ctx, tx); err != nil {
					return 0, err
				}
				return 0, declined
			})
			if !errors.Is(err, idempotency.ErrPermanent) || err.Error() != "card declined" {
				t.Fatalf("call %d: %v, want the permanent error", i, err)
			}
			if i == 1 && !res.Replayed {
				t.Errorf("second call: not a replay")
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if ran != 1 {
			t.Errorf("fn ran %d times, want 1 (the permanent error replays)", ran)
		}
		if n := e.effectRows(t, key); n != 0 {
			t.Errorf("fn's write survived its permanent error: %d rows", n)
		}
	})

	t.Run("panic", func(t *testing.T) {
		key := "panic-" + randomHex(4)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the panic did not go on")
				}
			}()
			_, _ = postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
				if _, err := e.insertEffect(key)(ctx, tx); err != nil {
					return 0, err
				}
				panic("bug")
			})
		}()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if e.effectRows(t, key) != 0 || e.keyRows(t, key) != 0 {
			t.Error("fn's write or the key survived a panic")
		}
	})

	t.Run("mismatch", func(t *testing.T) {
		key := "mm-" + randomHex(4)
		err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
			_, err := postgres.DoTx(ctx, e.runner, tx, req(key), e.insertEffect(key))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		other := idempotency.Request{Key: key, Fingerprint: "another body"}
		err = postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
			_, err := postgres.DoTx(ctx, e.runner, tx, other, e.insertEffect(key))
			return err
		})
		if !errors.Is(err, idempotency.ErrMismatch) {
			t.Fatalf("reused key with another fingerprint: %v, want ErrMismatch", err)
		}
	})
}

// Plain Do and DoTx share the table: a result completed by Do replays in
// DoTx, and a result committed by DoTx replays in Do.
func TestTxAndDoShareRecords(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	k1, k2 := "mix1-"+randomHex(4), "mix2-"+randomHex(4)
	if _, err := idempotency.Do(ctx, e.runner, req(k1), func(ctx context.Context) (int64, error) { return 41, nil }); err != nil {
		t.Fatal(err)
	}
	err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
		res, err := postgres.DoTx(ctx, e.runner, tx, req(k1), e.insertEffect(k1))
		if err == nil && (!res.Replayed || res.Value != 41) {
			err = fmt.Errorf("DoTx after Do: %+v, want a replay of 41", res)
		}
		if err != nil {
			return err
		}
		_, err = postgres.DoTx(ctx, e.runner, tx, req(k2), func(ctx context.Context, tx pgx.Tx) (int64, error) { return 42, nil })
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := idempotency.Do(ctx, e.runner, req(k2), func(ctx context.Context) (int64, error) { return 0, errors.New("must not run") })
	if err != nil || !res.Replayed || res.Value != 42 {
		t.Fatalf("Do after DoTx: %+v, %v; want a replay of 42", res, err)
	}
}

// At REPEATABLE READ a duplicate whose snapshot predates the first
// transaction's commit gets a serialization failure: an error matching
// ErrRetryable that still wraps the *pgconn.PgError, and the next attempt
// replays.
func TestTxSerializationFailureIsRetryable(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	key := "rr-" + randomHex(4)

	late, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(context.Background())
	if _, err := late.Exec(ctx, "SELECT 1"); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	err = postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
		_, err := postgres.DoTx(ctx, e.runner, tx, req(key), e.insertEffect(key))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = postgres.DoTx(ctx, e.runner, late, req(key), e.insertEffect(key))
	var pe *pgconn.PgError
	if !errors.Is(err, postgres.ErrRetryable) || !postgres.IsRetryable(err) || !errors.As(err, &pe) || pe.Code != "40001" {
		t.Fatalf("DoTx in a stale REPEATABLE READ snapshot: %v; want ErrRetryable wrapping SQLSTATE 40001", err)
	}
	var attempts int
	err = postgres.RunInTx(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, 3, func(ctx context.Context, tx pgx.Tx) error {
		attempts++
		res, err := postgres.DoTx(ctx, e.runner, tx, req(key), e.insertEffect(key))
		if err == nil && !res.Replayed {
			err = errors.New("not a replay")
		}
		return err
	})
	if err != nil || attempts != 1 {
		t.Fatalf("a fresh transaction: %v after %d attempts, want a replay at once", err, attempts)
	}
	if n := e.effectRows(t, key); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

// RunInTx runs the transaction again on 40001/40P01 and gives up after
// maxAttempts with an error still matching ErrRetryable; other errors are
// not retried.
func TestRunInTxAttempts(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	for _, code := range []string{"40001", "40P01"} {
		attempts := 0
		err := postgres.RunInTx(ctx, pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
			attempts++
			// Raise the SQLSTATE for real, from the server.
			_, err := tx.Exec(ctx, fmt.Sprintf("DO $$ BEGIN RAISE EXCEPTION 'test' USING ERRCODE = '%s'; END $$", code))
			return err
		})
		if attempts != 3 || !postgres.IsRetryable(err) {
			t.Errorf("SQLSTATE %s: %d attempts, error %v; want 3 attempts and a retryable error", code, attempts, err)
		}
	}
	attempts := 0
	err := postgres.RunInTx(ctx, pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
		attempts++
		_, err := tx.Exec(ctx, "SELECT 1/0")
		return err
	})
	if attempts != 1 || err == nil || postgres.IsRetryable(err) {
		t.Errorf("division by zero: %d attempts, %v; want 1 attempt and a non-retryable error", attempts, err)
	}
}

// A replay in a transaction keeps no lock on the key's row: another
// transaction's claim of the key, while the first is still open, replays
// too instead of waiting for it and giving up in progress.
func TestTxReplayHoldsNoLock(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	key := "rl-" + randomHex(4)
	if err := postgres.RunInTx(ctx, e.pool, pgx.TxOptions{}, 1, func(ctx context.Context, tx pgx.Tx) error {
		_, err := postgres.DoTx(ctx, e.runner, tx, req(key), e.insertEffect(key))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var open [2]pgx.Tx
	for i := range open {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		open[i] = tx
		res, err := postgres.DoTx(ctx, e.runner, tx, req(key), func(ctx context.Context, tx pgx.Tx) (int64, error) {
			t.Error("fn ran for a completed key")
			return 0, nil
		})
		if err != nil || !res.Replayed {
			t.Fatalf("replay %d, with the earlier replay's transaction still open: %+v, %v; want a replay", i+1, res, err)
		}
	}
	if n := e.effectRows(t, key); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

// A lock wait that the runner's store timeout would cut short (it bounds
// the claim) is refused by DoTx and NewTxExecutor, naming the option.
func TestTxLockWaitLongerThanStoreTimeoutRefused(t *testing.T) {
	e := newTxEnv(t, &postgres.Options{TxLockWait: 2 * time.Second})
	ctx := t.Context()
	// The default store timeout is 2 s.
	if _, err := postgres.NewTxExecutor(e.pool, e.runner, nil); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "TxLockWait") {
		t.Fatalf("NewTxExecutor: %v; want ErrInvalidArgument naming TxLockWait", err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := postgres.DoTx(ctx, e.runner, tx, req("k"), e.insertEffect("k")); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "TxLockWait") {
		t.Fatalf("DoTx: %v; want ErrInvalidArgument naming TxLockWait", err)
	}
	// With a longer store timeout it is accepted.
	e.withRunner(t, idempotency.WithStoreTimeout(3*time.Second))
	if _, err := postgres.NewTxExecutor(e.pool, e.runner, nil); err != nil {
		t.Fatalf("NewTxExecutor with a store timeout of 3 s: %v", err)
	}
}

// A plain Do (outside a transaction) on a key that a DoTx has claimed in a
// transaction not yet committed waits on that row, as PostgreSQL's INSERT
// ... ON CONFLICT waits for an uncommitted conflicting row: each attempt
// ends at the store timeout, and after the runner's attempts Do answers a
// store error, fn not run (the README's "Mixing the two modes on one
// key"). Once the transaction commits, the plain Do replays its result.
// No effect runs twice either way.
func TestPlainDoOnAKeyHeldByDoTx(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx := t.Context()
	plain, err := idempotency.New(e.store, idempotency.WithStoreTimeout(200*time.Millisecond), idempotency.WithStoreRetries(2, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	first, err := postgres.DoTx(ctx, e.runner, tx, req("held"), e.insertEffect("held"))
	if err != nil || first.Outcome != idempotency.OutcomeCompleted {
		t.Fatalf("DoTx: %+v, %v", first, err)
	}
	ran := false
	res, err := idempotency.Do(ctx, plain, req("held"), func(context.Context) (int64, error) { ran = true; return 0, nil })
	var se *idempotency.StoreError
	if !errors.As(err, &se) || res.Outcome != idempotency.OutcomeStoreError || ran || res.Ran || se.Ran {
		t.Fatalf("plain Do while the transaction is open: %+v, %v, fn ran %v; want a store error, fn not run", res, err, ran)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = idempotency.Do(ctx, plain, req("held"), func(context.Context) (int64, error) { ran = true; return 0, nil })
	if err != nil || !res.Replayed || res.Value != first.Value || ran {
		t.Fatalf("plain Do after the commit: %+v, %v, fn ran %v; want the replay of %d", res, err, ran, first.Value)
	}
	if n := e.effectRows(t, "held"); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}
