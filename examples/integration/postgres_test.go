package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/idempotency/store/postgres"
)

func TestPostgres(t *testing.T) {
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL) or set IDEM_POSTGRES_URL")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("IDEM_POSTGRES_URL: %v; run scripts/test.sh or point it at a reachable server", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("cannot reach the PostgreSQL at IDEM_POSTGRES_URL (%v); run scripts/test.sh or point it at a reachable server", err)
	}
	schema := fmt.Sprintf("httpidem_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	store, err := postgres.New(pool, &postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	scenario(t, store)
}
