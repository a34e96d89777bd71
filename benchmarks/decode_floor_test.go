package benchmarks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	goredis "github.com/redis/go-redis/v9"
)

// redisReplayValue is the Redis floor's replay (the script floorReplay,
// one HGETALL) returning the value it read, the field r, as
// bench.FloorCalls wants it: with it, the JSON floor of the Redis floor
// decodes the bytes it read (bench.FloorOp decodes a copy of the stored
// bytes, which costs the same). key maps a floor key to the Redis key.
func redisReplayValue(ctx context.Context, c goredis.Scripter, key func(string) []string) func(string) ([]byte, error) {
	return func(k string) ([]byte, error) {
		fields, err := floorReplay.EvalSha(ctx, c, key(k)).StringSlice()
		if err != nil {
			return nil, fmt.Errorf("raw replay of %s: %w", k, err)
		}
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i] == "r" {
				return []byte(fields[i+1]), nil
			}
		}
		return nil, fmt.Errorf("raw replay of %s: no result among %d fields", k, len(fields))
	}
}

// TestRedisFloorReplayValue checks that the Redis floor's replay returns
// the JSON result its fresh call stored, which decodes to bench.Result.
func TestRedisFloorReplayValue(t *testing.T) {
	addr := os.Getenv(bench.Var(bench.Redis))
	if addr == "" {
		t.Fatalf("%s is not set: run scripts/test.sh or start scripts/servers/redis.sh", bench.Var(bench.Redis))
	}
	var trips atomic.Int64
	c, err := bench.RedisClient(addr, &trips)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	prefix := "idem-floor-" + bench.RandomHex(6) + ":"
	key := func(k string) []string { return []string{prefix + k} }
	defer c.Del(context.Background(), prefix+"k")
	for _, sc := range []*goredis.Script{floorClaim, floorComplete, floorReplay} {
		if err := sc.Load(ctx, c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	result, err := json.Marshal(bench.Result)
	if err != nil {
		t.Fatal(err)
	}
	if err := floorClaim.EvalSha(ctx, c, key("k"), "fp", (time.Minute).Milliseconds()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := floorComplete.EvalSha(ctx, c, key("k"), result).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := redisReplayValue(ctx, c, key)("k")
	if err != nil {
		t.Fatal(err)
	}
	var p bench.Payment
	if err := json.Unmarshal(v, &p); err != nil || p != bench.Result {
		t.Fatalf("the replayed value %q decodes to %+v, %v; want %+v", v, p, err, bench.Result)
	}
}
