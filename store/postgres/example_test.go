package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// exampleSchema keeps the examples' tables apart; each example drops it.
const exampleSchema = "idem_example"

// The store behind idempotency.Do: the first call runs fn, a retry with
// the same key replays its result.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+exampleSchema+" CASCADE")

	store, err := postgres.New(pool, &postgres.Options{Schema: exampleSchema})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		log.Fatal(err)
	}

	req := idempotency.Request{Key: "order-1001", Fingerprint: idempotency.FingerprintBytes([]byte(`{"amount":1000}`))}
	charge := func(ctx context.Context) (string, error) { return "charged 10.00", nil }
	for range 2 {
		res, err := idempotency.Do(ctx, runner, req, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Value, "replayed:", res.Replayed)
	}
	// Output:
	// charged 10.00 replayed: false
	// charged 10.00 replayed: true
}

// Transactional mode: the key, the effect and the result commit in the
// caller's transaction. A retry replays; a rollback would have removed all
// three.
func ExampleDoTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+exampleSchema+"_tx CASCADE")

	store, err := postgres.New(pool, &postgres.Options{Schema: exampleSchema + "_tx"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+exampleSchema+"_tx.ledger (id bigserial, account text, cents bigint)"); err != nil {
		log.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		log.Fatal(err)
	}

	deposit := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var id int64
		err := tx.QueryRow(ctx, "INSERT INTO "+exampleSchema+"_tx.ledger (account, cents) VALUES ('alice', 500) RETURNING id").Scan(&id)
		return id, err
	}
	req := idempotency.Request{Scope: []string{"tenant-7"}, Key: "deposit-42"}
	for range 2 {
		// RunInTx runs the transaction again on a serialization failure
		// or deadlock, up to 3 times.
		err := postgres.RunInTx(ctx, pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
			res, err := postgres.DoTx(ctx, runner, tx, req, deposit)
			if err != nil {
				return err
			}
			fmt.Println("ledger row", res.Value, "replayed:", res.Replayed)
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+exampleSchema+"_tx.ledger").Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// ledger row 1 replayed: false
	// ledger row 1 replayed: true
	// ledger rows: 1
}

// Sweep expired rows periodically; several instances may run it at once.
func ExampleStore_Sweep() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+exampleSchema+"_sweep CASCADE")
	store, err := postgres.New(pool, &postgres.Options{Schema: exampleSchema + "_sweep"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// In a service: for range time.Tick(time.Minute) { ... }
	n, err := store.Sweep(ctx, 10_000)
	if err != nil {
		log.Print(err) // correctness never depends on sweeping: try again later
	}
	fmt.Println("deleted", n)
	// Output:
	// deleted 0
}

// The SQL to copy into a golang-migrate, goose or Atlas migration.
func ExampleSchema() {
	sql, err := postgres.Schema(&postgres.Options{Schema: "billing", Table: "idempotency_keys"})
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.Lines(sql) {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Print(line)
		}
	}
	// Output:
	// CREATE SCHEMA IF NOT EXISTS "billing";
	// CREATE SEQUENCE IF NOT EXISTS "billing"."idempotency_keys_fence_seq" AS bigint;
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_keys" (
	// CREATE INDEX IF NOT EXISTS "idempotency_keys_sweep_at_idx" ON "billing"."idempotency_keys" (sweep_at);
}

// With Options.Notify, a duplicate that waits (idempotency.WithWait) is
// woken by the first call's completion through LISTEN/NOTIFY instead of
// polling, and replays its result.
func ExampleOptions_notify() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+exampleSchema+"_notify CASCADE")

	// The listener connects with the pool's configuration; pass
	// ListenConnect to listen on a direct connection when the pool goes
	// through PgBouncer.
	store, err := postgres.New(pool, &postgres.Options{Schema: exampleSchema + "_notify", Notify: true})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // closes the listener's connection, not the pool
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	runner, err := idempotency.New(store, idempotency.WithWait(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	req := idempotency.Request{Key: "order-1002"}
	started, finish := make(chan struct{}), make(chan struct{})
	first := make(chan string)
	go func() {
		res, err := idempotency.Do(ctx, runner, req, func(ctx context.Context) (string, error) {
			close(started)
			<-finish
			return "charged 12.00", nil
		})
		if err != nil {
			log.Fatal(err)
		}
		first <- res.Value
	}()
	<-started
	second := make(chan idempotency.Result[string])
	go func() {
		// Finds the key in progress, waits in store.Watch, wakes at the
		// completion and replays.
		res, err := idempotency.Do(ctx, runner, req, func(ctx context.Context) (string, error) {
			return "charged twice!", nil
		})
		if err != nil {
			log.Fatal(err)
		}
		second <- res
	}()
	time.Sleep(100 * time.Millisecond) // let the duplicate start waiting
	close(finish)
	fmt.Println("first:", <-first)
	res := <-second
	fmt.Println("duplicate:", res.Value, "replayed:", res.Replayed)
	// Output:
	// first: charged 12.00
	// duplicate: charged 12.00 replayed: true
}
