package bench

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Floor measures Do against a raw floor on the same server: chunks of n
// calls of do and of raw alternate, from callers goroutines each, so that
// both see the same load. do(g, i) and raw(g, i) make call i from
// goroutine g. It reports ns/op (Do's), raw-ns/op (the floor's), ratio =
// raw-ns/op ÷ ns/op, and roundtrips/op of Do as counted in trips.
func Floor(b *testing.B, callers int, trips *atomic.Int64, do, raw func(g, i int) error) {
	Compare(b, callers, trips, "raw", do, raw)
}

// HotKey is the completed key that goroutine g replays in a "replay"
// floor ([FloorOp]); make it, through Do and through the floor's own
// statements, before the measurement.
func HotKey(g int) string { return fmt.Sprintf("hot-%d", g) }

// FloorOp runs [Floor] for one workload: op "fresh" gives every call a new
// key, op "replay" has goroutine g read [HotKey](g) again and again. do
// runs Do on a key; fresh and replay run the floor's statements for it.
func FloorOp(b *testing.B, op string, callers int, trips *atomic.Int64, do, fresh, replay func(key string) error) {
	if op == "replay" {
		Floor(b, callers, trips,
			func(g, _ int) error { return do(HotKey(g)) },
			func(g, _ int) error { return replay(HotKey(g)) })
		return
	}
	Floor(b, callers, trips,
		func(_, i int) error { return do(fmt.Sprintf("k%d", i)) },
		func(_, i int) error { return fresh(fmt.Sprintf("k%d", i)) })
}

// Compare is [Floor] with another name for the baseline: it reports
// ns/op (do's), base+"-ns/op" (the baseline's) and ratio = baseline
// time ÷ do's time, so 1 means do costs no more than the baseline.
func Compare(b *testing.B, callers int, trips *atomic.Int64, base string, do, raw func(g, i int) error) {
	run := func(n, base int, f func(g, i int) error) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		start := time.Now()
		for g := range callers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					if err := f(g, base+i); err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
			})
		}
		wg.Wait()
		if e := failed.Load(); e != nil {
			b.Fatal(*e)
		}
		return time.Since(start)
	}
	chunk := max(50, 10*callers)
	var doTime, rawTime time.Duration
	var doTrips int64
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		t0 := trips.Load()
		doTime += run(n, done, do)
		doTrips += trips.Load() - t0
		rawTime += run(n, done, raw)
	}
	b.StopTimer()
	b.ReportMetric(float64(doTime.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(float64(rawTime.Nanoseconds())/float64(b.N), base+"-ns/op")
	b.ReportMetric(float64(rawTime)/float64(doTime), "ratio")
	b.ReportMetric(float64(doTrips)/float64(b.N), "roundtrips/op")
}

// Warm runs f(g) for g in [0, callers) at once, one goroutine each, so
// that every connection a pool will use is dialled and has its statements
// prepared before the timer starts; it calls fatal with the first error.
func Warm(callers int, f func(g int) error, fatal func(args ...any)) {
	var wg sync.WaitGroup
	errs := make([]error, callers)
	for g := range callers {
		wg.Go(func() { errs[g] = f(g) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			fatal(err)
			return
		}
	}
}
