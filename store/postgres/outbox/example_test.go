package outbox_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/postgres/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// An order and its event commit in one transaction; a relay delivers the
// event, here to a function (in a service: a broker, a webhook).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS outbox_example CASCADE")

	table, err := outbox.New(pool, &outbox.Options{Schema: "outbox_example"})
	if err != nil {
		log.Fatal(err)
	}
	if err := table.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE outbox_example.orders (id text PRIMARY KEY, cents bigint)"); err != nil {
		log.Fatal(err)
	}

	// The business change and its event, in one transaction.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO outbox_example.orders VALUES ('order-1', 1000)"); err != nil {
			return err
		}
		return table.Enqueue(ctx, tx, outbox.Event{
			ID:      "order-1-placed", // receivers de-duplicate on it
			Topic:   "orders",
			Key:     "order-1", // the events of one order arrive in order
			Payload: []byte(`{"order":"order-1","cents":1000}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	delivered := make(chan outbox.Message, 1)
	relay, err := outbox.NewRelay(table, outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		delivered <- m
		return nil
	}), nil)
	if err != nil {
		log.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(rctx) }()
	m := <-delivered
	stop()
	<-done
	fmt.Printf("%s %s %s (attempt %d)\n", m.ID, m.Topic, m.Payload, m.Attempt)
	// Output: order-1-placed orders {"order":"order-1","cents":1000} (attempt 1)
}

// Inside postgres.DoTx the event commits with the idempotency key and the
// effect: the retry of a request replays its result and enqueues nothing.
func Example_doTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS outbox_example_tx CASCADE")

	store, err := postgres.New(pool, &postgres.Options{Schema: "outbox_example_tx"})
	if err != nil {
		log.Fatal(err)
	}
	table, err := outbox.New(pool, &outbox.Options{Schema: "outbox_example_tx"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := table.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		log.Fatal(err)
	}

	pay := func(key string) {
		err := postgres.RunInTx(ctx, pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
			res, err := postgres.DoTx(ctx, runner, tx, idempotency.Request{Key: key}, func(ctx context.Context, tx pgx.Tx) (string, error) {
				// ... the payment's own writes through tx ...
				id, err := idempotency.DownstreamKey(ctx, "payment-captured")
				if err != nil {
					return "", err
				}
				return "captured", table.Enqueue(ctx, tx, outbox.Event{ID: id, Topic: "payments"})
			})
			fmt.Println(res.Value, "replayed:", res.Replayed)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	pay("pay-1")
	pay("pay-1") // the client's retry

	var events int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_example_tx.outbox_events").Scan(&events); err != nil {
		log.Fatal(err)
	}
	fmt.Println("events enqueued:", events)
	// Output:
	// captured replayed: false
	// captured replayed: true
	// events enqueued: 1
}

// An outage of the receiver dead-letters events; the backlog shows them,
// and once the receiver is back one call redrives them all.
func ExampleTable_RedriveAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS outbox_example_redrive CASCADE")

	table, err := outbox.New(pool, &outbox.Options{Schema: "outbox_example_redrive"})
	if err != nil {
		log.Fatal(err)
	}
	if err := table.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return table.Enqueue(ctx, tx, outbox.Event{Topic: "mail"}, outbox.Event{Topic: "mail"})
	})
	if err != nil {
		log.Fatal(err)
	}

	// The receiver refuses everything, for good: both events die.
	relay, err := outbox.NewRelay(table, outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		return idempotency.Permanent(fmt.Errorf("mail server: 550"))
	}), &outbox.RelayOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(rctx) }()
	for b := (outbox.Backlog{}); b.Dead < 2; time.Sleep(10 * time.Millisecond) {
		if b, err = table.Backlog(ctx); err != nil {
			log.Fatal(err)
		}
	}
	stop()
	fmt.Println("relay stopped:", <-done)

	b, err := table.Backlog(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pending %d, in flight %d, dead %d\n", b.Pending, b.InFlight, b.Dead)
	n, err := table.RedriveAll(ctx) // the receiver is fixed
	if err != nil {
		log.Fatal(err)
	}
	if b, err = table.Backlog(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("redriven %d: pending %d, dead %d\n", n, b.Pending, b.Dead)
	// Output:
	// relay stopped: <nil>
	// pending 0, in flight 0, dead 2
	// redriven 2: pending 2, dead 0
}
