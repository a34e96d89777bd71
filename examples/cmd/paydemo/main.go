// Command paydemo plays the payments demo of cmd/paydemo on PostgreSQL or
// Redis, and checks that every payment intent was charged exactly once.
//
// It is the same scenario, the same table and the same exit status as
// "go run ./cmd/paydemo" (see that command and package internal/paydemo):
// a payments API behind the httpidem middleware, clients retrying over a
// flaky link that drops responses and duplicates requests, 50 concurrent
// duplicates, a key reused with another amount, and a worker that crashes
// after charging the card and is taken over once its lease ends. It lives
// in the examples module because the root module imports no database
// driver.
//
//	go run ./examples/cmd/paydemo -postgres postgres://user@host:5432/db
//	go run ./examples/cmd/paydemo -redis 127.0.0.1:6379
//	go run ./examples/cmd/paydemo            # the in-memory store
//
// On PostgreSQL it migrates a table of its own (paydemo_<time>_<random>)
// and drops it at the end; on Redis it writes under a key prefix of its
// own (paydemo-<time>-<random>:) and deletes those keys at the end. The
// lease is [paydemo.NetworkLease] (3s) on both, so the crashed payment is
// taken over within a few seconds. Flags -seed and -v are those of
// cmd/paydemo. The exit status is 1 if any intent was charged other than
// once, a client saw an unexpected answer, or the store could not be
// reached.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/paydemo"
	"github.com/exactlyonce/idempotency/store/memory"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

func main() {
	postgresURL := flag.String("postgres", "", "run on the PostgreSQL at this URL (postgres://...)")
	redisAddr := flag.String("redis", "", "run on the Redis at this address (host:port)")
	var cfg paydemo.Config
	cfg.RegisterFlags(flag.CommandLine)
	flag.Parse()
	log.SetFlags(0)
	if flag.NArg() > 0 {
		log.Fatalf("paydemo: unexpected arguments %q", flag.Args())
	}

	start := time.Now()
	// The demo finishes in seconds; if it hangs, that is a failure too.
	time.AfterFunc(time.Minute, func() {
		fmt.Fprintln(os.Stderr, "FAIL: the demo did not finish within a minute")
		os.Exit(1)
	})
	ok, err := demo(context.Background(), *postgresURL, *redisAddr, cfg, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nfinished in %v\n", time.Since(start).Round(10*time.Millisecond))
	if !ok {
		fmt.Println("FAIL: some intent was not charged exactly once, or a client got an unexpected answer")
		os.Exit(1)
	}
	fmt.Println("ok: every intent charged exactly once")
}

// demo opens the store the flags name, runs the scenario on it with the
// table on out and a line saying which store on info, and cleans up.
func demo(ctx context.Context, postgresURL, redisAddr string, cfg paydemo.Config, out, info io.Writer) (bool, error) {
	b, err := open(ctx, postgresURL, redisAddr)
	if err != nil {
		return false, err
	}
	fmt.Fprintf(info, "paydemo: store %s\n", b.name)
	if cfg.Lease == 0 {
		cfg.Lease = b.lease
	}
	ok, err := paydemo.Run(b.store, cfg, out)
	if cerr := b.close(); err == nil && cerr != nil {
		err = fmt.Errorf("paydemo: cleaning up %s: %w", b.name, cerr)
	}
	return ok, err
}

// backend is a store opened for one run of the demo.
type backend struct {
	name  string // for humans
	store idempotency.Store
	lease time.Duration
	// table and prefix name what the run writes to, so that tests can
	// check it is gone after close.
	table, prefix string
	close         func() error // removes what the run wrote, closes clients
}

// open returns the store named by the flags: PostgreSQL, Redis, or the
// in-memory store when both are empty.
func open(ctx context.Context, postgresURL, redisAddr string) (*backend, error) {
	run := fmt.Sprintf("%d_%08x", time.Now().UnixNano(), rand.Uint32())
	switch {
	case postgresURL != "" && redisAddr != "":
		return nil, errors.New("paydemo: give -postgres or -redis, not both")
	case postgresURL != "":
		return openPostgres(ctx, postgresURL, "paydemo_"+run)
	case redisAddr != "":
		return openRedis(ctx, redisAddr, "paydemo-"+run+":")
	}
	store, err := memory.New(nil)
	if err != nil {
		return nil, err
	}
	return &backend{name: "in-memory", store: store, lease: paydemo.DefaultLease, close: func() error { return nil }}, nil
}

func openPostgres(ctx context.Context, url, table string) (*backend, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("paydemo: -postgres: %w", err)
	}
	// Up to ~75 requests are in flight at once. The default pool (one
	// connection per core, at least 4) would queue the heartbeats behind
	// them on a small machine, and open up to 75 connections on a large
	// one; 16 keep up, and leave room on a server with PostgreSQL's stock
	// max_connections (100) for the other tests running beside the demo.
	// A pool_max_conns in the URL still decides.
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = 16
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("paydemo: -postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("paydemo: cannot reach the PostgreSQL at -postgres: %w", err)
	}
	store, err := postgres.New(pool, &postgres.Options{Table: table})
	if err != nil {
		pool.Close()
		return nil, err
	}
	drop := func() error {
		// The fence sequence is owned by the table's column and the index
		// belongs to the table: both go with it.
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := pool.Exec(dctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
		return err
	}
	if err := store.Migrate(pctx); err != nil {
		drop()
		pool.Close()
		return nil, fmt.Errorf("paydemo: migrating table %s: %w", table, err)
	}
	return &backend{
		name:  "postgres, table " + table,
		store: store,
		lease: paydemo.NetworkLease,
		table: table,
		close: func() error {
			defer pool.Close()
			return drop()
		},
	}, nil
}

func openRedis(ctx context.Context, addr, prefix string) (*backend, error) {
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("paydemo: cannot reach the Redis at -redis %s: %w", addr, err)
	}
	store, err := redis.New(client, &redis.Options{Prefix: prefix})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &backend{
		name:   "redis, key prefix " + prefix,
		store:  store,
		lease:  paydemo.NetworkLease,
		prefix: prefix,
		close: func() error {
			defer client.Close()
			return deleteKeys(client, prefix)
		},
	}, nil
}

// deleteKeys deletes the keys under prefix. They would expire on their
// own after the demo's retention (a minute); this leaves nothing behind.
func deleteKeys(client *goredis.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := client.Unlink(ctx, keys[:n]...).Err(); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}
