package brokers_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/brokers"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

// This file is the examples' plumbing (servers from the environment,
// names of each run's own, output in a fixed order) and the handler that
// the PostgreSQL examples share (ledgerDB.handler). The rest of what a
// service would write is in example_test.go.

// env returns the value of the environment variable name, or an error
// saying how to get one: printed by an example, it fails it, since it is
// not the example's output. Like every backend test of the repository,
// an example without its server fails; it never passes silently.
func env(name string) (string, error) {
	if v := os.Getenv(name); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%s is not set: run scripts/test.sh (it starts the servers, see scripts/servers) or set it", name)
}

// unique returns a name that no other run of the examples uses, in this
// process or another one: prefix, the process ID and the time.
func unique(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// ledgerDB is the PostgreSQL database of the NATS and RabbitMQ examples
// (IDEM_POSTGRES_URL): a schema of the run's own holds the inbox's table
// and the service's own ledger table, one row per order charged.
type ledgerDB struct {
	pool   *pgxpool.Pool
	schema string
	in     *inbox.Inbox
}

// openLedger creates the run's schema with the store's table and the
// ledger in it, and the inbox of consumer on that store. close drops the
// schema.
func openLedger(ctx context.Context, consumer string) (*ledgerDB, error) {
	url, err := env("IDEM_POSTGRES_URL")
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("IDEM_POSTGRES_URL: %w", err)
	}
	db := &ledgerDB{pool: pool, schema: unique("brokers_example")}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+db.schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot use the PostgreSQL at IDEM_POSTGRES_URL: %w", err)
	}
	if err := db.setUp(ctx, consumer); err != nil {
		db.close()
		return nil, err
	}
	return db, nil
}

func (db *ledgerDB) setUp(ctx context.Context, consumer string) error {
	store, err := postgres.New(db.pool, &postgres.Options{Schema: db.schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	// No unique constraint on event_id: the inbox alone keeps the orders
	// from being charged twice.
	if _, err := db.pool.Exec(ctx, "CREATE TABLE "+db.schema+".ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, payload jsonb NOT NULL)"); err != nil {
		return err
	}
	runner, err := idempotency.New(store)
	if err != nil {
		return err
	}
	db.in, err = inbox.New(runner, consumer)
	return err
}

// close drops the run's schema, with the inbox's records and the ledger.
func (db *ledgerDB) close() {
	db.pool.Exec(context.Background(), "DROP SCHEMA "+db.schema+" CASCADE")
	db.pool.Close()
}

// handler is the consumer's BatchHandler: each message's ledger row is
// inserted in the transaction that records its event in the inbox
// (postgres.InboxBatchTx, one transaction per batch), so a crash leaves
// an order charged and recorded, or neither.
func (db *ledgerDB) handler() brokers.BatchHandler {
	return func(ctx context.Context, msgs []inbox.Message) []inbox.Delivery {
		return postgres.InboxBatchTx(ctx, db.in, db.pool, msgs, func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+db.schema+".ledger (event_id, payload) VALUES ($1, $2)", msgs[i].ID, msgs[i].Payload)
			return err
		})
	}
}

// print prints how many ledger rows each order has.
func (db *ledgerDB) print(ctx context.Context) {
	rows, err := db.pool.Query(ctx, "SELECT event_id, count(*) FROM "+db.schema+".ledger GROUP BY event_id ORDER BY event_id")
	if err != nil {
		fmt.Println("ledger:", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			fmt.Println("ledger:", err)
			return
		}
		fmt.Printf("ledger: %s, %d row(s)\n", id, n)
	}
	if err := rows.Err(); err != nil {
		fmt.Println("ledger:", err)
	}
}

// crashAfter returns h as a consumer runs it that dies once h has handled
// one batch, before the broker hears of it: die closes its connection,
// so the acknowledgements of the batch are lost.
func crashAfter(h brokers.BatchHandler, die func()) brokers.BatchHandler {
	return func(ctx context.Context, msgs []inbox.Message) []inbox.Delivery {
		ds := h(ctx, msgs)
		die()
		return ds
	}
}

// notes collects a line per settled message from the Settled hooks of the
// examples' consumers, to print them in a fixed order once they stopped:
// the order in which a broker delivers again is not the examples' to fix.
type notes struct {
	mu    sync.Mutex
	lines []string
}

// settled returns the Settled hook of the consumer who: it notes each
// message's disposition and the broker's answer, and calls stop (when
// not nil) once the consumer has settled n messages.
func (ns *notes) settled(who string, n int, stop func()) func(inbox.Message, inbox.Delivery, error) {
	count := 0
	return func(msg inbox.Message, d inbox.Delivery, err error) {
		ns.mu.Lock()
		defer ns.mu.Unlock()
		ns.lines = append(ns.lines, fmt.Sprintf("%s %s: %s, duplicate %v, broker error %v", who, msg.ID, d.Disposition, d.Duplicate, err))
		if count++; count == n && stop != nil {
			stop()
		}
	}
}

// until runs consume, the loop of a consumer, with Options whose Settled
// hook notes each message as who's, until it has settled n messages (or
// ctx is done).
func (ns *notes) until(ctx context.Context, who string, n int, consume func(ctx context.Context, o *brokers.Options) error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_ = consume(ctx, &brokers.Options{Settled: ns.settled(who, n, cancel)})
}

// print prints the lines noted, sorted.
func (ns *notes) print() {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	slices.Sort(ns.lines)
	for _, l := range ns.lines {
		fmt.Println(l)
	}
}

// natsInstance connects an instance of a consumer to the NATS server at
// url: a connection of its own, on which it takes the durable consumer
// of stream.
func natsInstance(ctx context.Context, url, stream, durable string) (*nats.Conn, jetstream.Consumer, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err == nil {
		var cons jetstream.Consumer
		if cons, err = js.Consumer(ctx, stream, durable); err == nil {
			return nc, cons, nil
		}
	}
	nc.Close()
	return nil, nil, err
}

// dialRabbitMQ connects to the RabbitMQ of IDEM_RABBITMQ_URL and opens a
// channel on the connection.
func dialRabbitMQ() (*amqp.Connection, *amqp.Channel, error) {
	url, err := env("IDEM_RABBITMQ_URL")
	if err != nil {
		return nil, nil, err
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, fmt.Errorf("IDEM_RABBITMQ_URL: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// kafkaSeeds returns the seed brokers of IDEM_KAFKA_BROKERS, or else
// those of a kfake cluster started for the example, which stop stops.
func kafkaSeeds() (seeds []string, stop func(), err error) {
	if v := os.Getenv("IDEM_KAFKA_BROKERS"); v != "" {
		return strings.Split(v, ","), func() {}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, nil, err
	}
	return c.ListenAddrs(), c.Close, nil
}

// deleteKeys deletes the Redis keys that the inbox in made for the
// events ids of source: each one's record and its shard's fence mark,
// whose key is the record's (redis.Store.Key: the prefix, a hash tag,
// the storage key) with "\x00fence" after the tag. A SCAN of the prefix
// would walk the whole keyspace of the server, which others share.
func deleteKeys(rdb *goredis.Client, store *redis.Store, in *inbox.Inbox, prefix, source string, ids []string) {
	const tagLen = len("{3ff}")
	for _, id := range ids {
		storageKey, err := in.Runner().StorageKey(in.Request(inbox.Message{Source: source, ID: id}))
		if err != nil {
			continue
		}
		key := store.Key(storageKey)
		rdb.Del(context.Background(), key, key[:len(prefix)+tagLen]+"\x00fence")
	}
}
