package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests run against the PostgreSQL at IDEM_POSTGRES_URL, which
// scripts/test.sh starts (scripts/servers/postgres.sh). Every test binary
// works in a schema of its own, dropped at the end, so runs never see each
// other's rows.

const urlHelp = "IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL), " +
	"or set IDEM_POSTGRES_URL=postgres://user@host:port/db to a server where this user may create schemas"

// testPoolSize is the size of each query mode's shared pool. The three
// pools stay open for the whole run, and the conformance suites run the
// modes side by side, so together with the tests' own pools and LISTEN
// connections the package's tests stay under 50 connections: they fit, with
// room, in a server with PostgreSQL's stock max_connections of 100 (of which
// superuser_reserved_connections keeps 3 for superusers).
const testPoolSize = 10

var (
	setupOnce  sync.Once
	setupErr   error
	testSchema = "idem_test_" + randomHex(6)
	poolsMu    sync.Mutex
	pools      = map[pgx.QueryExecMode]*pgxpool.Pool{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	poolsMu.Lock()
	if p := pools[pgx.QueryExecModeCacheStatement]; p != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+testSchema+" CASCADE"); err != nil {
			fmt.Fprintln(os.Stderr, "dropping the test schema:", err)
		}
		cancel()
	}
	for _, p := range pools {
		p.Close()
	}
	poolsMu.Unlock()
	os.Exit(code)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func testURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("IDEM_POSTGRES_URL")
	if u == "" {
		t.Fatal(urlHelp)
	}
	return u
}

// testPool returns the shared pool for mode (the default, extended
// protocol with cached statements, is pgx.QueryExecModeCacheStatement),
// creating the test schema on first use.
func testPool(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	url := testURL(t)
	setupOnce.Do(func() {
		p, err := openPool(url, pgx.QueryExecModeCacheStatement, testPoolSize)
		if err != nil {
			setupErr = err
			return
		}
		pools[pgx.QueryExecModeCacheStatement] = p
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+testSchema); err != nil {
			setupErr = err
		}
	})
	if setupErr != nil {
		t.Fatalf("cannot use the PostgreSQL at IDEM_POSTGRES_URL (%v); run scripts/test.sh or point IDEM_POSTGRES_URL at a reachable server", setupErr)
	}
	poolsMu.Lock()
	defer poolsMu.Unlock()
	p := pools[mode]
	if p == nil {
		var err error
		if p, err = openPool(url, mode, testPoolSize); err != nil {
			t.Fatalf("cannot use the PostgreSQL at IDEM_POSTGRES_URL (%v); run scripts/test.sh or point IDEM_POSTGRES_URL at a reachable server", err)
		}
		pools[mode] = p
	}
	return p
}

func openPool(url string, mode pgx.QueryExecMode, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// newStore returns a migrated store on db in the test schema, in a table
// of its own unless opts names one.
func newStore(t testing.TB, db postgres.DB, opts *postgres.Options) *postgres.Store {
	t.Helper()
	testPool(t, pgx.QueryExecModeCacheStatement) // creates the test schema, dropped at the end
	var o postgres.Options
	if opts != nil {
		o = *opts
	}
	o.Schema = testSchema
	if o.Table == "" {
		o.Table = "t_" + randomHex(6)
	}
	s, err := postgres.New(db, &o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}
