package bench

import (
	"encoding/json"
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
	compare(b, callers, trips, do, baseline{"raw", raw})
}

// HotKey is the completed key that goroutine g replays in a "replay"
// floor ([FloorOp]); make it, through Do and through the floor's own
// statements, before the measurement.
func HotKey(g int) string { return fmt.Sprintf("hot-%d", g) }

// FloorCalls are a raw floor's calls, for [FloorOps]: Fresh makes the
// round trips of a fresh call for key (storing the encoded [Result] it
// was given beforehand); Replay reads key's completed record and returns
// the value it stores, the JSON encoding of [Result].
type FloorCalls struct {
	Fresh  func(key string) error
	Replay func(key string) ([]byte, error)
}

// FloorOps measures Do against two floors on the same server, alternating
// in chunks as [Floor] does: the raw floor, f's calls as they are (trivial
// statements: the physical limit), and the JSON floor, which also does
// what every caller of a raw driver must do with the value: encode
// [Result] with encoding/json before a fresh call's round trips, and
// decode the value a replay read into a [Payment] (and compare it with
// Result) after its round trip. op "fresh" gives every call a new key, op
// "replay" has goroutine g read [HotKey](g) again and again. Besides
// Floor's metrics it reports json-ns/op and json-ratio = json-ns/op ÷
// ns/op. The targets are against the raw floor.
func FloorOps(b *testing.B, op string, callers int, trips *atomic.Int64, do func(key string) error, f FloorCalls) {
	rawReplay := func(key string) error {
		_, err := f.Replay(key)
		return err
	}
	jsonFresh := func(key string) error {
		if _, err := json.Marshal(Result); err != nil {
			return err
		}
		return f.Fresh(key)
	}
	jsonReplay := func(key string) error {
		v, err := f.Replay(key)
		if err != nil {
			return err
		}
		var p Payment
		if err := json.Unmarshal(v, &p); err != nil {
			return fmt.Errorf("decoding the value of %s: %w", key, err)
		}
		if p != Result {
			return fmt.Errorf("the value of %s decodes to %+v, want %+v", key, p, Result)
		}
		return nil
	}
	if op == "replay" {
		compare(b, callers, trips, func(g, _ int) error { return do(HotKey(g)) },
			baseline{"raw", func(g, _ int) error { return rawReplay(HotKey(g)) }},
			baseline{"json", func(g, _ int) error { return jsonReplay(HotKey(g)) }})
		return
	}
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	jsonKey := func(i int) string { return fmt.Sprintf("j%d", i) }
	compare(b, callers, trips, func(_, i int) error { return do(key(i)) },
		baseline{"raw", func(_, i int) error { return f.Fresh(key(i)) }},
		baseline{"json", func(_, i int) error { return jsonFresh(jsonKey(i)) }})
}

// FloorOp is [FloorOps] for a floor whose replay returns no value: its
// JSON floor decodes, after each replay, the bytes its fresh calls store
// (the encoded [Result]) rather than the bytes read, which costs the same.
func FloorOp(b *testing.B, op string, callers int, trips *atomic.Int64, do, fresh, replay func(key string) error) {
	FloorOps(b, op, callers, trips, do, FloorCalls{Fresh: fresh, Replay: func(key string) ([]byte, error) {
		return resultJSON, replay(key)
	}})
}

// resultJSON is [Result] encoded with encoding/json.
var resultJSON = func() []byte {
	v, err := json.Marshal(Result)
	if err != nil {
		panic(err)
	}
	return v
}()

// Compare is [Floor] with another name for the baseline: it reports
// ns/op (do's), base+"-ns/op" (the baseline's) and ratio = baseline
// time ÷ do's time, so 1 means do costs no more than the baseline.
func Compare(b *testing.B, callers int, trips *atomic.Int64, base string, do, raw func(g, i int) error) {
	compare(b, callers, trips, do, baseline{base, raw})
}

// baseline is what compare measures do against: name names its metrics.
type baseline struct {
	name string
	f    func(g, i int) error
}

// Baseline is one of what [CompareAll] measures do against: Name names
// its metrics, F is one call.
type Baseline struct {
	Name string
	F    func(g, i int) error
}

// CompareAll is [Compare] against several baselines: the first's ratio
// is "ratio", the others' NAME-ratio. It returns do's total time, for a
// caller that reports it per item of an op (a batch's per message).
func CompareAll(b *testing.B, callers int, trips *atomic.Int64, do func(g, i int) error, bases ...Baseline) time.Duration {
	bs := make([]baseline, len(bases))
	for i, x := range bases {
		bs[i] = baseline{x.Name, x.F}
	}
	return compare(b, callers, trips, do, bs...)
}

// compare runs chunks of n calls of do and of each baseline in turn,
// from callers goroutines each, so that all see the same load, and
// reports ns/op (do's), NAME-ns/op for each baseline, ratio = the first
// baseline's time ÷ do's and NAME-ratio for the others, and roundtrips/op
// of do as counted in trips. It also reports the CPU time this process
// (the client) spent per call, cpu-ns/op for do and NAME-cpu-ns/op for
// each baseline: the chunks run one after another, so the process's CPU
// time over a chunk is that chunk's, and unlike the elapsed time it hardly
// moves with the load of a shared machine.
func compare(b *testing.B, callers int, trips *atomic.Int64, do func(g, i int) error, bases ...baseline) time.Duration {
	run := func(n, base int, f func(g, i int) error) (elapsed, cpu time.Duration) {
		cpu0 := cpuTime()
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
		return time.Since(start), cpuTime() - cpu0
	}
	chunk := max(50, 10*callers)
	var doTime, doCPU time.Duration
	baseTime := make([]time.Duration, len(bases))
	baseCPU := make([]time.Duration, len(bases))
	var doTrips int64
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		t0 := trips.Load()
		elapsed, cpu := run(n, done, do)
		doTime, doCPU = doTime+elapsed, doCPU+cpu
		doTrips += trips.Load() - t0
		for i, base := range bases {
			elapsed, cpu := run(n, done, base.f)
			baseTime[i], baseCPU[i] = baseTime[i]+elapsed, baseCPU[i]+cpu
		}
	}
	b.StopTimer()
	perOp := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(perOp(doTime), "ns/op")
	b.ReportMetric(perOp(doCPU), "cpu-ns/op")
	for i, base := range bases {
		b.ReportMetric(perOp(baseTime[i]), base.name+"-ns/op")
		b.ReportMetric(perOp(baseCPU[i]), base.name+"-cpu-ns/op")
		unit := base.name + "-ratio"
		if i == 0 {
			unit = "ratio"
		}
		b.ReportMetric(float64(baseTime[i])/float64(doTime), unit)
	}
	b.ReportMetric(float64(doTrips)/float64(b.N), "roundtrips/op")
	return doTime
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
