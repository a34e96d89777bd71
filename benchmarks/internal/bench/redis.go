package bench

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// RedisPoolSize is the connection pool of the Redis floor benchmarks, for
// the store and the raw floor alike.
const RedisPoolSize = 16

// RedisContextTimeoutVar names the environment variable that, set to 1,
// gives the floor benchmarks' client ContextTimeoutEnabled: go-redis then
// honours context deadlines itself and the store needs no goroutine per
// call to bound it (see store/redis's README). Both sides of the
// comparison use the same client either way.
const RedisContextTimeoutVar = "IDEM_BENCH_REDIS_CONTEXT_TIMEOUT"

// RedisClient returns a client of the single Redis server at addr, with
// go-redis's default options but a pool of [RedisPoolSize] (and
// ContextTimeoutEnabled when [RedisContextTimeoutVar] is 1), counting its
// commands and pipelines in trips, after checking that the server answers.
func RedisClient(addr string, trips *atomic.Int64) (*goredis.Client, error) {
	c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: RedisPoolSize,
		ContextTimeoutEnabled: os.Getenv(RedisContextTimeoutVar) == "1"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("bench: redis at %s unreachable: %w: %s", addr, err, howTo(Redis))
	}
	c.AddHook((*redisHook)(trips))
	return c, nil
}

// RedisHook counts a client's round trips to Redis in trips: every
// command, and every pipeline as one (add it to each node's client of a
// cluster to count a pipeline per node).
func RedisHook(trips *atomic.Int64) goredis.Hook { return (*redisHook)(trips) }

// CountStoreTrips makes trips count the round trips of s too when s sends
// its commands through a clone of c (a *redis.Client without
// ContextTimeoutEnabled: see idemredis.New), which has none of c's hooks.
func CountStoreTrips(s *idemredis.Store, c goredis.UniversalClient, trips *atomic.Int64) {
	if sc, ok := s.Client().(*goredis.Client); ok && idemredis.Client(sc) != idemredis.Client(c) {
		sc.AddHook((*redisHook)(trips))
	}
}

// UnlinkPrefix deletes every key of c's server that starts with prefix,
// SCANning in batches of 1000 and UNLINKing each batch in one pipeline.
func UnlinkPrefix(ctx context.Context, c *goredis.Client, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}
