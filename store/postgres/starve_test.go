package postgres_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/postgres/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// starveEnv is the service of issue 25: payServer (httpidem on a
// TxExecutor) on a pool of 4 connections, whose handler holds its
// transaction open for the key "slow" (3 s at most, or until the test
// releases it), and probes of the connections held.
type starveEnv struct {
	*txEnv
	probeDB *pgxpool.Pool // the shared pool, to watch the service's
	app     string        // the service pool's application_name
	url     string
	started chan struct{} // closed when the slow handler runs
	release chan struct{} // closed by the test: the slow handler returns
	// slowDone is set when the slow handler returned; slowTimedOut when it
	// returned because its 3 s ran out rather than by release.
	slowDone, slowTimedOut atomic.Bool
}

const starvePoolSize = 4

func newStarveEnv(t *testing.T, runnerOpts ...idempotency.Option) *starveEnv {
	t.Helper()
	base := newTxEnv(t, nil)
	e := &starveEnv{probeDB: base.pool, app: "starve_" + randomHex(4),
		started: make(chan struct{}), release: make(chan struct{})}
	small, err := pgtest.OpenPool(testURL(t), pgx.QueryExecModeCacheStatement, starvePoolSize, e.app)
	if err != nil {
		t.Fatal(pgtest.Unreachable(err))
	}
	t.Cleanup(small.Close)
	// Open all four connections now, so that the figures do not include
	// connecting.
	conns := make([]*pgxpool.Conn, starvePoolSize)
	for i := range conns {
		if conns[i], err = small.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	// The same table, through a store on the small pool.
	store, err := postgres.New(small, &postgres.Options{Schema: testSchema, Table: strings.TrimPrefix(base.table, testSchema+".")})
	if err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store, runnerOpts...)
	if err != nil {
		t.Fatal(err)
	}
	e.txEnv = &txEnv{pool: small, store: store, runner: runner, table: base.table, effects: base.effects}
	var once sync.Once
	e.hold = func(key string) {
		if key != "slow" {
			return
		}
		once.Do(func() { close(e.started) })
		select {
		case <-e.release:
		case <-time.After(3 * time.Second):
			e.slowTimedOut.Store(true)
		}
		e.slowDone.Store(true)
	}
	e.url = payServer(t, e.txEnv, nil).URL
	t.Cleanup(func() {
		select {
		case <-e.release:
		default:
			close(e.release)
		}
	})
	return e
}

// probe samples, every 5 ms until stop, the service pool's acquired
// connections and its backends waiting on a lock (all of them duplicates:
// the slow call holds the row lock, it does not wait for one), and
// reports the most connections held at once and the time backends spent
// waiting on a lock, summed (connection-milliseconds).
func (e *starveEnv) probe(t *testing.T, stop <-chan struct{}) (maxHeld, lockWaitMs *atomic.Int64) {
	maxHeld, lockWaitMs = new(atomic.Int64), new(atomic.Int64)
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			if h := int64(e.pool.Stat().AcquiredConns()); h > maxHeld.Load() {
				maxHeld.Store(h)
			}
			var n int64
			if err := e.probeDB.QueryRow(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", e.app).Scan(&n); err == nil {
				now := time.Now()
				lockWaitMs.Add(n * now.Sub(last).Milliseconds())
				last = now
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return maxHeld, lockWaitMs
}

type starveReply struct {
	status   int
	replayed string
	took     time.Duration
}

// post sends a payment with key, and reports on sent once the request
// is written.
func (e *starveEnv) post(t *testing.T, key string, sent chan<- struct{}) starveReply {
	start := time.Now()
	r, err := http.NewRequest("POST", e.url+"/payments", strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Error(err)
		return starveReply{}
	}
	r.Header.Set("Idempotency-Key", key)
	if sent != nil {
		r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { sent <- struct{}{} },
		}))
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Error(err)
		return starveReply{}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return starveReply{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), time.Since(start)}
}

// run sends 10 concurrent requests with the key "slow" and, once all ten
// are sent and the first is in its handler, one request with the key
// "other". It releases the slow handler once the other key was answered.
func (e *starveEnv) run(t *testing.T) (other starveReply, dups []starveReply, maxHeld, lockWaitMs int64) {
	t.Helper()
	stop := make(chan struct{})
	held, waited := e.probe(t, stop)
	const n = 10
	dups = make([]starveReply, n)
	sent := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { dups[i] = e.post(t, "slow", sent) })
	}
	for range n {
		<-sent
	}
	select {
	case <-e.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request's handler never ran")
	}
	other = e.post(t, "other", nil)
	if e.slowDone.Load() {
		t.Errorf("the first request's transaction had ended (timed out: %v) before the other key was answered: the test measured nothing", e.slowTimedOut.Load())
	}
	close(e.release)
	wg.Wait()
	close(stop)
	time.Sleep(10 * time.Millisecond) // the probe's last sample
	return other, dups, held.Load(), waited.Load()
}

// TestTxDuplicatesDoNotStarvePool is issue 25's case: behind httpidem, a
// TxExecutor with every default on a pool of 4 connections; 10 concurrent
// requests with one key whose handler holds its transaction, then one
// request with another key. The other key gets its 201 while the first
// transaction still runs, and exactly one payment row is made for each
// key:
//   - by default, duplicates answer 409 after a short lock wait (or replay
//     the 201 once the first committed) instead of each holding a
//     connection, blocked on the row lock, for the length of the first
//     transaction (which left the other key 503 "store unavailable" after
//     the 2 s store timeout, waiting for a connection);
//   - on a runner with WithWait, duplicates wait between transactions,
//     holding no connection while they pause, and all get the first
//     call's 201 replayed.
func TestTxDuplicatesDoNotStarvePool(t *testing.T) {
	for _, c := range []struct {
		name     string
		opts     []idempotency.Option
		allow409 bool
	}{
		{"default", nil, true},
		{"runner_wait", []idempotency.Option{idempotency.WithWait(time.Minute)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newStarveEnv(t, c.opts...)
			other, dups, held, waited := e.run(t)
			t.Logf("other key: %d in %v; connections held at most %d of %d; waiting on a lock: %d connection-ms; duplicates: %s",
				other.status, other.took.Round(time.Millisecond), held, starvePoolSize, waited, summary(dups))
			if other.status != http.StatusCreated {
				t.Fatalf("the other key got %d after %v, want 201 while the first transaction runs", other.status, other.took)
			}
			fresh := 0
			for _, d := range dups {
				if isFresh(t, d.status, d.replayed, c.allow409) {
					fresh++
				}
			}
			if fresh != 1 {
				t.Errorf("%d fresh 201s for the slow key, want 1: %+v", fresh, dups)
			}
			if rows, others := e.effectRows(t, "slow"), e.effectRows(t, "other"); rows != 1 || others != 1 {
				t.Fatalf("payment rows: %d for the slow key, %d for the other; want 1 and 1", rows, others)
			}
		})
	}
}

// summary lists replies as status:latency ("r" for a replay), for the log.
func summary(rs []starveReply) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d%s:%v", r.status, map[string]string{"true": "r"}[r.replayed], r.took.Round(time.Millisecond))
	}
	return b.String()
}
