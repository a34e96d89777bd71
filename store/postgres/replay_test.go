package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestReplayTakesNoLock: a replay of a completed record, a mismatch
// against it and a claim of a record in progress under another holder
// are answered while another transaction holds the row locked FOR UPDATE
// (a claim that locked the row would wait for it), and leave the row's
// version and lock word (xmin, xmax) as they were: they wrote nothing.
// Many replays at once all see the stored result.
//
// It runs with each of Claim's plain statements first.
func TestReplayTakesNoLock(t *testing.T) {
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("readFirst=%v", readFirst), func(t *testing.T) { testReplayTakesNoLock(t, readFirst) })
	}
}

func testReplayTakesNoLock(t *testing.T, readFirst bool) {
	pool, s, qualified := pinnedStore(t, "nolock_", readFirst)
	ctx := t.Context()

	claim := func(ctx context.Context, key, fp string, tok idempotency.Token) (idempotency.ClaimResult, error) {
		return s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: idempotency.Fingerprint(fp), Token: tok, Lease: time.Minute, Grace: time.Minute})
	}
	if res, err := claim(ctx, "done", "fp", "t1"); err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if err := s.Complete(ctx, "done", "t1", []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, err := claim(ctx, "busy", "fp", "t2"); err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	version := func(key string) string {
		t.Helper()
		var v string
		if err := pool.QueryRow(ctx, "SELECT xmin::text || '/' || xmax::text FROM "+qualified+" WHERE key = $1", key).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Hold both rows locked in a transaction of our own.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT FROM "+qualified+" WHERE key IN ('done', 'busy') FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		key, fp string
		tok     idempotency.Token
		want    idempotency.Outcome
	}{
		{"done", "fp", "t3", idempotency.OutcomeReplay},
		{"done", "other", "t4", idempotency.OutcomeMismatch},
		{"busy", "fp", "t5", idempotency.OutcomeInProgress},
		{"busy", "other", "t6", idempotency.OutcomeMismatch},
	}
	run := func(what string) {
		t.Helper()
		for _, c := range cases {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := claim(cctx, c.key, c.fp, c.tok)
			cancel()
			if err != nil || res.Outcome != c.want {
				t.Fatalf("claim of %s (fingerprint %s) %s: %v, %v; want %v", c.key, c.fp, what, res.Outcome, err, c.want)
			}
			if c.want == idempotency.OutcomeReplay && string(res.Result) != "result" {
				t.Errorf("replay of %s: result %q", c.key, res.Result)
			}
		}
	}
	run("beside a row lock (a claim taking the lock would wait for it)")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Our lock left its transaction in xmax; the claims must not change it.
	before := map[string]string{"done": version("done"), "busy": version("busy")}
	run("after the lock")
	for key, v := range before {
		if got := version(key); got != v {
			t.Errorf("row %s: xmin/xmax %s after the claims, %s before: they wrote or locked it", key, got, v)
		}
	}

	// 32 replays at once: all replay the stored result.
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Go(func() {
			res, err := claim(ctx, "done", "fp", idempotency.Token(fmt.Sprintf("r%d", g)))
			if err == nil && (res.Outcome != idempotency.OutcomeReplay || string(res.Result) != "result") {
				err = fmt.Errorf("replay %d: %v %q", g, res.Outcome, res.Result)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := version("done"); got != before["done"] {
		t.Errorf("row done: xmin/xmax %s after 32 concurrent replays, %s before", got, before["done"])
	}
}

// TestExpiredCompletedDoesNotReplay: once its retention has ended by the
// server's clock, a completed record is not replayed from the plain read
// but claimed afresh, with a greater fence.
func TestExpiredCompletedDoesNotReplay(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	s := newStore(t, pool, nil)
	ctx := t.Context()
	first, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "fp", Token: "t1", Lease: time.Minute, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", "t1", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "fp", Token: "t2", Lease: time.Minute, Grace: time.Minute})
	if err != nil || res.Outcome != idempotency.OutcomeAcquired || res.Fence <= first.Fence || res.Attempt != 1 || len(res.Result) != 0 {
		t.Fatalf("claim after the retention ended: %+v, %v; want acquired afresh with a fence above %d", res, err, first.Fence)
	}
}

// countingDB counts the statements run through it.
type countingDB struct {
	postgres.DB
	n atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.DB.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.DB.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.DB.QueryRow(ctx, sql, args...)
}

// TestClaimOrderFollowsTheWorkload: while claims find no row, a claim is
// one statement (the insertion); once most find one (replays), a replay is
// one statement (the read); and back when fresh keys return. Outcomes are
// the same in both orders.
func TestClaimOrderFollowsTheWorkload(t *testing.T) {
	db := &countingDB{DB: testPool(t, pgx.QueryExecModeCacheStatement)}
	s := newStore(t, db, nil)
	ctx := t.Context()
	claim := func(key string, tok idempotency.Token, want idempotency.Outcome) int64 {
		t.Helper()
		before := db.n.Load()
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: tok, Lease: time.Minute, Grace: time.Minute})
		if err != nil || res.Outcome != want {
			t.Fatalf("claim of %s: %v, %v; want %v", key, res.Outcome, err, want)
		}
		return db.n.Load() - before
	}
	fresh := func(round int) {
		t.Helper()
		for i := range 40 {
			key := fmt.Sprintf("fresh-%d-%d", round, i)
			n := claim(key, "t", idempotency.OutcomeAcquired)
			if i >= 20 && n != 1 {
				t.Errorf("fresh claim %d of round %d: %d statements, want 1 (the insertion first)", i, round, n)
			}
			if err := s.Complete(ctx, key, "t", []byte("r"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if postgres.ClaimReadsFirst(s) {
			t.Errorf("after 40 fresh claims the store reads first")
		}
	}
	fresh(0)
	for i := range 40 {
		n := claim("fresh-0-0", idempotency.Token(fmt.Sprintf("r%d", i)), idempotency.OutcomeReplay)
		if i < 10 && n != 2 || i >= 20 && n != 1 {
			t.Errorf("replay %d: %d statements, want %d", i, n, map[bool]int{true: 2, false: 1}[i < 10])
		}
	}
	if !postgres.ClaimReadsFirst(s) {
		t.Errorf("after 40 replays the store inserts first")
	}
	fresh(1)
}
