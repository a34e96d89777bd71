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
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// The raw floor's scripts: the least a hand-written claim, completion and
// replay could send to Redis (issue 15).
var (
	// floorClaim: HSET of two fields plus PEXPIRE.
	floorClaim = goredis.NewScript(`
redis.call('HSET', KEYS[1], 'st', 'started', 'f', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)
	// floorComplete: HSET of two fields.
	floorComplete = goredis.NewScript(`
redis.call('HSET', KEYS[1], 'st', 'completed', 'r', ARGV[1])
return 1`)
	// floorReplay: HGETALL.
	floorReplay = goredis.NewScript(`return redis.call('HGETALL', KEYS[1])`)
)

// BenchmarkRedisFloor compares Do on the Redis store with a raw floor on
// the same single server and the same client (go-redis's default options,
// a pool of 16 connections): for a fresh Do, two EVALSHA, one running HSET
// of two fields plus PEXPIRE and one running HSET of two fields (the
// second stores the same 200-byte JSON result Do stores); for a replay,
// one EVALSHA running HGETALL of a completed key. Chunks of Do and of the
// floor alternate, from 1 and from 16 goroutines, so both see the same
// load. ns/op is Do's; raw-ns/op the floor's; ratio is raw-ns/op ÷ ns/op
// (the target is 0.9); roundtrips/op counts Do's commands and pipelines.
//
//	go test -run '^$' -bench RedisFloor -count 5 -benchtime 3000x ./benchmarks/
//
// With IDEM_BENCH_REDIS_CONTEXT_TIMEOUT=1 both sides share a client with
// ContextTimeoutEnabled, the configuration store/redis's README
// recommends: the store then bounds its calls without a goroutine each.
func BenchmarkRedisFloor(b *testing.B) {
	for _, op := range []string{"fresh", "replay"} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("op=%s/callers=%d", op, callers), func(b *testing.B) {
				redisFloor(b, op, callers, 0)
			})
		}
	}
}

// BenchmarkRedisScale runs the floor comparison of [BenchmarkRedisFloor]
// from 16 callers with live records already in the store: 0, 10³, 10⁵ and
// 10⁶ completed records of the store's shape (a 200-byte result, a
// 10-minute TTL), preloaded by a Lua loop under a prefix of the run's own
// and deleted at the end. Besides the floor's metrics it reports
// bytes/record: the growth of the server's used_memory (INFO memory) over
// the preload, divided by the records. Set IDEM_BENCH_SCALE_1E7=1 to add
// 10⁷ records (about 4 GB on the server; minutes of preload).
//
// It writes up to gigabytes: point IDEM_REDIS_ADDR at a server of your
// own rather than a shared one.
//
//	go test -run '^$' -bench RedisScale -count 5 -benchtime 3000x ./benchmarks/
//	IDEM_BENCH_SCALE_1E7=1 go test -run '^$' -bench 'RedisScale/records=1e7' -benchtime 3000x -timeout 1h ./benchmarks/
func BenchmarkRedisScale(b *testing.B) {
	sizes := []struct {
		name string
		n    int
	}{{"0", 0}, {"1e3", 1e3}, {"1e5", 1e5}, {"1e6", 1e6}}
	if os.Getenv("IDEM_BENCH_SCALE_1E7") != "" {
		sizes = append(sizes, struct {
			name string
			n    int
		}{"1e7", 1e7})
	}
	for _, size := range sizes {
		for _, op := range []string{"fresh", "replay"} {
			b.Run(fmt.Sprintf("records=%s/op=%s/callers=16", size.name, op), func(b *testing.B) {
				redisFloor(b, op, 16, size.n)
			})
		}
	}
}

func redisFloor(b *testing.B, op string, callers, preload int) {
	addr := bench.Server(b, bench.Redis)
	var trips atomic.Int64
	c, err := bench.RedisClient(addr, &trips)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prefix := "idem-floor-" + bench.RandomHex(6) + ":"
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := bench.UnlinkPrefix(ctx, c, prefix); err != nil {
			b.Errorf("deleting %s*: %v", prefix, err)
		}
	}()
	ctx := context.Background()
	var perRecord float64
	if preload > 0 {
		if perRecord, err = preloadRecords(ctx, c, prefix+"store:", preload); err != nil {
			b.Fatal(err)
		}
	}
	s, err := idemredis.New(c, &idemredis.Options{Prefix: prefix + "store:"})
	if err != nil {
		b.Fatal(err)
	}
	bench.CountStoreTrips(s, c, &trips)
	r, err := idempotency.New(s, idempotency.WithRetention(bench.Retention))
	if err != nil {
		b.Fatal(err)
	}
	for _, sc := range []*goredis.Script{floorClaim, floorComplete, floorReplay} {
		if err := sc.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
	}
	result, err := json.Marshal(bench.Result)
	if err != nil {
		b.Fatal(err)
	}
	fp := string(idempotency.FingerprintBytes(result))
	lease := (30 * time.Second).Milliseconds()
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	do := func(key string) error {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: bench.Scope, Key: key}, fn)
		if err == nil && res.Replayed != (op == "replay") {
			err = fmt.Errorf("Do of %s: replayed %v in the %s workload", key, res.Replayed, op)
		}
		return err
	}
	rawKey := func(key string) []string { return []string{prefix + "raw:" + key} }
	rawFresh := func(key string) error {
		k := rawKey(key)
		if err := floorClaim.EvalSha(ctx, c, k, fp, lease).Err(); err != nil {
			return err
		}
		return floorComplete.EvalSha(ctx, c, k, result).Err()
	}
	rawReplay := func(key string) error {
		v, err := floorReplay.EvalSha(ctx, c, rawKey(key)).Slice()
		if err == nil && len(v) != 6 {
			err = fmt.Errorf("raw replay of %s: %d fields, want 6", key, len(v))
		}
		return err
	}
	// Replays read one completed key per goroutine; the warm-up opens the
	// connections and loads the store's scripts.
	for g := range callers {
		if err := do(fmt.Sprintf("warm-%d", g)); err != nil && op == "fresh" {
			b.Fatal(err)
		}
		if op == "replay" {
			hot := bench.HotKey(g)
			if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: bench.Scope, Key: hot}, fn); err != nil {
				b.Fatal(err)
			}
			if err := rawFresh(hot); err != nil {
				b.Fatal(err)
			}
		}
	}
	bench.FloorOp(b, op, callers, &trips, do, rawFresh, rawReplay)
	if preload > 0 { // after Floor, whose ResetTimer drops metrics reported before
		b.ReportMetric(perRecord, "bytes/record")
	}
}

// preloadScript writes ARGV[2] completed records, numbered from ARGV[3],
// under the key prefix ARGV[1], in the store's layout (a hash tag of one
// of the 1024 shards, then the storage key), each with the fields of a
// completed record (f t n r), the result ARGV[4] and a TTL of ARGV[5] ms. It
// declares no keys: it runs on a single server only.
var preloadScript = goredis.NewScript(`
local prefix, n, from, result, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
for i = from, from + n - 1 do
  local k = prefix .. '{' .. string.format('%03x', i % 1024) .. '}9:preload:' .. i
  redis.call('HSET', k, 'f', 'h0123456789abcdef0123456789abcdef',
    't', '0123456789abcdef0123456789abcdef', 'n', '1767225600000000', 'r', result)
  redis.call('PEXPIRE', k, ttl)
end
return n
`)

// preloadRecords writes n completed records under prefix, in scripts of
// 10,000 records each, and returns the growth of the server's used_memory
// per record.
func preloadRecords(ctx context.Context, c *goredis.Client, prefix string, n int) (float64, error) {
	before, err := usedMemory(ctx, c)
	if err != nil {
		return 0, err
	}
	result := make([]byte, bench.ResultSize)
	for i := range result {
		result[i] = 'x'
	}
	const batch = 10000
	for from := 0; from < n; from += batch {
		m := min(batch, n-from)
		if err := preloadScript.Eval(ctx, c, nil, prefix, m, from, result, bench.Retention.Milliseconds()).Err(); err != nil {
			return 0, fmt.Errorf("preloading records %d to %d: %w", from, from+m, err)
		}
	}
	after, err := usedMemory(ctx, c)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(n), nil
}

func usedMemory(ctx context.Context, c *goredis.Client) (int64, error) {
	info, err := c.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	var v int64
	_, err = fmt.Sscan(info["Memory"]["used_memory"], &v)
	return v, err
}
