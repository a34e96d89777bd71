package benchmarks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkPostgresFloor compares Do on the PostgreSQL store with a raw
// floor on the same server and the same pool (16 connections): a plain
// table (key text primary key, st text, resp bytea, lease timestamptz)
// and, per fresh Do, the two statements a hand-written check needs at
// least,
//
//	INSERT INTO t (key, st, lease) VALUES ($1, 'started', clock_timestamp() + interval '30s')
//		ON CONFLICT DO NOTHING RETURNING key
//	UPDATE t SET st = 'completed', resp = $2 WHERE key = $1
//
// and per replay one SELECT st, resp FROM t WHERE key = $1 of a completed
// row; resp is the same 200-byte JSON result Do stores. Chunks of Do, of
// the floor and of the JSON floor (the floor plus encoding the result
// before a fresh call, decoding the value read after a replay: see
// bench.FloorOps) alternate, from 1 and from 16 goroutines, so all see the
// same load. ns/op is Do's; raw-ns/op the floor's, json-ns/op the JSON
// floor's; ratio is raw-ns/op ÷ ns/op (the targets are 0.9 fresh from one
// caller, 0.85 fresh from 16 and replays), json-ratio json-ns/op ÷ ns/op;
// roundtrips/op counts Do's statements.
//
//	go test -run '^$' -bench PostgresFloor -count 5 -benchtime 3000x ./benchmarks/
func BenchmarkPostgresFloor(b *testing.B) {
	for _, op := range []string{"fresh", "replay"} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("op=%s/callers=%d", op, callers), func(b *testing.B) {
				postgresFloor(b, op, callers)
			})
		}
	}
}

// pgPlace is a store table and a floor table of this run's own, on a pool
// counting its round trips, dropped at the end of the benchmark.
type pgPlace struct {
	pool         *pgxpool.Pool
	trips        atomic.Int64
	store        *postgres.Store
	table, floor string // quoted names
}

func newPGPlace(b *testing.B) *pgPlace {
	b.Helper()
	p, err := openPGPlace(context.Background(), b.Cleanup)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// openPGPlace opens a pgPlace, and hands what undoes it to cleanup (which
// runs its functions last-in first-out, as testing.B.Cleanup does).
func openPGPlace(ctx context.Context, cleanup func(func())) (*pgPlace, error) {
	p := &pgPlace{}
	pool, err := bench.PostgresPool(ctx, os.Getenv(bench.Var(bench.Postgres)), bench.FloorConns, &p.trips)
	if err != nil {
		return nil, err
	}
	cleanup(pool.Close)
	p.pool = pool
	name := "idem_floor_" + bench.RandomHex(6)
	p.table, p.floor = pgx.Identifier{name}.Sanitize(), pgx.Identifier{name + "_raw"}.Sanitize()
	if p.store, err = postgres.New(pool, &postgres.Options{Table: name}); err != nil {
		return nil, err
	}
	cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+p.table+", "+p.floor+" CASCADE"); err != nil {
			fmt.Fprintf(os.Stderr, "dropping the benchmark's tables %s: %v\n", name, err)
		}
	})
	if err := p.store.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+p.floor+" (key text PRIMARY KEY, st text, resp bytea, lease timestamptz)"); err != nil {
		return nil, err
	}
	return p, nil
}

// rawFloor returns the raw floor's calls on p's floor table: a fresh call
// inserts a STARTED row and completes it with resp (two statements), a
// replay reads a completed row (one).
func rawFloor(ctx context.Context, p *pgPlace, resp []byte) bench.FloorCalls {
	insert := "INSERT INTO " + p.floor + " (key, st, lease) VALUES ($1, 'started', clock_timestamp() + interval '30s') ON CONFLICT DO NOTHING RETURNING key"
	update := "UPDATE " + p.floor + " SET st = 'completed', resp = $2 WHERE key = $1"
	sel := "SELECT st, resp FROM " + p.floor + " WHERE key = $1"
	return bench.FloorCalls{
		Fresh: func(key string) error {
			var k string
			if err := p.pool.QueryRow(ctx, insert, key).Scan(&k); err != nil {
				return fmt.Errorf("raw claim of %s: %w", key, err)
			}
			tag, err := p.pool.Exec(ctx, update, key, resp)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("raw completion of %s changed %d rows", key, tag.RowsAffected())
			}
			return err
		},
		Replay: func(key string) ([]byte, error) {
			var st string
			var got []byte
			if err := p.pool.QueryRow(ctx, sel, key).Scan(&st, &got); err != nil {
				return nil, fmt.Errorf("raw replay of %s: %w", key, err)
			}
			if st != "completed" || len(got) != len(resp) {
				return nil, fmt.Errorf("raw replay of %s: %s, %d bytes", key, st, len(got))
			}
			return got, nil
		},
	}
}

func postgresFloor(b *testing.B, op string, callers int) {
	p := newPGPlace(b)
	r, err := idempotency.New(p.store, idempotency.WithRetention(bench.Retention))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	resp, err := json.Marshal(bench.Result)
	if err != nil {
		b.Fatal(err)
	}
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	do := func(key string) error {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: key}, fn)
		if err == nil && res.Replayed != (op == "replay") {
			err = fmt.Errorf("Do of %s: replayed %v in the %s workload", key, res.Replayed, op)
		}
		return err
	}
	raw := rawFloor(ctx, p, resp)
	rawFresh, rawReplay := raw.Fresh, raw.Replay
	// Warm-up from every goroutine: connections dialled, statements
	// prepared on each; replays read one completed key per goroutine.
	bench.Warm(callers, func(g int) error {
		if err := do(fmt.Sprintf("warm-%d", g)); err != nil && op == "fresh" {
			return err
		}
		if err := rawFresh(fmt.Sprintf("warm-%d", g)); err != nil {
			return err
		}
		if op == "replay" {
			if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: bench.HotKey(g)}, fn); err != nil {
				return err
			}
			if err := rawFresh(bench.HotKey(g)); err != nil {
				return err
			}
			_, err := rawReplay(bench.HotKey(g))
			return err
		}
		return nil
	}, b.Fatal)
	bench.FloorOps(b, op, callers, &p.trips, do, raw)
}
