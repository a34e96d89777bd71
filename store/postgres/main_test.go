package postgres_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/postgres/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests run against the PostgreSQL at IDEM_POSTGRES_URL, in a schema
// of their own (see internal/pgtest).

var (
	randomHex = pgtest.RandomHex
	testURL   = pgtest.URL
)

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
		pgtest.DropSchema(p, testSchema)
	}
	for _, p := range pools {
		p.Close()
	}
	poolsMu.Unlock()
	os.Exit(code)
}

// testPool returns the shared pool for mode (the default, extended
// protocol with cached statements, is pgx.QueryExecModeCacheStatement),
// creating the test schema on first use.
func testPool(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	url := testURL(t)
	setupOnce.Do(func() {
		p, err := pgtest.OpenPool(url, pgx.QueryExecModeCacheStatement, testPoolSize, "")
		if err != nil {
			setupErr = err
			return
		}
		pools[pgx.QueryExecModeCacheStatement] = p
		setupErr = pgtest.CreateSchema(p, testSchema)
	})
	if setupErr != nil {
		t.Fatal(pgtest.Unreachable(setupErr))
	}
	poolsMu.Lock()
	defer poolsMu.Unlock()
	p := pools[mode]
	if p == nil {
		var err error
		if p, err = pgtest.OpenPool(url, mode, testPoolSize, ""); err != nil {
			t.Fatal(pgtest.Unreachable(err))
		}
		pools[mode] = p
	}
	return p
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
