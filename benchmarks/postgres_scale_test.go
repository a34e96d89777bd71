package benchmarks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
)

// ScaleVar, when set (to anything), adds 10⁷ records to the sizes of
// BenchmarkPostgresScale. Preloading them takes minutes and about 5 GB:
//
//	IDEM_BENCH_SCALE_1E7=1 go test -run '^$' -bench 'PostgresScale/records=1e7' -benchtime 3000x -timeout 1h ./benchmarks/
const scaleVar = "IDEM_BENCH_SCALE_1E7"

// BenchmarkPostgresScale measures Do on a store table that already holds
// 0, 10³, 10⁵ or 10⁶ live (completed, unexpired) records, against the raw
// floor of BenchmarkPostgresFloor on a floor table holding as many rows
// with the same keys: chunks of the two alternate from 16 goroutines on
// one pool of 16 connections. ns/op is Do's, raw-ns/op the floor's, ratio
// raw ÷ Do: the records do not slow Do down when the ratio holds from 0
// records up, within 20%. fresh claims and completes new keys on both
// tables; replay reads records chosen at random among the preloaded ones
// on both (with 0 records, one completed key per goroutine). The floor at
// each size takes out what the server itself pays for a larger table: on
// a machine whose memory is slow to reach at random (a virtual machine
// with nested paging, shared buffers smaller than the table), a primary
// key lookup among 10⁶ rows costs PostgreSQL several times one among 10³,
// whatever runs it (pgbench shows the same), which a comparison of Do on a
// loaded table with Do on an empty one charged to the store. bytes/record
// is pg_total_relation_size (heap, TOAST and every index) over the rows
// after the preload and a VACUUM ANALYZE.
//
// The records are preloaded once per process, with one INSERT ... SELECT
// over generate_series copying a record Do wrote (and one for the floor's
// rows), and dropped at exit:
//
//	go test -run '^$' -bench PostgresScale -count 5 -benchtime 3000x -timeout 30m ./benchmarks/
//
// records=1e7 runs too when IDEM_BENCH_SCALE_1E7 is set.
//
// sweep=1e6 measures claims from 16 goroutines beside Store.Sweep of 10⁶
// expired rows (in batches of Options.SweepBatch, 1000): one operation is
// the whole sweep, so run it with -benchtime 1x. It reports the claims'
// p99 latency before the sweep (p99-base-ms, over as many claims as the
// sweep saw), during it (p99-sweep-ms) and their ratio (p99-ratio, target
// at most 2), and how many rows the sweep deleted (swept).
//
//	go test -run '^$' -bench 'PostgresScale/sweep' -count 5 -benchtime 1x -timeout 30m ./benchmarks/
//
// stuck=1e6 measures a full Store.Stuck pass, in pages of 100 as Reconcile
// lists, over the table of 10⁶ live completed records of records=1e6 plus
// 100 stuck ones (STARTED, lease ended, not expired), beside claims from
// 16 goroutines as sweep=1e6 does: one operation is the whole pass. It
// reports p99-base-ms, p99-stuck-ms, p99-ratio and how many pages the pass
// took (pages).
//
//	go test -run '^$' -bench 'PostgresScale/stuck' -count 5 -benchtime 1x -timeout 30m ./benchmarks/
func BenchmarkPostgresScale(b *testing.B) {
	sizes := []int{0, 1e3, 1e5, 1e6}
	if os.Getenv(scaleVar) != "" {
		sizes = append(sizes, 1e7)
	}
	for _, n := range sizes {
		for _, op := range []string{"fresh", "replay"} {
			b.Run(fmt.Sprintf("records=%s/op=%s/callers=16", power(n), op), func(b *testing.B) {
				postgresScale(b, n, op)
			})
		}
	}
	b.Run("sweep=1e6/callers=16", func(b *testing.B) { postgresSweep(b, 1e6) })
	b.Run("stuck=1e6/callers=16", func(b *testing.B) { postgresStuck(b, 1e6) })
}

// power writes 10^k as 1ek, and 0 as 0.
func power(n int) string {
	if n == 0 {
		return "0"
	}
	k := 0
	for ; n >= 10; n /= 10 {
		k++
	}
	return fmt.Sprintf("1e%d", k)
}

// scaleScope is the scope of every Do in the scale benchmarks.
var scaleScope = []string{"bench"}

// loaded is a store table holding n preloaded records, kept for the
// process.
type loaded struct {
	*pgPlace
	n           int
	bytesPerRec float64
}

var (
	loadedMu     sync.Mutex
	loadedTables = map[int]*loaded{}
	// atExit undoes what the process-wide preloads created; TestMain runs
	// it.
	atExit []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(atExit) - 1; i >= 0; i-- {
		atExit[i]()
	}
	os.Exit(code)
}

// preloaded returns a table with n live completed records, keys
// preload-1 … preload-n, and a floor table with n completed rows of the
// same keys, preloading them on first use.
func preloaded(b *testing.B, n int) *loaded {
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if l, ok := loadedTables[n]; ok {
		return l
	}
	ctx := context.Background()
	p, err := openPGPlace(ctx, func(f func()) { atExit = append(atExit, f) })
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := preload(ctx, p, n, "expires_at"); err != nil {
		b.Fatal(err)
	}
	if err := preloadFloor(ctx, p, n); err != nil {
		b.Fatal(err)
	}
	var size, rows int64
	if err := p.pool.QueryRow(ctx, "SELECT pg_total_relation_size('"+p.table+"'), (SELECT count(*) FROM "+p.table+")").Scan(&size, &rows); err != nil {
		b.Fatal(err)
	}
	b.Logf("preloaded %d records in %v: %d bytes, %.0f bytes/record", rows, time.Since(start).Round(time.Millisecond), size, float64(size)/float64(rows))
	l := &loaded{pgPlace: p, n: n, bytesPerRec: float64(size) / float64(rows)}
	loadedTables[n] = l
	return l
}

// preload writes n copies of a record Do wrote (same fingerprint, token,
// result sizes) under the keys preload-1 … preload-n, with expiresAt (an
// SQL expression over the template row r) as their expiry, then VACUUM
// ANALYZEs the table.
func preload(ctx context.Context, p *pgPlace, n int, expiresAt string) error {
	r, err := idempotency.New(p.store, idempotency.WithRetention(time.Hour))
	if err != nil {
		return err
	}
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scaleScope, Key: "preload-0"}, fn); err != nil {
		return err
	}
	sk, err := r.StorageKey(idempotency.Request{Scope: scaleScope, Key: "preload-0"})
	if err != nil {
		return err
	}
	// A storage key is the scope's, then the key's length, a colon and
	// the key: checked here for preload-0, built so in SQL for the others.
	x, err := r.StorageKey(idempotency.Request{Scope: scaleScope, Key: "x"})
	if err != nil {
		return err
	}
	prefix, ok := strings.CutSuffix(x, "1:x")
	if !ok || sk != prefix+"9:preload-0" {
		return fmt.Errorf("storage keys %q, %q are not built as the preload assumes", x, sk)
	}
	seq := p.table[:len(p.table)-1] + `_fence_seq"`
	_, err = p.pool.Exec(ctx, `INSERT INTO `+p.table+` (key, fingerprint, state, token, fence, attempt,
		lease_until, grace, expires_at, checkpoints, result, created_at, sweep_at)
	SELECT $1::text || length('preload-' || i) || ':preload-' || i, r.fingerprint, r.state, md5(i::text), nextval('`+seq+`'), r.attempt,
		r.lease_until, r.grace, `+expiresAt+`, r.checkpoints, r.result, r.created_at, LEAST(r.sweep_at, `+expiresAt+`)
	FROM `+p.table+` AS r, generate_series(1, $2::bigint) AS i
	WHERE r.key = $3::text`, prefix, int64(n), sk)
	if err != nil {
		return fmt.Errorf("preloading %d records: %w", n, err)
	}
	_, err = p.pool.Exec(ctx, "VACUUM ANALYZE "+p.table)
	return err
}

// preloadFloor writes n completed rows into p's floor table, with the
// store's keys preload-1 … preload-n and the result a record of the
// benchmarks stores, then VACUUM ANALYZEs it.
func preloadFloor(ctx context.Context, p *pgPlace, n int) error {
	resp, err := json.Marshal(bench.Result)
	if err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, "INSERT INTO "+p.floor+" (key, st, resp, lease) SELECT 'preload-' || i, 'completed', $1::bytea, now() FROM generate_series(1, $2::bigint) AS i", resp, int64(n)); err != nil {
		return fmt.Errorf("preloading %d floor rows: %w", n, err)
	}
	_, err = p.pool.Exec(ctx, "VACUUM ANALYZE "+p.floor)
	return err
}

func postgresScale(b *testing.B, n int, op string) {
	l := preloaded(b, n)
	ctx := context.Background()
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	r, err := idempotency.New(l.store, idempotency.WithRetention(bench.Retention))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := json.Marshal(bench.Result)
	if err != nil {
		b.Fatal(err)
	}
	run := bench.RandomHex(4)
	do := func(key string) error {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scaleScope, Key: key}, fn)
		if err == nil && res.Replayed != (op == "replay") {
			err = fmt.Errorf("Do of %s: replayed %v in the %s workload", key, res.Replayed, op)
		}
		return err
	}
	raw := rawFloor(ctx, l.pgPlace, resp) // the statements of BenchmarkPostgresFloor
	rawFresh := raw.Fresh
	rawReplay := func(key string) error {
		_, err := raw.Replay(key)
		return err
	}
	// replayKey is the record a replay reads: one at random among the
	// preloaded ones, or with none, goroutine g's own.
	replayKey := func(g int) string {
		if l.n == 0 {
			return fmt.Sprintf("hot-%s-%d", run, g)
		}
		return fmt.Sprintf("preload-%d", 1+rand.IntN(l.n))
	}
	bench.Warm(16, func(g int) error {
		if err := do(fmt.Sprintf("warm-%s-%d", run, g)); err != nil && op == "fresh" {
			return err
		}
		if err := rawFresh(fmt.Sprintf("warm-%s-%d", run, g)); err != nil {
			return err
		}
		if l.n == 0 && op == "replay" {
			if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scaleScope, Key: replayKey(g)}, fn); err != nil {
				return err
			}
			return rawFresh(replayKey(g))
		}
		return nil
	}, b.Fatal)
	bench.Compare(b, 16, &l.trips, "raw",
		func(g, i int) error {
			if op == "replay" {
				return do(replayKey(g))
			}
			return do(fmt.Sprintf("k-%s-%d", run, i))
		},
		func(g, i int) error {
			if op == "replay" {
				return rawReplay(replayKey(g))
			}
			return rawFresh(fmt.Sprintf("k-%s-%d", run, i))
		})
	perRecord := l.bytesPerRec
	if l.n == 0 {
		perRecord = 0 // the table's first pages, for one template row
	}
	b.ReportMetric(perRecord, "bytes/record")
}

// timedClaims records the latency of every Claim of the store it wraps.
type timedClaims struct {
	idempotency.Store
	mu    sync.Mutex
	times []time.Duration
}

func (t *timedClaims) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	start := time.Now()
	res, err := t.Store.Claim(ctx, r)
	d := time.Since(start)
	t.mu.Lock()
	t.times = append(t.times, d)
	t.mu.Unlock()
	return res, err
}

// take returns the latencies recorded since the last take.
func (t *timedClaims) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.times
	t.times = nil
	return d
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[(len(d)*99)/100]
}

func postgresSweep(b *testing.B, n int) {
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		p := newPGPlace(b)
		if err := preload(ctx, p, n, "clock_timestamp() - interval '1 hour'"); err != nil {
			b.Fatal(err)
		}
		var swept int
		took, base, during := besideClaims(b, p, func() (err error) {
			swept, err = p.store.Sweep(ctx, 0)
			return err
		})
		if swept < n {
			b.Fatalf("the sweep deleted %d rows, want at least %d", swept, n)
		}
		reportBeside(b, "sweep", took, base, during)
		b.ReportMetric(float64(swept), "swept")
	}
}

// stuckRecords is how many stuck records BenchmarkPostgresScale's
// stuck=1e6 adds to the 10⁶ live completed ones.
const stuckRecords = 100

// postgresStuck measures a full Stuck pass, in pages of 100 as Reconcile
// and idemctl list, over the table of n live completed records that the
// records=1eK benchmarks use, to which it adds stuckRecords STARTED
// records whose lease ended and which have not expired. Fresh Do calls run
// beside it from 16 goroutines (see besideClaims).
func postgresStuck(b *testing.B, n int) {
	b.StopTimer()
	ctx := context.Background()
	l := preloaded(b, n)
	if err := addStuck(ctx, l.pgPlace, stuckRecords); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		b.StopTimer()
		var listed, pages int
		took, base, during := besideClaims(b, l.pgPlace, func() error {
			listed, pages = 0, 0
			cursor := ""
			for {
				infos, next, err := l.store.Stuck(ctx, cursor, 100)
				if err != nil {
					return err
				}
				pages++
				for _, info := range infos {
					if strings.Contains(info.Key, ":stuck-") {
						listed++
					}
				}
				if next == "" {
					return nil
				}
				cursor = next
			}
		})
		if listed != stuckRecords {
			b.Fatalf("the Stuck pass listed %d of the %d stuck records", listed, stuckRecords)
		}
		reportBeside(b, "stuck", took, base, during)
		b.ReportMetric(float64(pages), "pages")
	}
}

// addStuck adds n STARTED records under the keys stuck-1 … stuck-n to p's
// table, copies of the completed record preload-1 whose lease ended a
// minute ago and which expire in an hour (once: a repeat adds nothing).
func addStuck(ctx context.Context, p *pgPlace, n int) error {
	r, err := idempotency.New(p.store)
	if err != nil {
		return err
	}
	tmpl, err := r.StorageKey(idempotency.Request{Scope: scaleScope, Key: "preload-1"})
	if err != nil {
		return err
	}
	seq := p.table[:len(p.table)-1] + `_fence_seq"`
	_, err = p.pool.Exec(ctx, `INSERT INTO `+p.table+` (key, fingerprint, state, token, fence, attempt,
		lease_until, grace, expires_at, checkpoints, result, created_at, sweep_at)
	SELECT replace(r.key, ':preload-1', ':stuck-' || i), r.fingerprint, 'started', md5(i::text), nextval('`+seq+`'), 1,
		clock_timestamp() - interval '1 minute', interval '61 minutes', clock_timestamp() + interval '1 hour', NULL, NULL, r.created_at,
		clock_timestamp() + interval '1 hour'
	FROM `+p.table+` AS r, generate_series(1, $1::bigint) AS i
	WHERE r.key = $2::text
	ON CONFLICT DO NOTHING`, int64(n), tmpl)
	return err
}

// besideClaims runs op while fresh Do calls on p's store run from 16
// goroutines, after a baseline of 3 s of the same claims alone, and returns
// op's time and the latencies of the claims before and during it. b's
// timer runs from op's start until the claims beside it have stopped
// (reportBeside then reports op's own time as ns/op).
func besideClaims(b *testing.B, p *pgPlace, op func() error) (took time.Duration, base, during []time.Duration) {
	ctx := context.Background()
	tc := &timedClaims{Store: p.store}
	r, err := idempotency.New(tc, idempotency.WithRetention(bench.Retention))
	if err != nil {
		b.Fatal(err)
	}
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	run := bench.RandomHex(4)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	// claim runs fresh Do calls from 16 goroutines until stop closes.
	claim := func(stop <-chan struct{}) {
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("k-%s-%d", run, next.Add(1))
					if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scaleScope, Key: key}, fn); err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	// Warm the connections, then the baseline: claims alone.
	stop := make(chan struct{})
	time.AfterFunc(500*time.Millisecond, func() { close(stop) })
	claim(stop)
	tc.take()
	stop = make(chan struct{})
	time.AfterFunc(3*time.Second, func() { close(stop) })
	claim(stop)
	base = tc.take()

	b.StartTimer()
	stop = make(chan struct{})
	var opErr error
	start := time.Now()
	go func() {
		opErr = op()
		took = time.Since(start)
		close(stop)
	}()
	claim(stop)
	b.StopTimer()
	during = tc.take()
	if e := failed.Load(); e != nil {
		b.Fatal(*e)
	}
	if opErr != nil {
		b.Fatal(opErr)
	}
	return took, base, during
}

// reportBeside reports what besideClaims measured beside op: the claims'
// p99 before (p99-base-ms) and during it (p99-OP-ms), their ratio
// (p99-ratio), and the claims' rate during op and before it.
func reportBeside(b *testing.B, op string, took time.Duration, base, during []time.Duration) {
	pb, pd := p99(base), p99(during)
	b.ReportMetric(float64(took.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(float64(pb)/1e6, "p99-base-ms")
	b.ReportMetric(float64(pd)/1e6, "p99-"+op+"-ms")
	b.ReportMetric(float64(pd)/float64(pb), "p99-ratio")
	b.ReportMetric(float64(len(during))/took.Seconds(), "claims/s")
	b.ReportMetric(float64(len(base))/3, "base-claims/s")
}
