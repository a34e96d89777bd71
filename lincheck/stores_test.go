package lincheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// The workloads. Sixteen (twelve over a network) goroutines share four keys
// at a time; each key sees about a hundred operations from all of them,
// which is plenty of contention and still checks in a fraction of a
// second.
var (
	memoryWorkload = workload{Clients: 16, OpsPerClient: 600, KeysPerPhase: 4, PhaseLen: 50, Seed: 1}
	serverWorkload = workload{Clients: 16, OpsPerClient: 450, KeysPerPhase: 4, PhaseLen: 50, Seed: 2}
)

// checkStore checks store under two workloads: random calls (w), and every
// client repeating one holder's calls (repeatCall) for a third as many
// calls. The keys of the two do not overlap.
func checkStore(t *testing.T, store idempotency.Store, w workload) {
	t.Run("random", func(t *testing.T) { checkLinearizable(t, store, w) })
	rep := w
	rep.OpsPerClient = w.OpsPerClient / 3
	rep.Gen, rep.Coverage = repeatCall, repeatCoverage
	t.Run("repeats", func(t *testing.T) { checkLinearizable(t, store, rep) })
}

func TestMemory(t *testing.T) {
	checkStore(t, memStore(nil), memoryWorkload)
}

func TestPostgres(t *testing.T) {
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh or set IDEM_POSTGRES_URL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("IDEM_POSTGRES_URL: %v", err)
	}
	cfg.MaxConns = int32(serverWorkload.Clients)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to IDEM_POSTGRES_URL: %v (run scripts/test.sh or set IDEM_POSTGRES_URL)", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("PostgreSQL at IDEM_POSTGRES_URL unreachable: %v (run scripts/test.sh or set IDEM_POSTGRES_URL)", err)
	}

	// A throwaway table (and its fence sequence, owned by it) per run.
	table := "lincheck_" + randomHex(6)
	store, err := postgres.New(pool, &postgres.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("creating table %s: %v", table, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "`+table+`" CASCADE`); err != nil {
			t.Errorf("dropping table %s: %v", table, err)
		}
	}()
	checkStore(t, store, serverWorkload)
}

func TestRedis(t *testing.T) {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		t.Fatal("IDEM_REDIS_ADDR is not set: run scripts/test.sh or set IDEM_REDIS_ADDR")
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: serverWorkload.Clients})
	defer client.Close()
	testRedis(t, client, "IDEM_REDIS_ADDR")
}

func TestRedisCluster(t *testing.T) {
	addrs := os.Getenv("IDEM_REDIS_CLUSTER_ADDRS")
	if addrs == "" {
		t.Fatal("IDEM_REDIS_CLUSTER_ADDRS is not set: run scripts/test.sh or set IDEM_REDIS_CLUSTER_ADDRS")
	}
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: strings.Split(addrs, ","), PoolSize: serverWorkload.Clients,
	})
	defer client.Close()
	testRedis(t, client, "IDEM_REDIS_CLUSTER_ADDRS")
}

// testRedis checks a store on client under a prefix of its own, and deletes
// its keys at the end.
func testRedis(t *testing.T, client goredis.UniversalClient, variable string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s unreachable: %v (run scripts/test.sh or set %s)", variable, err, variable)
	}
	prefix := "lincheck:" + randomHex(6) + ":"
	store, err := idemredis.New(client, &idemredis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer deleteKeys(t, client, prefix)
	checkStore(t, store, serverWorkload)
}

// deleteKeys deletes the keys under prefix on every master.
func deleteKeys(t *testing.T, client goredis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *goredis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	var err error
	switch c := client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, del)
	case *goredis.Client:
		err = del(ctx, c)
	}
	if err != nil {
		t.Errorf("deleting the test's keys: %v", err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
