package memory_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

// BenchmarkScale measures Do on a store that already holds n live
// (completed, unexpired) records, for n = 0, 10³, 10⁵ and 10⁶: a fresh
// request (claim, complete) and a replay of one of 1024 records of a
// working set, the same at every n, so that what is measured is the cost
// of the n other records and not of reaching records out of the CPU's
// caches. The throughput at every n should stay within 20% of the empty
// store's. cpu-ns/op is the process's CPU time per operation, garbage
// collection included: steadier than ns/op on a shared machine.
// BenchmarkRecordSize gives the bytes per record.
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
			store := memStore(nil)
			r, err := idempotency.New(store)
			if err != nil {
				b.Fatal(err)
			}
			live := make([]string, n)
			for i := range live {
				live[i] = "live-" + strconv.Itoa(i) + "-0123456789abcdef" // a UUID's length
				if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: live[i], Fingerprint: fp}, fn); err != nil {
					b.Fatal(err)
				}
			}
			if store.Len() != n {
				b.Fatalf("the store holds %d records, want %d", store.Len(), n)
			}

			runs := 0 // -count runs this sub-benchmark again on the same store
			b.Run("fresh", func(b *testing.B) {
				runs++
				fresh := make([]string, b.N)
				for i := range fresh {
					fresh[i] = "fresh-" + strconv.Itoa(i) + "-" + strconv.Itoa(b.N) + "-" + strconv.Itoa(runs) + "-0123456789"
				}
				b.ReportAllocs()
				b.ResetTimer()
				cpu := cpuTime()
				for i := range b.N {
					res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: fresh[i], Fingerprint: fp}, fn)
					if err != nil || res.Replayed {
						b.Fatalf("%+v, %v", res, err)
					}
				}
				b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
			})
			// Replays go to a working set of 1024 records made for them,
			// the same at every n: what is measured is the cost of the n
			// other records, not of reaching records out of the CPU's
			// caches.
			work := make([]string, 1024)
			for i := range work {
				work[i] = "work-" + strconv.Itoa(i) + "-0123456789abcdef"
				if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: work[i], Fingerprint: fp}, fn); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("replay", func(b *testing.B) {
				// A fixed pseudo-random walk over the live records.
				x := uint64(0x9E3779B97F4A7C15)
				b.ReportAllocs()
				b.ResetTimer()
				cpu := cpuTime()
				for range b.N {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					key := work[x%uint64(len(work))]
					res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: key, Fingerprint: fp}, fn)
					if err != nil || !res.Replayed {
						b.Fatalf("%+v, %v", res, err)
					}
				}
				b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
			})
			runtime.KeepAlive(store)
		})
	}
}

// BenchmarkRecordSize reports the heap bytes a completed record takes
// (B/record): its key (a 38-byte storage key), fingerprint, token, a
// 40-byte result and the store's
// bookkeeping (map entry, expiry heap). Run it on its own, so that no
// other benchmark's store is freed while it measures:
//
//	go test -run '^$' -bench RecordSize -benchtime 1x ./store/memory
func BenchmarkRecordSize(b *testing.B) {
	const n = 1_000_000
	ctx := context.Background()
	// A []byte result as Do stores it under the default codec: its kind,
	// then the bytes.
	result := []byte(`b{"payment":"pay_1","status":"succeeded"}`)
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		store := memStore(nil)
		for i := range n {
			key, err := idempotency.StorageKey([]string{"tenant-42"}, "live-"+strconv.Itoa(i)+"-0123456789abcdef")
			if err != nil {
				b.Fatal(err)
			}
			tok := idempotency.Token("0123456789abcdef0123456789abcde" + strconv.Itoa(i%10))
			// A fingerprint of its own, as every request has.
			fp := idempotency.FingerprintBytes([]byte(key))
			if _, err := store.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tok, Lease: 30 * time.Second}); err != nil {
				b.Fatal(err)
			}
			if err := store.Complete(ctx, key, tok, result, 24*time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if store.Len() != n {
			b.Fatalf("%d records, want %d", store.Len(), n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/record")
		runtime.KeepAlive(store)
	}
}
