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
