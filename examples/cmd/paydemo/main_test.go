package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency/internal/paydemo"
)

// run plays the demo on the backend named by the arguments, as main does,
// and fails the test unless every intent was charged exactly once.
func run(t *testing.T, postgresURL, redisAddr string) *backend {
	t.Helper()
	ctx := context.Background()
	b, err := open(ctx, postgresURL, redisAddr)
	if err != nil {
		t.Fatalf("%v; run scripts/test.sh or point the variable at a reachable server", err)
	}
	var out bytes.Buffer
	ok, err := paydemo.Run(b.store, paydemo.Config{Seed: 3, Lease: b.lease}, &out)
	if cerr := b.close(); cerr != nil {
		t.Errorf("cleaning up %s: %v", b.name, cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%s: some intent was not charged exactly once:\n%s", b.name, out.String())
	}
	for _, row := range []string{"double-click", "timeout-then-retry", "50-concurrent-duplicates", "key-reused-other-amount", "worker-crash-takeover", "flaky-link-20"} {
		if !strings.Contains(out.String(), row) {
			t.Fatalf("%s: no row %s in\n%s", b.name, row, out.String())
		}
	}
	if strings.Contains(out.String(), "FAIL") {
		t.Fatalf("%s: ok, but a row failed:\n%s", b.name, out.String())
	}
	return b
}

func TestDemoPostgres(t *testing.T) {
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL) or set IDEM_POSTGRES_URL")
	}
	b := run(t, url, "")
	if b.lease != paydemo.NetworkLease || !strings.HasPrefix(b.table, "paydemo_") {
		t.Fatalf("backend %+v: want the network lease and a table of its own", b)
	}
	// The run's table is gone, and its sequence with it.
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var table, seq *string
	err = pool.QueryRow(context.Background(), "SELECT to_regclass($1)::text, to_regclass($2)::text",
		`"`+b.table+`"`, `"`+b.table+`_fence_seq"`).Scan(&table, &seq)
	if err != nil {
		t.Fatal(err)
	}
	if table != nil || seq != nil {
		t.Fatalf("table %v, sequence %v left behind", table, seq)
	}
}

func TestDemoRedis(t *testing.T) {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		t.Fatal("IDEM_REDIS_ADDR is not set: run scripts/test.sh (it starts a throwaway Redis) or set IDEM_REDIS_ADDR=host:port")
	}
	b := run(t, "", addr)
	if b.lease != paydemo.NetworkLease || !strings.HasPrefix(b.prefix, "paydemo-") {
		t.Fatalf("backend %+v: want the network lease and a key prefix of its own", b)
	}
	// The run's keys are gone.
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	defer client.Close()
	var keys []string
	iter := client.Scan(context.Background(), 0, b.prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("%d keys left behind under %s, e.g. %s", len(keys), b.prefix, keys[0])
	}
}

func TestDemoFlags(t *testing.T) {
	if _, err := open(context.Background(), "postgres://x", "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("both stores: %v, want an error", err)
	}
	b, err := open(context.Background(), "", "")
	if err != nil || b.name != "in-memory" || b.lease != paydemo.DefaultLease {
		t.Fatalf("no flags: %+v, %v; want the in-memory store", b, err)
	}
}
