package postgres_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Run with:
//
//	go test -run '^$' -bench . -benchmem ./store/postgres/
//
// against the server at IDEM_POSTGRES_URL (eval "$(scripts/servers/postgres.sh start .tmp/servers)").

// BenchmarkStore runs the portable store benchmarks of conformancetest.
func BenchmarkStore(b *testing.B) {
	pool := testPool(b, pgx.QueryExecModeCacheStatement)
	table := newStoreTable(b, pool)
	conformancetest.Benchmark(b, func(b *testing.B) idempotency.Store {
		s, err := postgres.New(pool, &postgres.Options{Schema: testSchema, Table: table})
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}

// BenchmarkStoreNotify runs the same benchmarks on a store with
// Options.Notify, whose Complete and Release also pg_notify: compare with
// BenchmarkStore for the cost of the notification (and of the lock NOTIFY
// takes at commit) when nobody is waiting.
func BenchmarkStoreNotify(b *testing.B) {
	pool := testPool(b, pgx.QueryExecModeCacheStatement)
	table := newStoreTable(b, pool)
	conformancetest.Benchmark(b, func(b *testing.B) idempotency.Store {
		s, err := postgres.New(pool, &postgres.Options{Schema: testSchema, Table: table, Notify: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// roundTrips is a pgx tracer counting round trips to the server: one per
// query or Exec, one per batch (its queries are pipelined).
type roundTrips struct {
	n     atomic.Int64
	mu    chan struct{}
	stmts []recorded // recorded while capturing
}

func newRoundTrips() *roundTrips { return &roundTrips{mu: make(chan struct{}, 1)} }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	r.mu <- struct{}{}
	if r.stmts != nil {
		r.stmts = append(r.stmts, recorded{d.SQL, append([]any(nil), d.Args...)})
	}
	<-r.mu
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// capture returns the statements f sends.
func (r *roundTrips) capture(f func()) []recorded {
	r.mu <- struct{}{}
	r.stmts = []recorded{}
	<-r.mu
	f()
	r.mu <- struct{}{}
	got := r.stmts
	r.stmts = nil
	<-r.mu
	return got
}

func tracedPool(b *testing.B, rt *roundTrips) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// replaceArgs returns args with every string equal to a key of repl
// replaced by its value.
func replaceArgs(args []any, repl map[string]string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if s, ok := a.(string); ok {
			if v, ok := repl[s]; ok {
				a = v
			}
		}
		out[i] = a
	}
	return out
}

type payment struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Amount int    `json:"amount"`
}

// BenchmarkDo measures idempotency.Do on the store, and in the same loop
// raw pgx sending the very statements Do sends (captured from a warm-up
// call, with the key and token changed), so that the ratio is not skewed
// by the load the shared machine is under at different times. The raw
// side reads every row and command tag but decodes nothing. The fresh
// workload runs on a store whose claims insert first, the replays on one
// that reads first: the orders an adaptive store settles into under each
// workload (see TestClaimOrderFollowsTheWorkload). Metrics:
//
//   - roundtrips/op: round trips Do made (fresh: 2, replay: 1);
//   - do-ns/op and raw-ns/op: the time of each alone (ns/op is their sum);
//   - do/raw: throughput of Do relative to raw pgx (1.0 = no overhead).
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	rt := newRoundTrips()
	pool := tracedPool(b, rt)
	value := payment{ID: "pay_123", Status: "succeeded", Amount: 1000}
	fn := func(context.Context) (payment, error) { return value, nil }
	prefix := "bench-" + randomHex(4) + "-"
	runner := func(b *testing.B, readFirst bool) *idempotency.Runner {
		s := newStore(b, pool, nil)
		postgres.PinClaimOrder(s, readFirst)
		r, err := idempotency.New(s)
		if err != nil {
			b.Fatal(err)
		}
		return r
	}

	b.Run("fresh", func(b *testing.B) {
		r := runner(b, false)
		warm := prefix + "warm"
		stmts := rt.capture(func() {
			if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: warm}, fn); err != nil {
				b.Fatal(err)
			}
		})
		if len(stmts) != 2 {
			b.Fatalf("a fresh Do sent %d statements, want 2", len(stmts))
		}
		warmKey, warmToken := stmts[0].args[0].(string), stmts[0].args[2].(string)
		var doNs, rawNs time.Duration
		var trips int64
		i := 0
		for b.Loop() {
			i++
			key := prefix + "f" + strconv.Itoa(i)
			t0 := time.Now()
			n0 := rt.n.Load()
			res, err := idempotency.Do(ctx, r, idempotency.Request{Key: key}, fn)
			trips += rt.n.Load() - n0
			t1 := time.Now()
			if err != nil || res.Replayed {
				b.Fatalf("fresh Do of %s: %+v, %v", key, res, err)
			}
			sk, _ := idempotency.StorageKey(nil, "r"+key)
			repl := map[string]string{warmKey: sk, warmToken: randomHex(16)}
			if n, _, err := rawStatement(ctx, pool, stmts[0].sql, replaceArgs(stmts[0].args, repl)); err != nil || n != 1 {
				b.Fatalf("raw claim: %v, %d rows", err, n)
			}
			if _, tag, err := rawStatement(ctx, pool, stmts[1].sql, replaceArgs(stmts[1].args, repl)); err != nil || tag.RowsAffected() != 1 {
				b.Fatalf("raw complete: %v, %v", err, tag)
			}
			doNs += t1.Sub(t0)
			rawNs += time.Since(t1)
		}
		report(b, trips, doNs, rawNs, i)
	})

	b.Run("replay", func(b *testing.B) {
		r := runner(b, true)
		key := prefix + "replayed"
		if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: key}, fn); err != nil {
			b.Fatal(err)
		}
		stmts := rt.capture(func() {
			if res, err := idempotency.Do(ctx, r, idempotency.Request{Key: key}, fn); err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		})
		if len(stmts) != 1 {
			b.Fatalf("a replay sent %d statements, want 1", len(stmts))
		}
		var doNs, rawNs time.Duration
		var trips int64
		i := 0
		for b.Loop() {
			i++
			t0 := time.Now()
			n0 := rt.n.Load()
			res, err := idempotency.Do(ctx, r, idempotency.Request{Key: key}, fn)
			trips += rt.n.Load() - n0
			t1 := time.Now()
			if err != nil || !res.Replayed || res.Value != value {
				b.Fatalf("replay: %+v, %v", res, err)
			}
			if n, _, err := rawStatement(ctx, pool, stmts[0].sql, stmts[0].args); err != nil || n != 1 {
				b.Fatalf("raw replay: %v, %d rows", err, n)
			}
			doNs += t1.Sub(t0)
			rawNs += time.Since(t1)
		}
		report(b, trips, doNs, rawNs, i)
	})
}

// rawStatement runs sql and reads its rows without decoding them: the
// number of rows, and the command tag.
func rawStatement(ctx context.Context, pool *pgxpool.Pool, sql string, args []any) (int, pgconn.CommandTag, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return 0, pgconn.CommandTag{}, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.CommandTag(), rows.Err()
}

func report(b *testing.B, trips int64, doNs, rawNs time.Duration, n int) {
	if n == 0 {
		return
	}
	b.ReportMetric(float64(trips)/float64(n), "roundtrips/op")
	b.ReportMetric(float64(doNs)/float64(n), "do-ns/op")
	b.ReportMetric(float64(rawNs)/float64(n), "raw-ns/op")
	b.ReportMetric(float64(rawNs)/float64(doNs), "do/raw")
}

// BenchmarkTx measures what DoTx adds to the caller's transaction. Each
// iteration runs, interleaved, a bare transaction (BEGIN, one INSERT,
// COMMIT) and the same transaction with the INSERT inside DoTx under a
// fresh key. Metrics: bare-ns/op, dotx-ns/op, added-ns/op, and
// added-roundtrips/op (2: the claim batch and the completion batch).
func BenchmarkTx(b *testing.B) {
	ctx := context.Background()
	rt := newRoundTrips()
	pool := tracedPool(b, rt)
	s := newStore(b, pool, nil)
	r, err := idempotency.New(s)
	if err != nil {
		b.Fatal(err)
	}
	effects := testSchema + ".bench_effects_" + randomHex(4)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (id bigserial, key text NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	insert := "INSERT INTO " + effects + " (key) VALUES ($1)"
	prefix := "tx-" + randomHex(4) + "-"
	var bareNs, txNs time.Duration
	var bareTrips, txTrips int64
	i := 0
	for b.Loop() {
		i++
		key := prefix + strconv.Itoa(i)
		t0 := time.Now()
		n0 := rt.n.Load()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, key)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		n1 := rt.n.Load()
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := postgres.DoTx(ctx, r, tx, idempotency.Request{Key: key}, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, insert, key)
				return 1, err
			})
			if err == nil && res.Replayed {
				b.Fatalf("DoTx of fresh key %s replayed", key)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		bareTrips += n1 - n0
		txTrips += rt.n.Load() - n1
		bareNs += t1.Sub(t0)
		txNs += time.Since(t1)
	}
	n := float64(i)
	b.ReportMetric(float64(bareNs)/n, "bare-ns/op")
	b.ReportMetric(float64(txNs)/n, "dotx-ns/op")
	b.ReportMetric(float64(txNs-bareNs)/n, "added-ns/op")
	b.ReportMetric(float64(txTrips-bareTrips)/n, "added-roundtrips/op")
}
