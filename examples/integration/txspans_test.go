package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/postgres"
)

// TestTransactionalCallIsADoCall: a call in PostgreSQL's transactional
// mode (TxExecutor and DoTx) is a call of Do like any other. Step runs its
// step (the transaction is the recovery point), the call has its
// idempotency.do span with the store calls (claim, complete) as children
// and fn's own span, the call is counted by its outcome, and a retry
// replays without running fn.
func TestTransactionalCallIsADoCall(t *testing.T) {
	pool := testPostgres(t)
	ctx := context.Background()
	schema := fmt.Sprintf("txspans_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	store, err := postgres.New(pool, &postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".charges (key text, amount int)"); err != nil {
		t.Fatal(err)
	}

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	tel, err := otelidem.New(&otelidem.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(tel.Store(store), idempotency.WithObserver(tel))
	if err != nil {
		t.Fatal(err)
	}
	exec, err := postgres.NewTxExecutor(pool, runner, nil)
	if err != nil {
		t.Fatal(err)
	}

	steps := 0
	charge := func(ctx context.Context, tx pgx.Tx, key string) error {
		_, span := tp.Tracer("app").Start(ctx, "charge")
		defer span.End()
		amount, err := idempotency.Step(ctx, "quote", func(ctx context.Context) (int, error) {
			steps++
			return 1000, nil
		})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+schema+".charges VALUES ($1, $2)", key, amount)
		return err
	}
	viaExecutor := func(key string) idempotency.Result[[]byte] {
		res, err := exec.Execute(ctx, idempotency.Request{Key: key}, func(ctx context.Context) ([]byte, error) {
			tx, _ := postgres.TxFromContext(ctx)
			return []byte("ok"), charge(ctx, tx, key)
		})
		if err != nil {
			t.Fatalf("TxExecutor, key %s: %v", key, err)
		}
		return res
	}
	viaDoTx := func(key string) idempotency.Result[string] {
		var res idempotency.Result[string]
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			res, err = postgres.DoTx(ctx, runner, tx, idempotency.Request{Key: key}, func(ctx context.Context, tx pgx.Tx) (string, error) {
				return "ok", charge(ctx, tx, key)
			})
			return err
		})
		if err != nil {
			t.Fatalf("DoTx, key %s: %v", key, err)
		}
		return res
	}

	first, again := viaExecutor("executor"), viaExecutor("executor")
	second, replay := viaDoTx("dotx"), viaDoTx("dotx")
	if first.Outcome != idempotency.OutcomeCompleted || !first.Ran || again.Outcome != idempotency.OutcomeReplay || again.Ran {
		t.Errorf("TxExecutor: %+v, then %+v; want completed (ran), then replayed", first, again)
	}
	if second.Outcome != idempotency.OutcomeCompleted || replay.Outcome != idempotency.OutcomeReplay || replay.Value != "ok" {
		t.Errorf("DoTx: %+v, then %+v; want completed, then a replay of ok", second, replay)
	}
	if steps != 2 {
		t.Errorf("the step ran %d times in two fresh calls, want 2 (once each; not in the replays)", steps)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".charges").Scan(&rows); err != nil || rows != 2 {
		t.Errorf("%d charge rows (%v), want 2", rows, err)
	}

	// Spans: four calls of Do; each fresh one has the claim, the
	// completion and fn's span as children, and no renewal (the
	// transaction holds the row's lock).
	var calls []sdktrace.ReadOnlySpan
	children := map[string][]string{}
	for _, s := range spans.Ended() {
		if s.Name() == "idempotency.do" {
			calls = append(calls, s)
		}
	}
	for _, s := range spans.Ended() {
		for _, c := range calls {
			if s.Parent().SpanID() == c.SpanContext().SpanID() {
				children[c.SpanContext().SpanID().String()] = append(children[c.SpanContext().SpanID().String()], s.Name())
			}
		}
	}
	if len(calls) != 4 {
		t.Fatalf("%d idempotency.do spans, want 4 (one per call)", len(calls))
	}
	var outcomes []string
	for _, c := range calls {
		var outcome string
		for _, kv := range c.Attributes() {
			if kv.Key == otelidem.AttrOutcome {
				outcome = kv.Value.AsString()
			}
		}
		outcomes = append(outcomes, outcome)
		kids := children[c.SpanContext().SpanID().String()]
		slices.Sort(kids)
		want := []string{"idempotency.store.claim"}
		if outcome == "completed" {
			want = []string{"charge", "idempotency.store.claim", "idempotency.store.complete"}
		}
		if !slices.Equal(kids, want) {
			t.Errorf("a %s call's children: %v, want %v", outcome, kids, want)
		}
		t.Logf("idempotency.do (%s=%s) > %v", otelidem.AttrOutcome, outcome, kids)
	}
	slices.Sort(outcomes)
	if want := []string{"completed", "completed", "replayed", "replayed"}; !slices.Equal(outcomes, want) {
		t.Errorf("call outcomes %v, want %v", outcomes, want)
	}

	// Metrics: the calls counted by outcome, as any others.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counted := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != otelidem.MetricCalls {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(otelidem.AttrOutcome)
				counted[v.AsString()] += dp.Value
			}
		}
	}
	if counted["completed"] != 2 || counted["replayed"] != 2 || len(counted) != 2 {
		t.Errorf("idempotency.calls by outcome: %v, want 2 completed and 2 replayed", counted)
	}
}

// testPostgres returns a pool on IDEM_POSTGRES_URL, closed when the test
// ends, or fails the test.
func testPostgres(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL) or set IDEM_POSTGRES_URL")
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("IDEM_POSTGRES_URL: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatalf("cannot reach the PostgreSQL at IDEM_POSTGRES_URL (%v); run scripts/test.sh", err)
	}
	return pool
}
