package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

// Payment is what fn returns in every workload: a typical API response,
// whose JSON encoding is exactly [ResultSize] bytes.
type Payment struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
	Customer    string `json:"customer"`
	Description string `json:"description"`
	Created     int64  `json:"created"`
}

// ResultSize is the size of [Result] encoded as JSON, in bytes.
const ResultSize = 200

// Result is fn's result in every workload.
var Result = Payment{
	ID:          "pay_3PqR7sT9uV1wX3yZ5aB7cD9e",
	Object:      "payment",
	Amount:      125000,
	Currency:    "eur",
	Status:      "succeeded",
	Customer:    "cus_Q8rS2tU4vW6xY8zA",
	Description: "Invoice 2024-00042",
	Created:     1767225600,
}

// The shape of the contended workload: [HotKeys] keys are hot at a time,
// and each takes [PerKey] requests (interleaved with the other hot keys'),
// then is replaced by a new key. So 1 request in PerKey acquires, and the
// others find the key in progress or completed.
const (
	HotKeys = 4
	PerKey  = 8
)

// Workload is one way of calling [idempotency.Do], run on every backend.
type Workload struct {
	// Name names the workload in benchmark names (op=Name).
	Name string
	// Doc says what one operation is.
	Doc string
	// Run runs b.N operations on the backend. It returns an error when an
	// operation fails or the outcomes are not the ones the workload is
	// built to produce (every fresh key acquired, every replay replayed, one
	// acquisition per contended key), so that a benchmark that measured
	// something else fails instead of reporting a figure.
	//
	// Besides ns/op and allocs/op it reports roundtrips/op (0 for the
	// memory store) and, for contended, acquired/op, replayed/op and
	// inprogress/op.
	Run func(b *testing.B, be *Backend) error
}

// Workloads lists every workload, in the order they are run and reported.
var Workloads = []Workload{
	{Name: "fresh", Doc: "Do with a new key: claim, run fn, complete", Run: fresh},
	{Name: "replay", Doc: "Do with a completed key: claim, replay the stored result", Run: replay},
	{Name: "parallel-fresh", Doc: "fresh from " + strconv.Itoa(Parallelism) + "×GOMAXPROCS goroutines, every key distinct", Run: parallelFresh},
	{Name: "contended", Doc: "from " + strconv.Itoa(Parallelism) + "×GOMAXPROCS goroutines on " + strconv.Itoa(HotKeys) + " hot keys, each taking " + strconv.Itoa(PerKey) + " requests", Run: contended},
}

// Scope is the scope of every request.
var Scope = []string{"tenant-42", "payments"}

// fingerprint is the fingerprint of every request: the workloads measure
// Do and the store, not hashing, so it is computed once.
var fingerprint = func() idempotency.Fingerprint {
	fp, err := idempotency.FingerprintJSON(map[string]any{"amount": 125000, "currency": "eur", "customer": "cus_Q8rS2tU4vW6xY8zA"})
	if err != nil {
		panic(err)
	}
	return fp
}()

// Retention is the runner's retention: long enough for any run, short
// enough that Redis drops what a killed run left behind.
const Retention = 10 * time.Minute

// run is the state of one run of a workload.
type run struct {
	b      *testing.B
	be     *Backend
	r      *idempotency.Runner // of the measured operations
	warm   *idempotency.Runner // of the warm-up
	prefix string              // of every key of this run: runs never share a key
	ran    atomic.Int64
	trips0 int64
}

// newRun prepares a run; fresh says that each key is used once.
func newRun(b *testing.B, be *Backend, fresh bool) (*run, error) {
	store := be.Store()
	// The warm-up replays what it wrote, so it keeps the long retention
	// whatever the run's.
	warm, err := idempotency.New(store, idempotency.WithRetention(Retention))
	if err != nil {
		return nil, err
	}
	r := warm
	if fresh && be.freshRetention > 0 {
		// A retention this short is below idempotency.MinRetention and
		// shorter than the default lease: it only bounds the memory store
		// during the run, which fn's instant return makes safe.
		r, err = idempotency.New(store, idempotency.WithRetention(be.freshRetention),
			idempotency.WithLease(be.freshRetention/2), idempotency.WithUnsafeShortDurations())
		if err != nil {
			return nil, err
		}
	}
	return &run{b: b, be: be, r: r, warm: warm, prefix: RandomHex(6) + "-"}, nil
}

func (w *run) fn(context.Context) (Payment, error) {
	w.ran.Add(1)
	return Result, nil
}

func (w *run) do(ctx context.Context, key string) (idempotency.Result[Payment], error) {
	return doWith(ctx, w.r, key, w.fn)
}

func doWith(ctx context.Context, r *idempotency.Runner, key string, fn func(context.Context) (Payment, error)) (idempotency.Result[Payment], error) {
	return idempotency.Do(ctx, r, idempotency.Request{Scope: Scope, Key: key, Fingerprint: fingerprint}, fn)
}

// key returns the i-th key of the run, in one allocation (the store keeps
// the string anyway).
func (w *run) key(tag byte, i int64) string {
	var buf [48]byte
	b := append(buf[:0], w.prefix...)
	b = append(b, tag)
	return string(strconv.AppendInt(b, i, 10))
}

// warmUp does, from each of goroutines goroutines at once, a fresh Do and
// a replay on keys outside the measured set, so that connections are
// dialled, scripts loaded (Redis) and statements prepared (Postgres) before
// the timer starts.
func (w *run) warmUp(ctx context.Context, goroutines int) error {
	var wg sync.WaitGroup
	var fail firstErr
	for g := range goroutines {
		wg.Go(func() {
			key := w.key('w', int64(g))
			if res, err := doWith(ctx, w.warm, key, w.fn); err != nil || res.Replayed {
				fail.store(fmt.Errorf("warm-up Do of %q: replayed %v, %w", key, res.Replayed, err))
				return
			}
			w.be.warmRecords.Add(1)
			if res, err := doWith(ctx, w.warm, key, w.fn); err != nil || !res.Replayed || res.Value != Result {
				fail.store(fmt.Errorf("warm-up replay of %q: replayed %v, value %+v, %w", key, res.Replayed, res.Value, err))
			}
		})
	}
	wg.Wait()
	w.ran.Store(0)
	return fail.err
}

// goroutines is how many goroutines b.RunParallel starts after
// b.SetParallelism(Parallelism).
func goroutines() int { return Parallelism * runtime.GOMAXPROCS(0) }

// startTrips notes the round trips made so far; call right before the
// timed part.
func (w *run) startTrips() { w.trips0, _ = w.be.RoundTrips() }

// reportTrips reports the round trips per operation since startTrips.
func (w *run) reportTrips(n int) {
	if n == 0 {
		return
	}
	t, _ := w.be.RoundTrips()
	w.b.ReportMetric(float64(t-w.trips0)/float64(n), "roundtrips/op")
}

func fresh(b *testing.B, be *Backend) error {
	ctx := context.Background()
	w, err := newRun(b, be, true)
	if err != nil {
		return err
	}
	if err := w.warmUp(ctx, 1); err != nil {
		return err
	}
	w.startTrips()
	var i int64
	for b.Loop() {
		key := w.key('f', i)
		i++
		res, err := w.do(ctx, key)
		if err != nil {
			return fmt.Errorf("fresh Do of %q: %w", key, err)
		}
		if res.Replayed {
			return fmt.Errorf("fresh Do of %q replayed: the keys are not distinct, so this measures replays", key)
		}
	}
	w.reportTrips(b.N)
	if got := w.ran.Load(); got != int64(b.N) {
		return fmt.Errorf("fn ran %d times in %d fresh operations", got, b.N)
	}
	return nil
}

func replay(b *testing.B, be *Backend) error {
	ctx := context.Background()
	w, err := newRun(b, be, false)
	if err != nil {
		return err
	}
	if err := w.warmUp(ctx, 1); err != nil {
		return err
	}
	key := w.key('r', 0)
	if res, err := w.do(ctx, key); err != nil || res.Replayed {
		return fmt.Errorf("first Do of %q: replayed %v, %w", key, res.Replayed, err)
	}
	w.startTrips()
	for b.Loop() {
		res, err := w.do(ctx, key)
		if err != nil {
			return fmt.Errorf("replay of %q: %w", key, err)
		}
		if !res.Replayed || res.Value != Result {
			return fmt.Errorf("replay of %q: replayed %v, value %+v", key, res.Replayed, res.Value)
		}
	}
	w.reportTrips(b.N)
	if got := w.ran.Load(); got != 1 {
		return fmt.Errorf("fn ran %d times for one key, want 1", got)
	}
	return nil
}

// firstErr keeps the first error of parallel workers; b.Fatal may only be
// called from the benchmark's own goroutine.
type firstErr struct {
	once sync.Once
	err  error
	set  atomic.Bool
}

func (f *firstErr) store(err error) {
	f.once.Do(func() { f.err = err; f.set.Store(true) })
}

func parallelFresh(b *testing.B, be *Backend) error {
	ctx := context.Background()
	w, err := newRun(b, be, true)
	if err != nil {
		return err
	}
	if err := w.warmUp(ctx, goroutines()); err != nil {
		return err
	}
	var next, acquired atomic.Int64
	var fail firstErr
	b.SetParallelism(Parallelism)
	w.startTrips()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if fail.set.Load() {
				continue // drain the remaining operations
			}
			key := w.key('p', next.Add(1)-1)
			res, err := w.do(ctx, key)
			switch {
			case err != nil:
				fail.store(fmt.Errorf("parallel fresh Do of %q: %w", key, err))
			case res.Replayed:
				fail.store(fmt.Errorf("parallel fresh Do of %q replayed: the keys are not distinct", key))
			default:
				acquired.Add(1)
			}
		}
	})
	b.StopTimer()
	if fail.err != nil {
		return fail.err
	}
	w.reportTrips(b.N)
	if a, r := acquired.Load(), w.ran.Load(); a != int64(b.N) || r != int64(b.N) {
		return fmt.Errorf("%d operations on distinct keys: %d acquired, fn ran %d times", b.N, a, r)
	}
	return nil
}

// ContendedKeys is how many distinct keys the first n operations of the
// contended workload use.
func ContendedKeys(n int) int {
	gen := HotKeys * PerKey
	return n/gen*HotKeys + min(n%gen, HotKeys)
}

func contended(b *testing.B, be *Backend) error {
	ctx := context.Background()
	w, err := newRun(b, be, false)
	if err != nil {
		return err
	}
	if err := w.warmUp(ctx, goroutines()); err != nil {
		return err
	}
	var next, acquired, replayed, inProgress atomic.Int64
	var fail firstErr
	b.SetParallelism(Parallelism)
	w.startTrips()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var buf [48]byte
		for pb.Next() {
			if fail.set.Load() {
				continue
			}
			i := next.Add(1) - 1
			// Key k of generation g: consecutive operations, which run at
			// about the same time, go round the hot keys of a generation.
			kb := append(buf[:0], w.prefix...)
			kb = append(kb, 'c')
			kb = strconv.AppendInt(kb, i/(HotKeys*PerKey), 10)
			kb = append(kb, '-')
			kb = strconv.AppendInt(kb, i%HotKeys, 10)
			key := string(kb)
			res, err := w.do(ctx, key)
			switch {
			case errors.Is(err, idempotency.ErrInProgress):
				inProgress.Add(1)
			case err != nil:
				fail.store(fmt.Errorf("contended Do of %q: %w", key, err))
			case res.Replayed:
				if res.Value != Result {
					fail.store(fmt.Errorf("contended Do of %q replayed %+v", key, res.Value))
				}
				replayed.Add(1)
			default:
				acquired.Add(1)
			}
		}
	})
	b.StopTimer()
	if fail.err != nil {
		return fail.err
	}
	w.reportTrips(b.N)
	a, r, p := acquired.Load(), replayed.Load(), inProgress.Load()
	n := float64(b.N)
	b.ReportMetric(float64(a)/n, "acquired/op")
	b.ReportMetric(float64(r)/n, "replayed/op")
	b.ReportMetric(float64(p)/n, "inprogress/op")
	// Every key is acquired exactly once: the first request finds it
	// absent, and fn never fails, so no later one acquires it again.
	if want := int64(ContendedKeys(b.N)); a != want || w.ran.Load() != a || a+r+p != int64(b.N) {
		return fmt.Errorf("%d operations on %d keys: %d acquired (want %d), %d replayed, %d in progress, fn ran %d times",
			b.N, want, a, want, r, p, w.ran.Load())
	}
	return nil
}
