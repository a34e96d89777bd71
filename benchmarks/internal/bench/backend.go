// Package bench holds what the benchmarks and the report share: the
// backends under test, each opened from its server variable with a
// round-trip counter, and the workloads run on every one of them.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
	"github.com/exactlyonce/idempotency/store/postgres"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// The backends, in the order they are run and reported.
const (
	Memory       = "memory"
	Postgres     = "postgres"
	Redis        = "redis"
	RedisCluster = "redis-cluster"
	Etcd         = "etcd"
	Mongo        = "mongo"
)

// Backends lists every backend, in order.
var Backends = []string{Memory, Postgres, Redis, RedisCluster, Etcd, Mongo}

// ErrNotConfigured is returned by [Open] for a backend whose server
// variable is unset.
var ErrNotConfigured = errors.New("bench: server variable not set")

// ErrAbsent is returned by [Open], besides [ErrNotConfigured], for a
// backend whose server could not be had anywhere, as its server script
// said (MongoDB without a Docker daemon: IDEM_MONGO_ABSENT). Callers may
// skip it; scripts/test.sh says loudly that it did not run.
var ErrAbsent = errors.New("bench: no server could be had")

// Var returns the environment variable that gives the server of backend,
// or "" for the memory store, which needs none.
func Var(backend string) string {
	switch backend {
	case Postgres:
		return "IDEM_POSTGRES_URL"
	case Redis:
		return "IDEM_REDIS_ADDR"
	case RedisCluster:
		return "IDEM_REDIS_CLUSTER_ADDRS"
	case Etcd:
		return "IDEM_ETCD_ENDPOINTS"
	case Mongo:
		return "IDEM_MONGO_URI"
	}
	return ""
}

// absentVar returns the variable in which a server script gives the
// reason why backend's server could not be had, or "".
func absentVar(backend string) string {
	if backend == Mongo {
		return "IDEM_MONGO_ABSENT"
	}
	return ""
}

// howTo says how to get the server of backend.
func howTo(backend string) string {
	return "run scripts/test.sh or set " + Var(backend) + " (scripts/servers/*.sh start DIR prints it)"
}

// Parallelism is the b.SetParallelism of the parallel workloads: they run
// Parallelism × GOMAXPROCS goroutines, enough to keep a networked store
// busy while each goroutine waits for its round trips.
const Parallelism = 8

// MaxConns sizes the Postgres pool so that no parallel goroutine waits for a
// connection on a machine with up to 4 cores.
const MaxConns = 4 * Parallelism

// MemoryFreshRetention is the retention of the memory store in the fresh
// and parallel-fresh workloads (the others, and the other backends, keep
// [Retention]).
const MemoryFreshRetention = 200 * time.Millisecond

// Backend is one store under test: the store, a counter of the round trips
// its client makes (queries, prepares and batches for Postgres; commands and
// pipelines for Redis) and what to undo at the end.
type Backend struct {
	// Name is one of [Backends].
	Name string

	store idempotency.Store // shared by every workload, or nil
	// freshRetention, when set, is the retention of the fresh workloads,
	// whose keys are used once.
	freshRetention time.Duration
	newStore       func() idempotency.Store // memory: a new store per workload run
	trips          atomic.Int64
	counted        bool // trips counts round trips (false: no network)
	// warmRecords counts the records written by warm-ups, outside the
	// measured operations.
	warmRecords atomic.Int64
	records     func(ctx context.Context) (map[string]int64, error)
	closers     []func() error
}

// Open connects to backend's server (from its variable, see [Var]) and
// prepares a place of its own there: a new table for Postgres, migrated now
// and dropped by Close; a new key prefix for Redis, whose keys Close
// deletes. It fails with an error wrapping [ErrNotConfigured] when the
// variable is unset, and says how to get the server when it is unreachable.
func Open(ctx context.Context, backend string) (*Backend, error) {
	b := &Backend{Name: backend}
	v := Var(backend)
	val := ""
	if v != "" {
		val = os.Getenv(v)
		if val == "" {
			if a := absentVar(backend); a != "" && os.Getenv(a) != "" {
				return nil, fmt.Errorf("%w: %w: %s is not set for backend %s (%s): %s", ErrNotConfigured, ErrAbsent, v, backend, os.Getenv(a), howTo(backend))
			}
			return nil, fmt.Errorf("%w: %s is not set for backend %s: %s", ErrNotConfigured, v, backend, howTo(backend))
		}
	}
	var err error
	switch backend {
	case Memory:
		if _, err := memory.New(nil); err != nil {
			return nil, err
		}
		b.newStore = func() idempotency.Store {
			s, _ := memory.New(nil) // the options are checked above
			return s
		}
		// At hundreds of thousands of fresh keys a second, a retention of
		// minutes would grow the map by gigabytes per run. A short one
		// keeps it at a steady state: the store deletes an expired record
		// for each one it creates, as in a long-running process.
		b.freshRetention = MemoryFreshRetention
	case Postgres:
		err = b.openPostgres(ctx, val)
	case Redis:
		err = b.openRedis(ctx, goredis.NewClient(&goredis.Options{Addr: val}))
	case RedisCluster:
		err = b.openRedis(ctx, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(val, ",")}))
	case Etcd:
		err = b.openEtcd(ctx, strings.Split(val, ","))
	case Mongo:
		err = b.openMongo(ctx, val)
	default:
		return nil, fmt.Errorf("bench: unknown backend %q (want one of %v)", backend, Backends)
	}
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// Store returns the store a workload run uses: the backend's store, or for
// the memory backend a new empty one, so that the records of one run do not
// weigh on the next.
func (b *Backend) Store() idempotency.Store {
	if b.newStore != nil {
		return b.newStore()
	}
	return b.store
}

// RoundTrips returns the round trips made so far, and false when the
// backend makes none (the memory store).
func (b *Backend) RoundTrips() (int64, bool) { return b.trips.Load(), b.counted }

// WarmUpRecords returns how many records the workloads' warm-ups have
// written so far, outside their measured operations.
func (b *Backend) WarmUpRecords() int64 { return b.warmRecords.Load() }

// Records counts the records of this backend's table or prefix on each
// server node, by address (one entry for Postgres and a single Redis, one
// per master for a cluster). It is slow on many records: for tests. ok is
// false for the memory store, which cannot tell.
func (b *Backend) Records(ctx context.Context) (perNode map[string]int64, ok bool, err error) {
	if b.records == nil {
		return nil, false, nil
	}
	n, err := b.records(ctx)
	return n, true, err
}

// Close deletes what Open created on the server and closes the client. It
// is safe to call more than once.
func (b *Backend) Close() error {
	var errs []error
	for i := len(b.closers) - 1; i >= 0; i-- {
		errs = append(errs, b.closers[i]())
	}
	b.closers = nil
	return errors.Join(errs...)
}

func (b *Backend) openPostgres(ctx context.Context, url string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("bench: postgres: %s: %w", Var(Postgres), err)
	}
	cfg.ConnConfig.Tracer = (*pgTracer)(&b.trips)
	cfg.MaxConns = MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("bench: postgres: %w", err)
	}
	b.closers = append(b.closers, func() error { pool.Close(); return nil })
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		return fmt.Errorf("bench: postgres at %s unreachable: %w: %s", Var(Postgres), err, howTo(Postgres))
	}
	// A table of our own: reruns and concurrent runs never see each other's
	// rows, and dropping it removes everything this run wrote.
	table := "idem_bench_" + RandomHex(6)
	s, err := postgres.New(pool, &postgres.Options{Table: table})
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	ident := pgx.Identifier{table}.Sanitize()
	b.closers = append(b.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// The fence sequence is owned by the table and goes with it.
		_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+ident+" CASCADE")
		return err
	})
	b.store, b.counted = s, true
	b.records = func(ctx context.Context) (map[string]int64, error) {
		var n int64
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+ident).Scan(&n)
		return map[string]int64{cfg.ConnConfig.Host: n}, err
	}
	return nil
}

func (b *Backend) openRedis(ctx context.Context, c goredis.UniversalClient) error {
	b.closers = append(b.closers, c.Close)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// nodes runs f on the single server, or on every master of a cluster.
	nodes := func(ctx context.Context, f func(ctx context.Context, c *goredis.Client) error) error {
		if cc, ok := c.(*goredis.ClusterClient); ok {
			return cc.ForEachMaster(ctx, f)
		}
		return f(ctx, c.(*goredis.Client))
	}
	if err := nodes(pctx, func(ctx context.Context, n *goredis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		return fmt.Errorf("bench: %s at %s unreachable: %w: %s", b.Name, Var(b.Name), err, howTo(b.Name))
	}
	c.AddHook((*redisHook)(&b.trips))
	prefix := "idem-bench-" + RandomHex(6) + ":"
	s, err := idemredis.New(c, &idemredis.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	CountStoreTrips(s, c, &b.trips)
	// scan calls f with every batch of this run's keys on node n.
	scan := func(ctx context.Context, n *goredis.Client, f func(keys []string) error) error {
		var cursor uint64
		for {
			keys, next, err := n.Scan(ctx, cursor, prefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			if err := f(keys); err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	b.records = func(ctx context.Context) (map[string]int64, error) {
		var mu sync.Mutex // ForEachMaster runs f on the masters at once
		counts := map[string]int64{}
		err := nodes(ctx, func(ctx context.Context, n *goredis.Client) error {
			var k int64
			err := scan(ctx, n, func(keys []string) error {
				for _, key := range keys {
					// A record's key has no NUL; the shards' indexes and the
					// keys' fence marks do.
					if !strings.Contains(key, "\x00") {
						k++
					}
				}
				return nil
			})
			mu.Lock()
			counts[n.Options().Addr] = k
			mu.Unlock()
			return err
		})
		return counts, err
	}
	b.closers = append(b.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return nodes(ctx, func(ctx context.Context, n *goredis.Client) error {
			return scan(ctx, n, func(keys []string) error {
				if len(keys) == 0 {
					return nil
				}
				// One UNLINK per key: the keys of a cluster node lie in
				// many slots, which a multi-key command refuses.
				p := n.Pipeline()
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				_, err := p.Exec(ctx)
				return err
			})
		})
	})
	b.store, b.counted = s, true
	return nil
}

// pgTracer counts round trips to PostgreSQL: every query, prepare and
// batch (whose queries are pipelined) is one.
type pgTracer atomic.Int64

func (t *pgTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	(*atomic.Int64)(t).Add(1)
	return ctx
}
func (t *pgTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *pgTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	(*atomic.Int64)(t).Add(1)
	return ctx
}
func (t *pgTracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}
func (t *pgTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	(*atomic.Int64)(t).Add(1)
	return ctx
}
func (t *pgTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *pgTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// redisHook counts round trips to Redis: every command, and every pipeline
// as one.
type redisHook atomic.Int64

func (h *redisHook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (h *redisHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		(*atomic.Int64)(h).Add(1)
		return next(ctx, cmd)
	}
}

func (h *redisHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		(*atomic.Int64)(h).Add(1)
		return next(ctx, cmds)
	}
}

// RandomHex returns n random bytes as 2n hex digits.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Server returns the value of backend's server variable (see [Var]). It
// fails tb when the variable is unset, and skips it when the server
// script said no server could be had (MongoDB without a Docker daemon).
func Server(tb testing.TB, backend string) string {
	tb.Helper()
	v := os.Getenv(Var(backend))
	if v == "" {
		if reason := os.Getenv(absentVar(backend)); absentVar(backend) != "" && reason != "" {
			tb.Skipf("%s not available: %s", backend, reason)
		}
		tb.Fatalf("%s is not set: %s", Var(backend), howTo(backend))
	}
	return v
}
