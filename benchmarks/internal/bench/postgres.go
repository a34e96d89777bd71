package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FloorConns is the pool size of the floor and scale benchmarks, the same
// for Do and for the raw statements it is compared with.
const FloorConns = 16

// PostgresPool returns a pool of at most maxConns connections to url
// (IDEM_POSTGRES_URL) that counts its round trips (queries, prepares and
// batches) in trips, after checking that the server answers.
func PostgresPool(ctx context.Context, url string, maxConns int32, trips *atomic.Int64) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, fmt.Errorf("%w: %s is not set for backend %s: %s", ErrNotConfigured, Var(Postgres), Postgres, howTo(Postgres))
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("bench: postgres: %s: %w", Var(Postgres), err)
	}
	cfg.ConnConfig.Tracer = (*pgTracer)(trips)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("bench: postgres at %s unreachable: %w: %s", Var(Postgres), err, howTo(Postgres))
	}
	return pool, nil
}
