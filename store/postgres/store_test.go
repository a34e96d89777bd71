package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestNewRejectsInvalidOptions(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	bad := []postgres.Options{
		{Table: "idem-keys"},
		{Table: "1keys"},
		{Table: `keys"; DROP TABLE users; --`},
		{Table: "keys.other"},
		{Table: strings.Repeat("k", 49)},
		{Table: "ключи"},
		{Schema: "my schema"},
		{Schema: "s;"},
		{MaxValueSize: -1},
		{MaxValueSize: 1 << 30},
		{SweepBatch: -5},
		{TxLockWait: -time.Second},
	}
	for _, o := range bad {
		if _, err := postgres.New(pool, &o); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v, want ErrInvalidArgument", o, err)
		}
		if _, err := postgres.Schema(&o); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("Schema(%+v): %v, want ErrInvalidArgument", o, err)
		}
	}
	if _, err := postgres.New(nil, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("New(nil, nil): %v, want ErrInvalidArgument", err)
	}
	if _, err := postgres.New(pool, &postgres.Options{Schema: "Tenant_1", Table: "_Keys9"}); err != nil {
		t.Errorf("valid names refused: %v", err)
	}
}

func TestSchemaIsIdempotentSQL(t *testing.T) {
	sql, err := postgres.Schema(&postgres.Options{Schema: "app", Table: "idem"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`CREATE SCHEMA IF NOT EXISTS "app"`,
		`CREATE SEQUENCE IF NOT EXISTS "app"."idem_fence_seq"`,
		`CREATE TABLE IF NOT EXISTS "app"."idem"`,
		`CREATE INDEX IF NOT EXISTS "idem_sweep_at_idx" ON "app"."idem" (sweep_at)`,
		`) WITH (fillfactor = 90);`,
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("Schema lacks %q:\n%s", want, sql)
		}
	}
	// Apply the exported SQL twice, as a migration tool would, and use it.
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	opts := &postgres.Options{Schema: testSchema, Table: "exported_" + randomHex(4)}
	sql, err = postgres.Schema(opts)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := pool.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	s, err := postgres.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(t.Context(), idempotency.ClaimRequest{Key: "k", Token: "t", Lease: time.Minute}); err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim on the exported schema: %+v, %v", res, err)
	}
}

// Several instances migrating the same table at once all succeed.
func TestMigrateConcurrently(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	opts := &postgres.Options{Schema: testSchema + "_m" + randomHex(3), Table: "migrated"}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+opts.Schema+" CASCADE") })
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			s, err := postgres.New(pool, opts)
			if err == nil {
				err = s.Migrate(t.Context())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migration %d of 8 concurrent ones: %v", i, err)
		}
	}
	s, _ := postgres.New(pool, opts)
	if err := s.Migrate(t.Context()); err != nil {
		t.Errorf("migrating again: %v", err)
	}
	if _, err := s.Claim(t.Context(), idempotency.ClaimRequest{Key: "k", Token: "t", Lease: time.Minute}); err != nil {
		t.Errorf("claim after migrations: %v", err)
	}
}

// A database that is down gives errors wrapping pgx's error, never an
// outcome: no "not claimed", no ErrLeaseLost.
func TestDatabaseDown(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Port = 1 // nothing listens there
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	check := func(op string, err error) {
		t.Helper()
		var ce *pgconn.ConnectError
		if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || !errors.As(err, &ce) {
			t.Errorf("%s on a database that is down: %v; want an error wrapping *pgconn.ConnectError", op, err)
		}
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Token: "t", Lease: time.Second})
	if res.Outcome != idempotency.OutcomeUnknown {
		t.Errorf("claim on a database that is down decided %v", res.Outcome)
	}
	check("claim", err)
	check("renew", s.Renew(ctx, "k", "t", time.Second))
	check("checkpoint", s.Checkpoint(ctx, "k", "t", "step", []byte("v")))
	check("complete", s.Complete(ctx, "k", "t", []byte("v"), time.Second))
	check("release", s.Release(ctx, "k", "t"))
	_, err = s.Sweep(ctx, 10)
	check("sweep", err)
	check("migrate", s.Migrate(ctx))

	// Through Do: a *StoreError, fn not run.
	r, err := idempotency.New(s, idempotency.WithStoreRetries(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = idempotency.Do(ctx, r, idempotency.Request{Key: "k"}, func(context.Context) (int, error) { ran = true; return 1, nil })
	var se *idempotency.StoreError
	if ran || !errors.As(err, &se) || se.Ran {
		t.Errorf("Do on a database that is down: %v (fn ran: %v); want a *StoreError with Ran false", err, ran)
	}
}

func TestCheckpointTooLargeWritesNothing(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	s := newStore(t, pool, &postgres.Options{MaxValueSize: 100})
	ctx := t.Context()
	if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, "k", "t", "small", make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, "k", "t", "big", make([]byte, 101)); !errors.Is(err, idempotency.ErrTooLarge) {
		t.Fatalf("checkpoint of 101 bytes with a limit of 100: %v, want ErrTooLarge", err)
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Minute})
	if err != nil || len(res.Checkpoints) != 1 || len(res.Checkpoints["small"]) != 100 {
		t.Fatalf("checkpoints after the refused one: %v, %v; want only \"small\"", res.Checkpoints, err)
	}
}

// 10,000 expired records and 100 live ones; two goroutines sweep at once.
// Exactly the expired ones go, each deleted by one sweeper.
func TestSweepTwoSweepers(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	table := "sweep_" + randomHex(4)
	s := newStore(t, pool, &postgres.Options{Table: table, SweepBatch: 250})
	ctx := t.Context()
	const expired, live = 10_000, 100

	// Expired records of both states go in through the store, from 8
	// goroutines: claims with a lease of 1µs and no grace, and claims
	// completed with a retention of 1µs.
	r := func(i int) (string, idempotency.Token) {
		return fmt.Sprintf("expired-%05d", i), idempotency.Token(fmt.Sprintf("tok-%05d", i))
	}
	batchStore := func(n int, each func(s *postgres.Store, i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < n; i += 8 {
					if err := each(s, i); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	batchStore(expired, func(s *postgres.Store, i int) error {
		k, tok := r(i)
		lease := time.Microsecond
		if i%2 == 0 {
			lease = time.Minute // completed below, with a retention of 1µs
		}
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: k, Fingerprint: "f", Token: tok, Lease: lease}); err != nil {
			return err
		}
		if i%2 == 0 {
			return s.Complete(ctx, k, tok, []byte("done"), time.Microsecond)
		}
		return nil
	})
	batchStore(live, func(s *postgres.Store, i int) error {
		k := fmt.Sprintf("live-%03d", i)
		tok := idempotency.Token("live")
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: k, Fingerprint: "f", Token: tok, Lease: time.Hour}); err != nil {
			return err
		}
		if i%2 == 0 {
			return s.Complete(ctx, k, tok, []byte("done"), time.Hour)
		}
		return nil
	})
	var total int
	if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.%s", testSchema, table)).Scan(&total); err != nil || total != expired+live {
		t.Fatalf("%d rows before the sweep (%v), want %d", total, err, expired+live)
	}

	var wg sync.WaitGroup
	counts := make([]int, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { counts[i], errs[i] = s.Sweep(ctx, 0) })
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	if counts[0]+counts[1] != expired {
		t.Errorf("sweepers deleted %d + %d = %d rows, want %d", counts[0], counts[1], counts[0]+counts[1], expired)
	}
	rows, err := pool.Query(ctx, fmt.Sprintf("SELECT key FROM %s.%s ORDER BY key", testSchema, table))
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != live {
		t.Fatalf("%d rows left, want the %d live ones", len(left), live)
	}
	for i, k := range left {
		if want := fmt.Sprintf("live-%03d", i); k != want {
			t.Fatalf("row %d left is %q, want %q", i, k, want)
		}
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 0 {
		t.Errorf("sweeping again: %d, %v; want 0", n, err)
	}
	t.Logf("sweeper 1 deleted %d, sweeper 2 %d", counts[0], counts[1])
}

// The server's clock decides, not the Go process's. There is no way to set
// this process's clock hours off, so the test shows three things instead:
//
//  1. No argument the store ever sends is a time: every statement gets
//     keys, tokens, bytes and durations in microseconds, so nothing of the
//     client's clock reaches a decision. A tracer records every argument
//     of a full claim/renew/checkpoint/complete/release/sweep cycle.
//  2. Every statement reads clock_timestamp(), and none now(),
//     current_timestamp or localtimestamp (which are frozen at the start of
//     the transaction and would judge leases wrong in DoTx).
//  3. The package's code never reads the Go clock (time.Now, time.Since,
//     time.Until) at all.
//
// Together: were the client's clock wrong by hours, every decision would be
// the same. TestLongTransactionUsesStatementClock shows 2 in action.
func TestNoDecisionReadsTheClientClock(t *testing.T) {
	rec := &argRecorder{}
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := newStore(t, pool, nil)
	ctx := t.Context()
	rec.reset()
	req := idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t1", Lease: 50 * time.Millisecond, Grace: time.Minute}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.Claim(ctx, req)
	must(err)
	must(s.Renew(ctx, "k", "t1", 50*time.Millisecond))
	must(s.Checkpoint(ctx, "k", "t1", "step", []byte("v")))
	time.Sleep(60 * time.Millisecond)
	req.Token = "t2"
	if res, err := s.Claim(ctx, req); err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	must(s.Complete(ctx, "k", "t2", []byte("r"), time.Microsecond))
	must(s.Release(ctx, "other", "t"))
	_, err = s.Sweep(ctx, 0)
	must(err)

	stmts := rec.all()
	if len(stmts) < 7 {
		t.Fatalf("recorded %d statements, want at least 7", len(stmts))
	}
	frozen := regexp.MustCompile(`(?i)\bnow\s*\(|current_timestamp|localtimestamp|transaction_timestamp|statement_timestamp`)
	for _, st := range stmts {
		for i, a := range st.args {
			switch a.(type) {
			case string, []byte, int64:
			default:
				t.Errorf("argument $%d of %s is a %T (%v): only keys, tokens, bytes and durations may be sent", i+1, firstLine(st.sql), a, a)
			}
		}
		if !strings.Contains(st.sql, "clock_timestamp()") {
			t.Errorf("statement does not read clock_timestamp(): %s", firstLine(st.sql))
		}
		if frozen.MatchString(st.sql) {
			t.Errorf("statement reads a frozen or client-side time: %s", st.sql)
		}
	}

	// The package's own code: no time.Now, time.Since or time.Until.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" {
				switch sel.Sel.Name {
				case "Now", "Since", "Until":
					t.Errorf("%s reads the client's clock: time.%s", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// Inside one long transaction (a store on a pgx.Tx, as DoTx's claims run)
// leases are judged by the clock at each statement: a 100ms lease claimed
// early in the transaction has ended 150ms later and is taken over. Had
// the SQL used now(), the transaction's start time, the lease would look
// live forever.
func TestLongTransactionUsesStatementClock(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	s := newStore(t, tx, nil)
	ctx := t.Context()
	req := idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t1", Lease: 100 * time.Millisecond, Grace: time.Minute}
	if _, err := s.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	req.Token = "t2"
	if res, err := s.Claim(ctx, req); err != nil || res.Outcome != idempotency.OutcomeInProgress || res.RetryAfter <= 0 || res.RetryAfter > 100*time.Millisecond {
		t.Fatalf("claim while the lease is live: %+v, %v; want InProgress with 0 < RetryAfter <= 100ms", res, err)
	}
	time.Sleep(150 * time.Millisecond)
	res, err := s.Claim(ctx, req)
	if err != nil || res.Outcome != idempotency.OutcomeAcquired || res.Attempt != 2 {
		t.Fatalf("claim 150ms later in the same transaction: %+v, %v; want a takeover (attempt 2)", res, err)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

type recorded struct {
	sql  string
	args []any
}

// argRecorder is a pgx tracer that records every statement and its
// arguments.
type argRecorder struct {
	mu    sync.Mutex
	stmts []recorded
}

func (r *argRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.stmts = append(r.stmts, recorded{d.SQL, d.Args})
	r.mu.Unlock()
	return ctx
}

func (r *argRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *argRecorder) reset() {
	r.mu.Lock()
	r.stmts = nil
	r.mu.Unlock()
}

func (r *argRecorder) all() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.stmts...)
}

// TestMigrateUpgradesAnOldTable: Migrate on a table made by the schema
// before sweep_at adds the column (with a default, so that the old
// statements, which do not write it, still insert), drops that schema's
// two indexes, and leaves a table the store then works on.
func TestMigrateUpgradesAnOldTable(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	table := "old_" + randomHex(6)
	q := testSchema + "." + table
	for _, sql := range []string{
		`CREATE TABLE ` + q + ` (key text COLLATE "C" NOT NULL PRIMARY KEY, fingerprint text NOT NULL, state text NOT NULL,
			token text NOT NULL, fence bigint NOT NULL, attempt integer NOT NULL, lease_until timestamptz NOT NULL,
			grace interval NOT NULL, expires_at timestamptz NOT NULL, checkpoints jsonb, result bytea, created_at timestamptz NOT NULL)`,
		`CREATE INDEX ` + table + `_expires_at_idx ON ` + q + ` (expires_at)`,
		`CREATE INDEX ` + table + `_started_idx ON ` + q + ` (key) WHERE state = 'started'`,
		`INSERT INTO ` + q + ` VALUES ('old', 'f', 'completed', 't', 1, 1, clock_timestamp(), '0', clock_timestamp() + interval '1 hour', NULL, 'r', clock_timestamp())`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t, pool, &postgres.Options{Table: table})
	var indexes []string
	rows, err := pool.Query(ctx, "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY 1", testSchema, table)
	if err == nil {
		indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{table + "_pkey", table + "_sweep_at_idx"}; strings.Join(indexes, " ") != strings.Join(want, " ") {
		t.Errorf("indexes after Migrate: %v, want %v", indexes, want)
	}
	// The old version's insert, without sweep_at, still works.
	if _, err := pool.Exec(ctx, `INSERT INTO `+q+` (key, fingerprint, state, token, fence, attempt, lease_until, grace, expires_at, created_at)
		VALUES ('old2', 'f', 'started', 't', 2, 1, clock_timestamp(), '0', clock_timestamp(), clock_timestamp())`); err != nil {
		t.Errorf("an insert without sweep_at after the upgrade: %v", err)
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "old", Fingerprint: "f", Token: "new", Lease: time.Minute})
	if err != nil || res.Outcome != idempotency.OutcomeReplay {
		t.Errorf("claim of the old table's record: %+v, %v; want a replay", res, err)
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 1 {
		t.Errorf("Sweep after the upgrade: %d, %v; want the one expired row", n, err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Errorf("Migrate again: %v", err)
	}
}

// Store.Key names the record's row: the value of the table's key column
// for the storage key Do used.
func TestKeyNamesTheRow(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	table := "key_" + randomHex(6)
	s := newStore(t, pool, &postgres.Options{Table: table})
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := idempotency.Request{Scope: []string{"tenant-1"}, Key: "order-7"}
	if _, err := idempotency.Do(ctx, r, req, func(context.Context) (string, error) { return "v", nil }); err != nil {
		t.Fatal(err)
	}
	sk, err := r.StorageKey(req)
	if err != nil {
		t.Fatal(err)
	}
	var state string
	q := "SELECT state FROM " + pgx.Identifier{testSchema, table}.Sanitize() + " WHERE key = $1"
	if err := pool.QueryRow(ctx, q, s.Key(sk)).Scan(&state); err != nil || state != "completed" {
		t.Fatalf("the row of Key(%q): state %q, %v; want completed", sk, state, err)
	}
}
