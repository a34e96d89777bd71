// Package pgtest is what the store/postgres module's test binaries share:
// the server's URL from IDEM_POSTGRES_URL, pools, schema names.
//
// The tests run against the PostgreSQL at IDEM_POSTGRES_URL, which
// scripts/test.sh starts (scripts/servers/postgres.sh). Every test binary
// works in a schema of its own, dropped at the end, so runs never see each
// other's rows.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// URLHelp says how to get a server when IDEM_POSTGRES_URL is not set.
const URLHelp = "IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL), " +
	"or set IDEM_POSTGRES_URL=postgres://user@host:port/db to a server where this user may create schemas"

// Unreachable is the message of a test that cannot use the server.
func Unreachable(err error) string {
	return fmt.Sprintf("cannot use the PostgreSQL at IDEM_POSTGRES_URL (%v); run scripts/test.sh or point IDEM_POSTGRES_URL at a reachable server", err)
}

// URL returns IDEM_POSTGRES_URL, failing tb when it is not set: a test
// that cannot reach its server fails, it never skips.
func URL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv("IDEM_POSTGRES_URL")
	if u == "" {
		tb.Fatal(URLHelp)
	}
	return u
}

// RandomHex returns 2n random hex digits, for schema and table names.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// OpenPool opens and pings a pool of at most maxConns connections in
// query mode mode, named appName in pg_stat_activity when it is not empty.
func OpenPool(url string, mode pgx.QueryExecMode, maxConns int32, appName string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	if appName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
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

// CreateSchema creates schema on p.
func CreateSchema(p *pgxpool.Pool, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := p.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema)
	return err
}

// DropSchema drops schema and everything in it, reporting a failure on
// stderr (it runs from TestMain, after the tests).
func DropSchema(p *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		fmt.Fprintln(os.Stderr, "dropping the test schema:", err)
	}
}
