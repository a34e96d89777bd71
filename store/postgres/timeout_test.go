package postgres_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/internal/nettest"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// blackHole and closedPort are the shared unreachable servers.
var (
	blackHole  = nettest.BlackHole
	closedPort = nettest.ClosedPort
)

// poolAt returns a pool with pgx's default options but the address, which
// is that of the test server replaced by addr. Making it dials nothing.
func poolAt(t *testing.T, addr string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// doOnce runs one Do on a store on db with opts, checks that it failed with
// a *StoreError without running fn, and returns how long it took and the
// error.
func doOnce(t *testing.T, db postgres.DB, opts ...idempotency.Option) (time.Duration, error) {
	t.Helper()
	s, err := postgres.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := idempotency.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	start := time.Now()
	_, err = idempotency.Do(context.Background(), r, idempotency.Request{Scope: []string{"tenant"}, Key: "k"}, func(context.Context) (int, error) {
		ran = true
		return 1, nil
	})
	took := time.Since(start)
	var se *idempotency.StoreError
	if !errors.As(err, &se) || se.Ran || ran {
		t.Fatalf("Do: %v (fn ran: %v); want a *StoreError, fn not run", err, ran)
	}
	return took, err
}

// TestBlackHole: a database that accepts connections and never answers
// fails Do with a *StoreError within 2s when WithStoreTimeout is 500ms (3
// attempts of 500ms): pgx bounds connecting and queries by the context.
func TestBlackHole(t *testing.T) {
	took, err := doOnce(t, poolAt(t, blackHole(t)), idempotency.WithStoreTimeout(500*time.Millisecond))
	t.Logf("black hole, WithStoreTimeout(500ms): %v: %v", took.Round(time.Millisecond), err)
	if took > 2*time.Second {
		t.Errorf("Do took %v, want at most 2s", took)
	}
}

// TestBlackHoleDefaults: with no option at all, a black-holed database
// fails Do well before 30s (the core's default store timeout bounds each
// attempt).
func TestBlackHoleDefaults(t *testing.T) {
	took, err := doOnce(t, poolAt(t, blackHole(t)))
	t.Logf("black hole, no options: %v: %v", took.Round(time.Millisecond), err)
	if took > 15*time.Second {
		t.Errorf("Do took %v, want well under 30s", took)
	}
}

// TestClosedPort: a database that is not there (connection refused) fails
// Do within 1s, with or without a store timeout, with the connect error.
func TestClosedPort(t *testing.T) {
	for _, opts := range [][]idempotency.Option{nil, {idempotency.WithStoreTimeout(500 * time.Millisecond)}} {
		took, err := doOnce(t, poolAt(t, closedPort(t)), opts...)
		t.Logf("closed port (%d options): %v: %v", len(opts), took.Round(time.Millisecond), err)
		if took > time.Second {
			t.Errorf("Do took %v, want at most 1s", took)
		}
		var ce *pgconn.ConnectError
		if !errors.As(err, &ce) {
			t.Errorf("Do: %v, want an error wrapping *pgconn.ConnectError", err)
		}
	}
}

// TestMigrateBounded: Migrate under a context without a deadline gives up
// after its default bound (shortened here) on a database that never
// answers, instead of hanging; a context with a deadline of its own, here
// longer than the bound, decides instead.
func TestMigrateBounded(t *testing.T) {
	if postgres.DefaultMigrateTimeout <= 0 || postgres.DefaultMigrateTimeout > 5*time.Minute {
		t.Fatalf("DefaultMigrateTimeout %v: want a finite bound of minutes at most", postgres.DefaultMigrateTimeout)
	}
	defer postgres.SetMigrateTimeout(300 * time.Millisecond)()
	s, err := postgres.New(poolAt(t, blackHole(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Migrate(context.Background())
	took := time.Since(start)
	t.Logf("Migrate without a deadline: %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, context.DeadlineExceeded) || took > 3*time.Second {
		t.Errorf("Migrate on a black hole without a deadline: %v after %v; want context.DeadlineExceeded after the bound", err, took)
	}
	if err != nil && !strings.Contains(err.Error(), "deadline") {
		t.Errorf("error %q does not say how to wait longer", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start = time.Now()
	err = s.Migrate(ctx)
	took = time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || took < 900*time.Millisecond || took > 4*time.Second {
		t.Errorf("Migrate with a deadline of 1s: %v after %v; want context.DeadlineExceeded after about 1s", err, took)
	}
}

// TestNotMigrated: a store whose table, fence sequence or schema is
// missing gives errors that say to run Migrate or apply Schema, match
// ErrNotMigrated and still wrap the *pgconn.PgError.
func TestNotMigrated(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	check := func(what string, s *postgres.Store, wantCode string) {
		t.Helper()
		_, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Minute})
		var pe *pgconn.PgError
		if !errors.Is(err, postgres.ErrNotMigrated) || !errors.As(err, &pe) || pe.Code != wantCode {
			t.Fatalf("claim with %s: %v; want ErrNotMigrated wrapping a *pgconn.PgError %s", what, err, wantCode)
		}
		if msg := err.Error(); !strings.Contains(msg, "Migrate") || !strings.Contains(msg, "Schema") {
			t.Errorf("claim with %s: %q does not point at Migrate and Schema", what, msg)
		}
		t.Logf("%s: %v", what, err)
		r, err := idempotency.New(s)
		if err != nil {
			t.Fatal(err)
		}
		_, err = idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"tenant"}, Key: "k"}, func(context.Context) (int, error) { return 1, nil })
		if !errors.Is(err, postgres.ErrNotMigrated) {
			t.Errorf("Do with %s: %v; want ErrNotMigrated", what, err)
		}
	}

	s, err := postgres.New(pool, &postgres.Options{Schema: testSchema, Table: "never_migrated_" + randomHex(4)})
	if err != nil {
		t.Fatal(err)
	}
	testPool(t, pgx.QueryExecModeCacheStatement) // creates testSchema
	check("no table", s, "42P01")

	table := "seqless_" + randomHex(4)
	migrated := newStore(t, pool, &postgres.Options{Table: table})
	if _, err := pool.Exec(ctx, `DROP SEQUENCE "`+testSchema+`"."`+table+`_fence_seq"`); err != nil {
		t.Fatal(err)
	}
	check("no sequence", migrated, "42P01")

	s, err = postgres.New(pool, &postgres.Options{Schema: "no_such_schema_" + randomHex(4)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Minute})
	if !errors.Is(err, postgres.ErrNotMigrated) {
		t.Errorf("claim with no schema: %v; want ErrNotMigrated", err)
	}

	// A migrated store's errors do not match it.
	other := newStore(t, pool, nil)
	if _, err := other.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := other.Renew(ctx, "k", "other", time.Minute); errors.Is(err, postgres.ErrNotMigrated) {
		t.Errorf("renew under another token: %v matches ErrNotMigrated", err)
	}
}
