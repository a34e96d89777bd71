package redis_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// BenchmarkStore runs the conformance package's store benchmarks on the
// single server and on the cluster.
func BenchmarkStore(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		c := newSingle(b)
		conformancetest.Benchmark(b, func(b *testing.B) idempotency.Store { return newStore(b, c, nil) })
	})
	b.Run("cluster", func(b *testing.B) {
		c := newCluster(b)
		conformancetest.Benchmark(b, func(b *testing.B) idempotency.Store { return newStore(b, c, nil) })
	})
}

// trivialScript is the baseline: a script that does nothing, called with
// the same key and arguments as the claim.
var trivialScript = goredis.NewScript(`return 1`)

// fingerprint is a realistic one: "sha256:" and 64 hex digits.
var fingerprint = idempotency.FingerprintBytes([]byte(`{"amount":1000,"currency":"EUR"}`))

// result200 is fn's result: JSON-encoded and framed by Do, it is stored as
// exactly 200 bytes (1 kind byte, 2 quotes, 197 letters).
var result200 = strings.Repeat("x", 197)

// BenchmarkDo measures idempotency.Do on the Redis store against raw
// go-redis on the same server in the same run, iteration by iteration:
//
//   - fresh: Do of a new key (claim + complete) against two EVALSHA of a
//     trivial script;
//   - replay: Do of a completed key (claim) against one EVALSHA.
//
// Metrics: ns/op is Do's; raw-ns/op the baseline's; throughput-ratio is
// raw-ns/op divided by ns/op (1 means Do costs no more than the bare
// round trips; the target is 0.9 or more); round-trips/op counts the Do's
// commands and pipelines with a go-redis hook; for fresh, bytes/record is
// MEMORY USAGE of a completed record with a 200-byte result and a sha256
// fingerprint, under the server's configuration (with Redis's default
// hash-max-listpack-value of 64 the record is a hashtable; see the
// README's sizing section).
func BenchmarkDo(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		benchDo(b, func(h *countHook) goredis.UniversalClient {
			c := newSingle(b)
			c.AddHook(h)
			return c
		})
	})
	b.Run("cluster", func(b *testing.B) {
		benchDo(b, func(h *countHook) goredis.UniversalClient {
			c := newCluster(b)
			c.AddHook(h)
			return c
		})
	})
}

func benchDo(b *testing.B, client func(*countHook) goredis.UniversalClient) {
	ctx := context.Background()
	newRunner := func(b *testing.B) (*idempotency.Runner, *idemredis.Store, *countHook, goredis.UniversalClient) {
		var h countHook
		c := client(&h)
		s := newStore(b, c, nil)
		if s.Client() != idemredis.Client(c) { // a clone, which has none of c's hooks
			addHook(b, s, &h)
		}
		r, err := idempotency.New(s, idempotency.WithRetention(10*time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		if err := trivialScript.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		h.n.Store(0)
		return r, s, &h, c
	}
	fn := func(context.Context) (string, error) { return result200, nil }

	b.Run("fresh", func(b *testing.B) {
		r, s, h, c := newRunner(b)
		raw := newRawClient(b, c)
		var doTime, rawTime time.Duration
		var last string
		i := 0
		for b.Loop() {
			key := "k" + strconv.Itoa(i)
			i++
			t0 := time.Now()
			res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"tenant-42"}, Key: key, Fingerprint: fingerprint}, fn)
			t1 := time.Now()
			if err != nil || res.Replayed {
				b.Fatalf("Do of fresh key %s: replayed %v, %v", key, res.Replayed, err)
			}
			for range 2 {
				if err := trivialScript.Run(ctx, raw, []string{s.Key(key)}, string(fingerprint), "0123456789abcdef0123456789abcdef", 30000, 0).Err(); err != nil {
					b.Fatal(err)
				}
			}
			rawTime += time.Since(t1)
			doTime += t1.Sub(t0)
			last = key
		}
		report(b, doTime, rawTime, h.n.Load())
		sk, err := r.StorageKey(idempotency.Request{Scope: []string{"tenant-42"}, Key: last})
		if err != nil {
			b.Fatal(err)
		}
		mem, err := c.MemoryUsage(ctx, s.Key(sk), 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		n, err := c.HStrLen(ctx, s.Key(sk), "r").Result()
		if err != nil || n != 200 {
			b.Fatalf("stored result is %d bytes (%v), want 200", n, err)
		}
		b.ReportMetric(float64(mem), "bytes/record")
	})

	// The store's operations without Do, to tell the adapter's cost from
	// the core's.
	b.Run("claim_complete", func(b *testing.B) {
		_, s, h, c := newRunner(b)
		raw := newRawClient(b, c)
		result := []byte("v" + `"` + result200 + `"`)
		var doTime, rawTime time.Duration
		i := 0
		for b.Loop() {
			key := "k" + strconv.Itoa(i)
			i++
			tok := idempotency.Token("0123456789abcdef0123456789abcdef")
			t0 := time.Now()
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fingerprint, Token: tok, Lease: 30 * time.Second})
			if err != nil || res.Outcome != idempotency.OutcomeAcquired {
				b.Fatalf("claim of fresh key %s: %v, %v", key, res.Outcome, err)
			}
			if err := s.Complete(ctx, key, tok, result, 10*time.Minute); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			for range 2 {
				if err := trivialScript.Run(ctx, raw, []string{s.Key(key)}, string(fingerprint), "0123456789abcdef0123456789abcdef", 30000, 0).Err(); err != nil {
					b.Fatal(err)
				}
			}
			rawTime += time.Since(t1)
			doTime += t1.Sub(t0)
		}
		report(b, doTime, rawTime, h.n.Load())
	})

	b.Run("replay", func(b *testing.B) {
		r, s, h, c := newRunner(b)
		raw := newRawClient(b, c)
		req := idempotency.Request{Scope: []string{"tenant-42"}, Key: "replayed", Fingerprint: fingerprint}
		if _, err := idempotency.Do(ctx, r, req, fn); err != nil {
			b.Fatal(err)
		}
		sk, _ := r.StorageKey(req)
		h.n.Store(0)
		var doTime, rawTime time.Duration
		for b.Loop() {
			t0 := time.Now()
			res, err := idempotency.Do(ctx, r, req, fn)
			t1 := time.Now()
			if err != nil || !res.Replayed || res.Value != result200 {
				b.Fatalf("Do of a completed key: replayed %v, %v", res.Replayed, err)
			}
			if err := trivialScript.Run(ctx, raw, []string{s.Key(sk)}, string(fingerprint), "0123456789abcdef0123456789abcdef", 30000, 0).Err(); err != nil {
				b.Fatal(err)
			}
			rawTime += time.Since(t1)
			doTime += t1.Sub(t0)
		}
		report(b, doTime, rawTime, h.n.Load())
	})
}

// newRawClient returns a second client of the same kind and servers as c,
// without the counting hook, for the baseline.
func newRawClient(b *testing.B, c goredis.UniversalClient) goredis.UniversalClient {
	switch c := c.(type) {
	case *goredis.Client:
		r := goredis.NewClient(&goredis.Options{Addr: c.Options().Addr})
		b.Cleanup(func() { _ = r.Close() })
		return r
	case *goredis.ClusterClient:
		r := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Options().Addrs})
		b.Cleanup(func() { _ = r.Close() })
		return r
	}
	b.Fatalf("unexpected client %T", c)
	return nil
}

func report(b *testing.B, doTime, rawTime time.Duration, roundTrips int64) {
	n := float64(b.N)
	b.ReportMetric(float64(doTime.Nanoseconds())/n, "ns/op")
	b.ReportMetric(float64(rawTime.Nanoseconds())/n, "raw-ns/op")
	b.ReportMetric(float64(rawTime)/float64(doTime), "throughput-ratio")
	b.ReportMetric(float64(roundTrips)/n, "round-trips/op")
}

// BenchmarkCallDeadline measures what making a context's deadline hold
// costs a store call on a client that ignores deadlines in socket I/O
// (go-redis's default, ContextTimeoutEnabled false), against the same call
// on a client that honours them, on the same server in the same run,
// alternating which goes first: a replayed Claim (one round trip) under a
// deadline of 2s, like the attempts of idempotency.Do with a store
// timeout. Metrics: ns/op is the default client's call; honouring-ns/op
// the honouring client's; overhead-ns/op the difference.
func BenchmarkCallDeadline(b *testing.B) {
	addr := singleAddr(b)
	def := goredis.NewClient(&goredis.Options{Addr: addr})
	hon := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = def.Close(); _ = hon.Close() })
	prefix := uniquePrefix()
	sd := newStore(b, def, &idemredis.Options{Prefix: prefix})
	sh := newStore(b, hon, &idemredis.Options{Prefix: prefix})
	ctx := context.Background()
	req := idempotency.ClaimRequest{Key: "replayed", Fingerprint: fingerprint, Token: "0123456789abcdef0123456789abcdef", Lease: 30 * time.Second}
	if _, err := sd.Claim(ctx, req); err != nil {
		b.Fatal(err)
	}
	if err := sd.Complete(ctx, req.Key, req.Token, []byte("v"+`"`+result200+`"`), 10*time.Minute); err != nil {
		b.Fatal(err)
	}
	claim := func(s *idemredis.Store) time.Duration {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		t0 := time.Now()
		res, err := s.Claim(cctx, req)
		d := time.Since(t0)
		if err != nil || res.Outcome != idempotency.OutcomeReplay {
			b.Fatalf("claim of a completed key: %v, %v", res.Outcome, err)
		}
		return d
	}
	var defTime, honTime time.Duration
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			defTime += claim(sd)
			honTime += claim(sh)
		} else {
			honTime += claim(sh)
			defTime += claim(sd)
		}
		i++
	}
	n := float64(b.N)
	b.ReportMetric(float64(defTime.Nanoseconds())/n, "ns/op")
	b.ReportMetric(float64(honTime.Nanoseconds())/n, "honouring-ns/op")
	b.ReportMetric(float64((defTime-honTime).Nanoseconds())/n, "overhead-ns/op")
}

// BenchmarkStuck measures a page of Stuck (see the README's figures):
//
//   - empty: a pass over all 1024 shards of a store with nothing stuck
//     (one page that finds nothing), what a reconciler pays on every pass
//     of a healthy system;
//   - page100: a page of 100 out of 2,000 stuck records spread over the
//     shards, cycling through them.
//
// Metrics: ns/op and round-trips/op per page; records/op for page100.
func BenchmarkStuck(b *testing.B) {
	for _, tc := range deployments {
		// open returns a store on a client that counts round trips.
		open := func(b *testing.B) (*idemredis.Store, *countHook) {
			h := new(countHook)
			s := newStore(b, tc.client(b), nil)
			addHook(b, s, h)
			return s, h
		}
		b.Run(tc.name+"/empty", func(b *testing.B) {
			s, h := open(b)
			ctx := context.Background()
			if _, _, err := s.Stuck(ctx, "", 100); err != nil { // loads the script
				b.Fatal(err)
			}
			h.n.Store(0)
			for b.Loop() {
				infos, next, err := s.Stuck(ctx, "", 100)
				if err != nil || len(infos) != 0 || next != "" {
					b.Fatalf("Stuck of an empty store: %d records, %q, %v", len(infos), next, err)
				}
			}
			b.ReportMetric(float64(h.n.Load())/float64(b.N), "round-trips/op")
		})
		b.Run(tc.name+"/page100", func(b *testing.B) {
			s, h := open(b)
			ctx := context.Background()
			const n = 2000
			for i := range n {
				k := "9:tenant-42:stuck-" + strconv.Itoa(i)
				res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: k, Fingerprint: fingerprint, Token: "dead", Lease: 100 * time.Millisecond, Grace: time.Hour})
				if err != nil || res.Outcome != idempotency.OutcomeAcquired {
					b.Fatalf("claim: %v, %v", res.Outcome, err)
				}
			}
			time.Sleep(150 * time.Millisecond)
			h.n.Store(0)
			cursor, listed := "", 0
			for b.Loop() {
				infos, next, err := s.Stuck(ctx, cursor, 100)
				if err != nil {
					b.Fatal(err)
				}
				listed += len(infos)
				cursor = next
			}
			b.ReportMetric(float64(h.n.Load())/float64(b.N), "round-trips/op")
			b.ReportMetric(float64(listed)/float64(b.N), "records/op")
		})
	}
}
