package memory_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// BenchmarkScale measures Do on a store that already holds n live
// (completed, unexpired) records, for n = 0, 10³, 10⁵ and 10⁶: a fresh
// request (claim, complete) and a replay of a record picked at random
// among the n (so the lookups miss the CPU caches as they would in a
// service). It reports the heap bytes each record takes (B/record), key,
// fingerprint, token, result and the store's bookkeeping included. The
// throughput at every n should stay within 20% of the empty store's.
//
// IDEM_MEMORY_SCALE=10000000 adds the 10⁷ case (about 6 GB of heap and a
// minute of filling):
//
//	IDEM_MEMORY_SCALE=10000000 go test -run '^$' -bench Scale -benchtime 200000x -cpu 1 ./store/memory
func BenchmarkScale(b *testing.B) {
	sizes := []int{0, 1e3, 1e5, 1e6}
	if s := os.Getenv("IDEM_MEMORY_SCALE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("IDEM_MEMORY_SCALE=%q: want a positive number of records", s)
		}
		sizes = append(sizes, n)
	}
	ctx := context.Background()
	scope := []string{"tenant-42"}
	fp := idempotency.FingerprintBytes([]byte(`{"amount":1000,"currency":"EUR"}`))
	result := []byte(`{"payment":"pay_1","status":"succeeded"}`)
	fn := func(context.Context) ([]byte, error) { return result, nil }
	for _, n := range sizes {
		b.Run("records="+strconv.Itoa(n), func(b *testing.B) {
			store := memory.New(nil)
			r, err := idempotency.New(store)
			if err != nil {
				b.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			live := make([]string, n)
			for i := range live {
				live[i] = "live-" + strconv.Itoa(i) + "-0123456789abcdef" // a UUID's length
				if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: live[i], Fingerprint: fp}, fn); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perRecord := 0.0
			if n > 0 {
				// Less the slice of keys kept here, which is not the store's.
				keys := 16*n + n*len("live-0000000-0123456789abcdef")
				perRecord = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)-int64(keys)) / float64(n)
			}
			if store.Len() != n {
				b.Fatalf("the store holds %d records, want %d", store.Len(), n)
			}

			b.Run("fresh", func(b *testing.B) {
				fresh := make([]string, b.N)
				for i := range fresh {
					fresh[i] = "fresh-" + strconv.Itoa(i) + "-" + strconv.Itoa(b.N) + "-0123456789"
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: fresh[i], Fingerprint: fp}, fn)
					if err != nil || res.Replayed {
						b.Fatalf("%+v, %v", res, err)
					}
				}
				b.StopTimer()
				if n > 0 {
					b.ReportMetric(perRecord, "B/record")
				}
			})
			if n == 0 {
				live = []string{"live-only"}
				if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: live[0], Fingerprint: fp}, fn); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("replay", func(b *testing.B) {
				// A fixed pseudo-random walk over the live records.
				x := uint64(0x9E3779B97F4A7C15)
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					key := live[x%uint64(len(live))]
					res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: key, Fingerprint: fp}, fn)
					if err != nil || !res.Replayed {
						b.Fatalf("%+v, %v", res, err)
					}
				}
			})
			runtime.KeepAlive(store)
		})
	}
}
