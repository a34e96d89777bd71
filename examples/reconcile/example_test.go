package reconcile_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/examples/reconcile"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	"github.com/exactlyonce/idempotency/store/memory"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/zap"
)

// crashAndReconcile is what every example does on its store: the holders
// of two payments crash (order-7 after charging the card, order-8
// before), their leases run out (wait) and nobody retries; Reconcile asks
// the gateway by each one's downstream key and completes or releases it;
// then the clients' late retries come.
func crashAndReconcile(ctx context.Context, runner *idempotency.Runner, store idempotency.Store, lease time.Duration, wait func()) {
	gateway := reconcile.NewGateway()
	if err := reconcile.CrashPayments(ctx, runner, store, gateway, lease); err != nil {
		panic(err)
	}
	wait() // the crashed holders' leases run out

	report, err := idempotency.Reconcile(ctx, runner, 100, reconcile.Resolver(gateway))
	fmt.Printf("reconciled %d: %d completed, %d released (%v)\n", report.Listed, report.Completed, report.Released, err)
	if err := reconcile.RetryPayments(ctx, runner, gateway); err != nil {
		panic(err)
	}
}

// On the memory store, with a clock the example moves: two payments
// crashed (order-7 after charging, order-8 before) and nobody retried.
// Reconcile asks the gateway by the downstream key: order-7 is completed
// with its charge, order-8 released; the late retries then get the
// receipt without a second charge, and run order-8 once.
func Example_memory() {
	ctx := context.Background()
	clock := conformancetest.NewClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memory.New(&memory.Options{Now: clock.Now})
	runner, _ := idempotency.New(store)
	crashAndReconcile(ctx, runner, store, idempotency.DefaultLease, func() { clock.Advance(idempotency.DefaultLease + time.Second) })
	// Output:
	// reconciled 2: 1 completed, 1 released (<nil>)
	// retry of order-7: ch_1, replayed true
	// retry of order-8: ch_2, replayed false
	// charges at the gateway: 2
}

// The same on PostgreSQL (IDEM_POSTGRES_URL): Stuck reads the partial
// index of STARTED rows, and the takeover is the claim's upsert.
func Example_postgres() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := "reconcile_example_" + fmt.Sprint(time.Now().UnixNano()) // the example leaves nothing behind
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	store, err := postgres.New(pool, &postgres.Options{Schema: schema})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	lease := 2 * time.Second
	runner, err := idempotency.New(store, idempotency.WithLease(lease))
	if err != nil {
		panic(err)
	}
	crashAndReconcile(ctx, runner, store, lease, func() { time.Sleep(lease + 500*time.Millisecond) })
	// Output:
	// reconciled 2: 1 completed, 1 released (<nil>)
	// retry of order-7: ch_1, replayed true
	// retry of order-8: ch_2, replayed false
	// charges at the gateway: 2
}

// The same on Redis (IDEM_REDIS_ADDR): Stuck reads the per-shard sorted
// sets of STARTED records.
func Example_redis() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: os.Getenv("IDEM_REDIS_ADDR"), ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redis.New(client, &redis.Options{Prefix: fmt.Sprintf("reconcile-example-%d:", time.Now().UnixNano())})
	if err != nil {
		panic(err)
	}
	lease := 2 * time.Second
	runner, err := idempotency.New(store, idempotency.WithLease(lease))
	if err != nil {
		panic(err)
	}
	crashAndReconcile(ctx, runner, store, lease, func() { time.Sleep(lease + 500*time.Millisecond) })
	// Output:
	// reconciled 2: 1 completed, 1 released (<nil>)
	// retry of order-7: ch_1, replayed true
	// retry of order-8: ch_2, replayed false
	// charges at the gateway: 2
}

// The same on etcd (IDEM_ETCD_ENDPOINTS): Stuck reads the store's index
// of STARTED records, and a lease has ended once etcd deleted its live
// marker (whole seconds, up to about half a second late). The client's
// logger is silenced: by default it writes a warning to stderr for every
// retry while etcd is unreachable.
func Example_etcd() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(os.Getenv("IDEM_ETCD_ENDPOINTS"), ","),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(), // or a logger of yours at zap.ErrorLevel
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	prefix := fmt.Sprintf("reconcile-example-%d/", time.Now().UnixNano())
	defer client.Delete(ctx, prefix, clientv3.WithPrefix()) // the example leaves nothing behind
	store, err := idemetcd.New(client, &idemetcd.Options{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	lease := 2 * time.Second
	runner, err := idempotency.New(store, idempotency.WithLease(lease))
	if err != nil {
		panic(err)
	}
	crashAndReconcile(ctx, runner, store, lease, func() { time.Sleep(lease + 1500*time.Millisecond) })
	// Output:
	// reconciled 2: 1 completed, 1 released (<nil>)
	// retry of order-7: ch_1, replayed true
	// retry of order-8: ch_2, replayed false
	// charges at the gateway: 2
}

// The same on MongoDB (IDEM_MONGO_URI): Stuck reads the partial index of
// STARTED records by lease deadline. The example needs a server, so it
// has no output comment: go test only compiles it, and TestExampleMongo
// runs it where a server is given and checks that it prints what the
// others print.
func Example_mongo() {
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("IDEM_MONGO_URI")))
	if err != nil {
		panic(err)
	}
	defer client.Disconnect(ctx)
	coll := client.Database("example").Collection(fmt.Sprintf("reconcile_%d", time.Now().UnixNano()))
	defer coll.Drop(ctx) // the example leaves nothing behind
	store, err := idemmongo.New(coll, nil)
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil { // the TTL index and the index Stuck reads
		panic(err)
	}
	lease := 2 * time.Second
	runner, err := idempotency.New(store, idempotency.WithLease(lease))
	if err != nil {
		panic(err)
	}
	crashAndReconcile(ctx, runner, store, lease, func() { time.Sleep(lease + 500*time.Millisecond) })
}
