package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/postgres/internal/pgtest"
	"github.com/exactlyonce/idempotency/store/postgres/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests run against the PostgreSQL at IDEM_POSTGRES_URL, which
// scripts/test.sh starts (scripts/servers/postgres.sh). The test binary
// works in a schema of its own, dropped at the end, and every test in a
// table of its own.
//
// Connections: one shared pool of testPoolSize, plus one LISTEN connection
// per running relay (at most four at a time) and a few small pools of
// tests that need their own (killed relays, query modes): 15 at most, 10
// at the peak measured, which fits PostgreSQL's stock max_connections of
// 100 next to the other suites. Every connection is named outbox_test
// (or outbox-relay-...) in pg_stat_activity.

var (
	randomHex = pgtest.RandomHex
	testURL   = pgtest.URL
)

const testPoolSize = 8

var (
	setupOnce  sync.Once
	setupErr   error
	sharedPool *pgxpool.Pool
	testSchema = "outbox_test_" + randomHex(6)
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedPool != nil {
		pgtest.DropSchema(sharedPool, testSchema)
		sharedPool.Close()
	}
	os.Exit(code)
}

// testPool returns the shared pool, creating the test schema on first use.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := testURL(t)
	setupOnce.Do(func() {
		p, err := openPool(url, pgx.QueryExecModeCacheStatement, testPoolSize, "")
		if err != nil {
			setupErr = err
			return
		}
		sharedPool = p
		setupErr = pgtest.CreateSchema(p, testSchema)
	})
	if setupErr != nil {
		t.Fatal(pgtest.Unreachable(setupErr))
	}
	return sharedPool
}

// ownPool opens a pool for one test, closed at its end.
func ownPool(t testing.TB, mode pgx.QueryExecMode, size int32, appName string) *pgxpool.Pool {
	t.Helper()
	testPool(t) // the schema
	p, err := openPool(testURL(t), mode, size, appName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func openPool(url string, mode pgx.QueryExecMode, maxConns int32, appName string) (*pgxpool.Pool, error) {
	if appName == "" {
		appName = "outbox_test" // to count the tests' connections in pg_stat_activity
	}
	return pgtest.OpenPool(url, mode, maxConns, appName)
}

// newTable returns a migrated outbox table on db in the test schema, in
// a table of its own unless opts names one.
func newTable(t testing.TB, db *pgxpool.Pool, opts *outbox.Options) *outbox.Table {
	t.Helper()
	tb := tableOn(t, db, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tb.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return tb
}

// tableOn returns an outbox table on db, in the test schema, without
// migrating it; opts.Table defaults to a new random name.
func tableOn(t testing.TB, db postgres.DB, opts *outbox.Options) *outbox.Table {
	t.Helper()
	testPool(t)
	var o outbox.Options
	if opts != nil {
		o = *opts
	}
	o.Schema = testSchema
	if o.Table == "" {
		o.Table = "ob_" + randomHex(6)
	}
	tb, err := outbox.New(db, &o)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// qualified is the SQL name of a test table.
func qualified(tb *outbox.Table) string { return testSchema + "." + outbox.TableName(tb) }

// testLogger logs the relays' warnings and errors into the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// start runs r until the test ends (or the returned stop is called, which
// waits for Run to return and reports its error).
func start(t testing.TB, r *outbox.Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("Run did not return within 30s of its context's end")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return stop
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// enqueue writes events in transactions of perTx events each.
func enqueue(t testing.TB, db *pgxpool.Pool, tb *outbox.Table, perTx int, events []outbox.Event) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < len(events); i += perTx {
		chunk := events[i:min(i+perTx, len(events))]
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return tb.Enqueue(ctx, tx, chunk...) }); err != nil {
			t.Fatal(err)
		}
	}
}

// count runs a count query.
func count(t testing.TB, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// recorder is a Sender that keeps every delivery, and fails or blocks as
// told.
type recorder struct {
	mu     sync.Mutex
	got    []outbox.Message // successful sends, in order
	tries  map[string]int   // sends per event ID, failed ones included
	failFn func(m outbox.Message) error
}

func newRecorder() *recorder { return &recorder{tries: map[string]int{}} }

func (r *recorder) Send(ctx context.Context, m outbox.Message) error {
	r.mu.Lock()
	r.tries[m.ID]++
	f := r.failFn
	r.mu.Unlock()
	if f != nil {
		if err := f(m); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.got = append(r.got, m)
	r.mu.Unlock()
	return nil
}

func (r *recorder) setFail(f func(m outbox.Message) error) {
	r.mu.Lock()
	r.failFn = f
	r.mu.Unlock()
}

// delivered returns the successful sends so far.
func (r *recorder) delivered() []outbox.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Message(nil), r.got...)
}

// distinct returns how many distinct events were delivered.
func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range r.got {
		seen[m.ID] = true
	}
	return len(seen)
}

func (r *recorder) triesOf(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tries[id]
}

// events returns n events with fresh IDs and payload "i".
func events(n int, key func(i int) string) []outbox.Event {
	out := make([]outbox.Event, n)
	for i := range out {
		out[i] = outbox.Event{ID: outbox.NewEventID(), Topic: "test", Payload: fmt.Appendf(nil, "%d", i)}
		if key != nil {
			out[i].Key = key(i)
		}
	}
	return out
}

// relayOpts are fast options for tests: short polls and backoffs.
func relayOpts(t testing.TB, o outbox.RelayOptions) *outbox.RelayOptions {
	if o.PollInterval == 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	if o.Backoff == 0 {
		o.Backoff = time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 20 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	return &o
}

func newRelay(t testing.TB, tb *outbox.Table, s outbox.Sender, o outbox.RelayOptions) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(tb, s, relayOpts(t, o))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
