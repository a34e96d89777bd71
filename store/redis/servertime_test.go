package redis

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	goredis "github.com/redis/go-redis/v9"
)

// The raw floor's scripts of benchmarks/redis_floor_test.go, to measure
// their server time beside the store's.
var (
	floorClaimScript    = goredis.NewScript("\nredis.call('HSET', KEYS[1], 'st', 'started', 'f', ARGV[1])\nredis.call('PEXPIRE', KEYS[1], ARGV[2])\nreturn 1")
	floorCompleteScript = goredis.NewScript("\nredis.call('HSET', KEYS[1], 'st', 'completed', 'r', ARGV[1])\nreturn 1")
	floorReplayScript   = goredis.NewScript("return redis.call('HGETALL', KEYS[1])")
)

// BenchmarkServerTime measures the server's time per script with
// SLOWLOG (threshold 0): b.N fresh requests (the store's claim and
// completion of a 200-byte result, as Do sends them), b.N replayed claims,
// and the raw floor's scripts for the same work, interleaved request by
// request. It reports the median µs of each script as the server logged
// it (claim-µs, complete-µs, replay-µs and floor-*-µs) and the ratio of
// the fresh request's server time to the floor's (fresh-x-floor).
//
// It changes the server's slowlog settings for its run (and puts them
// back): point IDEM_REDIS_SLOWLOG_ADDR at a server of your own, or it
// uses IDEM_REDIS_ADDR.
//
//	go test -run '^$' -bench ServerTime -benchtime 2000x .
func BenchmarkServerTime(b *testing.B) {
	addr := os.Getenv("IDEM_REDIS_SLOWLOG_ADDR")
	if addr == "" {
		addr = os.Getenv("IDEM_REDIS_ADDR")
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	s, err := New(c, &Options{Prefix: "idemtest:st" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := c.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for k, v := range cfg {
			_ = c.ConfigSet(ctx, k, v).Err()
		}
	}()
	scripts := map[string]*goredis.Script{
		"claim": claimScript, "complete": completeScript,
		"floor-claim": floorClaimScript, "floor-complete": floorCompleteScript, "floor-replay": floorReplayScript,
	}
	names := map[string]string{}
	for name, sc := range scripts {
		if err := sc.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		names[sc.Hash()] = name
	}
	result := []byte("v\"" + string(make([]byte, 0)) + "\"")
	result = append(result[:2], []byte(stringOf('x', 197))...)
	result = append(result, '"')
	fp := idempotency.FingerprintBytes([]byte("body"))
	tok := idempotency.Token("0123456789abcdef0123456789abcdef")
	lease := 30 * time.Second
	// A completed record to replay.
	if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "replayed", Fingerprint: fp, Token: tok, Lease: lease}); err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, "replayed", tok, result, 10*time.Minute); err != nil {
		b.Fatal(err)
	}
	rawReplay := s.prefix + "raw:replayed"
	if err := floorCompleteScript.Run(ctx, c, []string{rawReplay}, result).Err(); err != nil {
		b.Fatal(err)
	}
	for k, v := range map[string]string{"slowlog-log-slower-than": "0", "slowlog-max-len": "100000"} {
		if err := c.ConfigSet(ctx, k, v).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	durations := map[string][]float64{}
	collect := func() {
		logs, err := c.SlowLogGet(ctx, -1).Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range logs {
			if len(l.Args) < 2 || l.Args[0] != "evalsha" {
				continue
			}
			name, ok := names[l.Args[1]]
			if ok && name == "claim" && len(l.Args) > 3 && l.Args[3] == s.Key("replayed") {
				name = "replay"
			}
			if ok {
				durations[name] = append(durations[name], float64(l.Duration.Microseconds()))
			}
		}
		_ = c.SlowLogReset(ctx).Err()
	}
	i := 0
	for b.Loop() {
		key := "k" + strconv.Itoa(i)
		i++
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tok, Lease: lease})
		if err != nil || res.Outcome != idempotency.OutcomeAcquired {
			b.Fatalf("claim: %v %v", res.Outcome, err)
		}
		if err := s.Complete(ctx, key, tok, result, 10*time.Minute); err != nil {
			b.Fatal(err)
		}
		if res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "replayed", Fingerprint: fp, Token: tok, Lease: lease}); err != nil || res.Outcome != idempotency.OutcomeReplay {
			b.Fatalf("replay: %v %v", res.Outcome, err)
		}
		raw := []string{s.prefix + "raw:" + key}
		if err := floorClaimScript.EvalSha(ctx, c, raw, string(fp), lease.Milliseconds()).Err(); err != nil {
			b.Fatal(err)
		}
		if err := floorCompleteScript.EvalSha(ctx, c, raw, result).Err(); err != nil {
			b.Fatal(err)
		}
		if err := floorReplayScript.EvalSha(ctx, c, []string{rawReplay}).Err(); err != nil {
			b.Fatal(err)
		}
		if i%500 == 0 {
			collect()
		}
	}
	collect()
	med := func(name string) float64 {
		d := durations[name]
		if len(d) == 0 {
			b.Fatalf("no slowlog entries for %s", name)
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	for _, name := range []string{"claim", "complete", "replay", "floor-claim", "floor-complete", "floor-replay"} {
		b.ReportMetric(med(name), name+"-µs")
	}
	b.ReportMetric((med("claim")+med("complete"))/(med("floor-claim")+med("floor-complete")), "fresh-x-floor")
	b.ReportMetric(med("replay")/med("floor-replay"), "replay-x-floor")
}

func stringOf(c byte, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// preloadLua writes ARGV[2] completed records numbered from ARGV[3]
// under the prefix ARGV[1], in the store's layout (a shard tag, then the
// storage key; fields f t n r), with the result ARGV[4] and a TTL of
// ARGV[5] ms. It declares no keys: single servers only.
var preloadLua = goredis.NewScript(`
local prefix, n, from, result, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
for i = from, from + n - 1 do
  local k = prefix .. '{' .. string.format('%03x', i % 1024) .. '}9:preload:' .. i
  redis.call('HSET', k, 'f', 'h0123456789abcdef0123456789abcdef', 't', '0123456789abcdef0123456789abcdef',
    'n', '1767225600000000', 'r', result)
  redis.call('PEXPIRE', k, ttl)
end
return n
`)

// BenchmarkStuckPass measures a whole listing of Stuck (pages of 100,
// cursor to cursor) over IDEM_BENCH_STUCK_RECORDS live records (default
// 10^6: completed records of the store's shape with a 200-byte result)
// and 100 stuck ones, on the server at IDEM_REDIS_SLOWLOG_ADDR (it writes
// about a gigabyte and changes the slowlog settings: a server of your
// own), or IDEM_REDIS_ADDR. Metrics per pass: ns/op, stuck-calls/op
// (calls of Stuck), scripts/op, server-ms/op (the scripts' time by
// SLOWLOG), script-max-µs and script-median-µs; and the latency of fresh
// claims+completions made one after another from one goroutine during
// the passes and right after them (claim-p50-µs, claim-p99-µs,
// claim-max-µs, and idle-p50-µs, idle-p99-µs, idle-max-µs).
//
//	IDEM_REDIS_SLOWLOG_ADDR=127.0.0.1:26501 go test -run '^$' -bench StuckPass -benchtime 3x -timeout 30m .
func BenchmarkStuckPass(b *testing.B) {
	addr := os.Getenv("IDEM_REDIS_SLOWLOG_ADDR")
	if addr == "" {
		addr = os.Getenv("IDEM_REDIS_ADDR")
	}
	n := 1_000_000
	if v := os.Getenv("IDEM_BENCH_STUCK_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	prefix := "idemtest:sp" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	s, err := New(c, &Options{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { // delete what the benchmark wrote
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, globEscape(prefix)+"*", 10000).Result()
			if err != nil {
				b.Error(err)
				return
			}
			if len(keys) > 0 {
				_ = c.Unlink(ctx, keys...).Err()
			}
			if cursor = next; cursor == 0 {
				return
			}
		}
	}()
	result := stringOf('x', 200)
	for from := 0; from < n; from += 10000 {
		if err := preloadLua.Eval(ctx, c, nil, prefix, min(10000, n-from), from, result, time.Hour.Milliseconds()).Err(); err != nil {
			b.Fatal(err)
		}
	}
	const stuck = 100
	for i := range stuck {
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "9:stuck:" + strconv.Itoa(i), Fingerprint: "fp", Token: "dead", Lease: time.Millisecond, Grace: time.Hour})
		if err != nil || res.Outcome != idempotency.OutcomeAcquired {
			b.Fatalf("claim: %v %v", res.Outcome, err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	cfg, err := c.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for k, v := range cfg {
			_ = c.ConfigSet(ctx, k, v).Err()
		}
	}()
	for k, v := range map[string]string{"slowlog-log-slower-than": "0", "slowlog-max-len": "100000"} {
		if err := c.ConfigSet(ctx, k, v).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := stuckScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	// claims makes fresh claims and completions until stop is closed and
	// returns their latencies in µs.
	claims := func(stop <-chan struct{}, tag string) []float64 {
		var lat []float64
		for i := 0; ; i++ {
			select {
			case <-stop:
				return lat
			default:
			}
			key := "9:live:" + tag + strconv.Itoa(i)
			t0 := time.Now()
			if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: "t", Lease: time.Minute}); err != nil {
				b.Error(err)
				return lat
			}
			if err := s.Complete(ctx, key, "t", []byte("r"), time.Minute); err != nil {
				b.Error(err)
				return lat
			}
			lat = append(lat, float64(time.Since(t0).Microseconds()))
			time.Sleep(200 * time.Microsecond)
		}
	}
	var during, idle, scripts []float64
	var calls int
	var passTime time.Duration
	_ = c.SlowLogReset(ctx).Err()
	for r := 0; b.Loop(); r++ {
		stop := make(chan struct{})
		got := make(chan []float64)
		go func() { got <- claims(stop, "d"+strconv.Itoa(r)+":") }()
		t0 := time.Now()
		listed := 0
		for cursor := ""; ; {
			infos, next, err := s.Stuck(ctx, cursor, 100)
			if err != nil {
				b.Fatal(err)
			}
			calls++
			listed += len(infos)
			if cursor = next; cursor == "" {
				break
			}
		}
		d := time.Since(t0)
		passTime += d
		close(stop)
		during = append(during, <-got...)
		if listed != stuck {
			b.Fatalf("a pass listed %d records, want %d", listed, stuck)
		}
		logs, err := c.SlowLogGet(ctx, -1).Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range logs {
			if len(l.Args) > 1 && l.Args[0] == "evalsha" && l.Args[1] == stuckScript.Hash() {
				scripts = append(scripts, float64(l.Duration.Microseconds()))
			}
		}
		_ = c.SlowLogReset(ctx).Err()
		stop = make(chan struct{})
		go func() { got <- claims(stop, "i"+strconv.Itoa(r)+":") }()
		time.Sleep(d)
		close(stop)
		idle = append(idle, <-got...)
	}
	pct := func(d []float64, p float64) float64 {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return d[min(len(d)-1, int(p*float64(len(d))))]
	}
	total := 0.0
	for _, d := range scripts {
		total += d
	}
	nb := float64(b.N)
	b.ReportMetric(float64(passTime.Nanoseconds())/nb, "ns/op")
	b.ReportMetric(float64(calls)/nb, "stuck-calls/op")
	b.ReportMetric(float64(len(scripts))/nb, "scripts/op")
	b.ReportMetric(total/1000/nb, "server-ms/op")
	b.ReportMetric(pct(scripts, 0.5), "script-median-µs")
	b.ReportMetric(pct(scripts, 1), "script-max-µs")
	b.ReportMetric(pct(during, 0.5), "claim-p50-µs")
	b.ReportMetric(pct(during, 0.99), "claim-p99-µs")
	b.ReportMetric(pct(during, 1), "claim-max-µs")
	b.ReportMetric(pct(idle, 0.5), "idle-p50-µs")
	b.ReportMetric(pct(idle, 0.99), "idle-p99-µs")
	b.ReportMetric(pct(idle, 1), "idle-max-µs")
}
