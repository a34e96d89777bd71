package conformancetest

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/idempotency"
)

// Benchmark measures the operations [idempotency.Do] makes, with a fresh
// store from newStore for each sub-benchmark:
//
//   - ClaimComplete: a fresh claim of a new key and its Complete, the
//     store's cost of a first request;
//   - Replay: a claim of one completed key, the cost of a retry;
//   - InProgress: a claim of one key held under a live lease;
//   - ParallelClaim: fresh claims of distinct keys from b.RunParallel's
//     goroutines, the cost of a first request under load.
//
// Each iteration of ClaimComplete and ParallelClaim uses a key no other
// iteration uses (the benchmark fails if a claim is not acquired, which
// would show keys colliding); Replay and InProgress hit one key on
// purpose. Key strings are built in the loop, so allocs/op includes one or
// two allocations for them. Custom metrics: store-ops/op (store calls per
// iteration) and, for ParallelClaim, goroutines.
func Benchmark(b *testing.B, newStore func(b *testing.B) idempotency.Store) {
	ctx := context.Background()
	result := []byte(`{"id":"pay_123","status":"succeeded","amount":1000}`)

	b.Run("ClaimComplete", func(b *testing.B) {
		s := newStore(b)
		prefix := "bench-" + randomHex(8) + "/"
		buf := []byte(prefix)
		acquired := 0
		for b.Loop() {
			buf = strconv.AppendInt(buf[:len(prefix)], int64(acquired), 10)
			key := string(buf)
			tok := idempotency.Token(key)
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fpA, Token: tok, Lease: long, Grace: long})
			if err != nil || res.Outcome != idempotency.OutcomeAcquired {
				b.Fatalf("claim of fresh key %s: %v %v (keys must not collide)", key, res.Outcome, err)
			}
			if err := s.Complete(ctx, key, tok, result, long); err != nil {
				b.Fatalf("complete %s: %v", key, err)
			}
			acquired++
		}
		b.ReportMetric(2, "store-ops/op")
	})

	b.Run("Replay", func(b *testing.B) {
		s := newStore(b)
		key := "bench-" + randomHex(8) + "/replay"
		tok := idempotency.Token(randomHex(16))
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fpA, Token: tok, Lease: long, Grace: long}); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, tok, result, long); err != nil {
			b.Fatal(err)
		}
		retry := idempotency.Token(randomHex(16))
		for b.Loop() {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fpA, Token: retry, Lease: long, Grace: long})
			if err != nil || res.Outcome != idempotency.OutcomeReplay || len(res.Result) != len(result) {
				b.Fatalf("replay: %v %v, result of %d bytes, want replay of %d bytes", res.Outcome, err, len(res.Result), len(result))
			}
		}
		b.ReportMetric(1, "store-ops/op")
	})

	b.Run("InProgress", func(b *testing.B) {
		s := newStore(b)
		key := "bench-" + randomHex(8) + "/held"
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fpA, Token: "holder", Lease: long, Grace: long}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fpA, Token: "duplicate", Lease: long, Grace: long})
			if err != nil || res.Outcome != idempotency.OutcomeInProgress {
				b.Fatalf("duplicate claim: %v %v, want in_progress", res.Outcome, err)
			}
		}
		b.ReportMetric(1, "store-ops/op")
	})

	b.Run("ParallelClaim", func(b *testing.B) {
		s := newStore(b)
		prefix := "bench-" + randomHex(8) + "/"
		var goroutines, acquired atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			g := goroutines.Add(1)
			mine := strconv.AppendInt([]byte(prefix), g, 10)
			mine = append(mine, '-')
			buf := mine
			var n int64
			for pb.Next() {
				buf = strconv.AppendInt(buf[:len(mine)], n, 10)
				key := string(buf)
				res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fpA, Token: idempotency.Token(key), Lease: long, Grace: long})
				if err != nil || res.Outcome != idempotency.OutcomeAcquired {
					b.Errorf("claim of fresh key %s: %v %v (keys must not collide)", key, res.Outcome, err)
					return
				}
				n++
			}
			acquired.Add(n)
		})
		b.StopTimer()
		if got := acquired.Load(); got != int64(b.N) {
			b.Fatalf("%d distinct keys acquired in %d iterations, want one per iteration", got, b.N)
		}
		b.ReportMetric(1, "store-ops/op")
		b.ReportMetric(float64(goroutines.Load()), "goroutines")
	})
}
