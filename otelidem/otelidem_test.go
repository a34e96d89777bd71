package otelidem_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/memory"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// harness is an Observer on an in-memory metric reader and span recorder.
type harness struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	o      *otelidem.Observer
}

func newHarness(t *testing.T, opts otelidem.Options) *harness {
	t.Helper()
	h := &harness{t: t, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	opts.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	opts.TracerProvider = h.tp
	o, err := otelidem.New(&opts)
	if err != nil {
		t.Fatal(err)
	}
	h.o = o
	return h
}

func (h *harness) collect() metricdata.ResourceMetrics {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatal(err)
	}
	return rm
}

// metric returns the metric of that name, failing the test if it is
// missing or if any metric is not one of ours.
func (h *harness) metric(name string) metricdata.Metrics {
	h.t.Helper()
	rm := h.collect()
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelidem.ScopeName {
			h.t.Errorf("instrumentation scope %q, want %q", sm.Scope.Name, otelidem.ScopeName)
		}
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m
			}
		}
	}
	h.t.Fatalf("no metric %q", name)
	return metricdata.Metrics{}
}

// attrKey renders an attribute set for comparisons.
func attrKey(s attribute.Set) string {
	kvs := s.ToSlice()
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = string(kv.Key) + "=" + kv.Value.String()
	}
	return strings.Join(parts, ",")
}

// sums returns an Int64 sum's points by attributes.
func (h *harness) sums(name, unit string, monotonic bool) map[string]int64 {
	h.t.Helper()
	m := h.metric(name)
	if m.Unit != unit {
		h.t.Errorf("%s: unit %q, want %q", name, m.Unit, unit)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		h.t.Fatalf("%s: data %T, want Sum[int64]", name, m.Data)
	}
	if sum.IsMonotonic != monotonic || sum.Temporality != metricdata.CumulativeTemporality {
		h.t.Errorf("%s: monotonic %v, temporality %v", name, sum.IsMonotonic, sum.Temporality)
	}
	got := map[string]int64{}
	for _, p := range sum.DataPoints {
		got[attrKey(p.Attributes)] = p.Value
	}
	return got
}

// counts returns a histogram's point counts by attributes.
func (h *harness) counts(name string) map[string]uint64 {
	h.t.Helper()
	m := h.metric(name)
	if m.Unit != "s" {
		h.t.Errorf("%s: unit %q, want s", name, m.Unit)
	}
	hist, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		h.t.Fatalf("%s: data %T, want Histogram[float64]", name, m.Data)
	}
	got := map[string]uint64{}
	for _, p := range hist.DataPoints {
		got[attrKey(p.Attributes)] = p.Count
		if p.Count > 0 && (p.Sum < 0 || p.Sum > 60) {
			h.t.Errorf("%s %s: sum %v s", name, attrKey(p.Attributes), p.Sum)
		}
	}
	return got
}

func equalMaps[V comparable](t *testing.T, what string, got, want map[string]V) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s{%s} = %v (present %v), want %v", what, k, g, ok, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s{%s} = %v, not expected", what, k, g)
		}
	}
}

// down is a store that cannot be reached.
type down struct{ idempotency.Store }

var errDown = errors.New("connection refused")

func (down) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, errDown
}

// losing is a store whose completions find the lease taken over.
type losing struct{ idempotency.Store }

func (losing) Complete(context.Context, string, idempotency.Token, []byte, time.Duration) error {
	return idempotency.ErrLeaseLost
}

const (
	route  = "POST /payments"
	tenant = "tenant-42"
)

// TestScriptedSequence runs fresh, replay, 409, 422, takeover, store down
// and the other outcomes through Do and checks every metric point, then
// the spans.
func TestScriptedSequence(t *testing.T) {
	h := newHarness(t, otelidem.Options{ScopeAttributes: []string{"", "http.route"}})
	clk := conformancetest.NewClock(time.Unix(1_700_000_000, 0))
	mem := memStore(&memory.Options{Now: clk.Now})
	r, err := idempotency.New(h.o.Store(mem), idempotency.WithObserver(h.o), idempotency.WithMaxResultSize(64))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	scope := []string{tenant, route}
	req := func(key, body string) idempotency.Request {
		return idempotency.Request{Scope: scope, Key: key, Fingerprint: idempotency.FingerprintBytes([]byte(body))}
	}
	ok := func(ctx context.Context) (string, error) { return "ch_1", nil }

	// 1. Fresh, then its replay.
	if res, err := idempotency.Do(ctx, r, req("k1", "a"), ok); err != nil || res.Replayed {
		t.Fatalf("fresh: %+v %v", res, err)
	}
	if res, err := idempotency.Do(ctx, r, req("k1", "a"), ok); err != nil || !res.Replayed {
		t.Fatalf("replay: %+v %v", res, err)
	}
	// 2. 422: the same key with another request.
	if _, err := idempotency.Do(ctx, r, req("k1", "b"), ok); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	// 3. 409: a duplicate while the first call's fn runs.
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := idempotency.Do(ctx, r, req("k2", "a"), func(ctx context.Context) (string, error) {
			close(started)
			<-release
			return "ch_2", nil
		})
		done <- err
	}()
	<-started
	if got := h.sums(otelidem.MetricActiveLeases, "{lease}", false); got["http.route="+route+",idempotency.scope.class=scoped"] != 1 {
		t.Errorf("leases while fn runs: %v, want 1", got)
	}
	if _, err := idempotency.Do(ctx, r, req("k2", "a"), ok); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("in progress: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// 4. Takeover: a holder claimed k3 and died; its lease ends.
	if _, err := mem.Claim(ctx, idempotency.ClaimRequest{Key: mustKey(t, r, req("k3", "a")), Fingerprint: req("k3", "a").Fingerprint, Token: "dead", Lease: time.Second, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	if res, err := idempotency.Do(ctx, r, req("k3", "a"), ok); err != nil || res.Attempt != 2 {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	// 5. A permanent error, stored and replayed.
	perm := func(ctx context.Context) (string, error) {
		return "", idempotency.Permanent(errors.New("insufficient funds"))
	}
	if _, err := idempotency.Do(ctx, r, req("k4", "a"), perm); err == nil {
		t.Fatal("permanent: no error")
	}
	var se *idempotency.StoredError
	if _, err := idempotency.Do(ctx, r, req("k4", "a"), perm); !errors.As(err, &se) {
		t.Fatalf("stored error: %v", err)
	}
	// 6. A result too large to store, then its retry.
	big := func(ctx context.Context) (string, error) { return strings.Repeat("x", 100), nil }
	if _, err := idempotency.Do(ctx, r, req("k5", "a"), big); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, r, req("k5", "a"), big); !errors.Is(err, idempotency.ErrResultNotStored) {
		t.Fatalf("result not stored: %v", err)
	}
	// 7. An invalid key.
	if _, err := idempotency.Do(ctx, r, req("", "a"), ok); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Fatalf("invalid key: %v", err)
	}
	// 8. Store down, on a runner sharing the observer.
	rDown, err := idempotency.New(h.o.Store(down{mem}), idempotency.WithObserver(h.o), idempotency.WithStoreRetries(2, 0))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if _, err := idempotency.Do(ctx, rDown, req("k6", "a"), func(ctx context.Context) (string, error) { ran = true; return "", nil }); !errors.Is(err, idempotency.ErrStore) || ran {
		t.Fatalf("store down: %v, ran %v", err, ran)
	}
	// 9. Lease lost at completion.
	rLost, err := idempotency.New(h.o.Store(losing{mem}), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, rLost, req("k7", "a"), ok); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("lease lost: %v", err)
	}

	common := "http.route=" + route + ",idempotency.scope.class=scoped"
	// attrKey lists the attributes sorted by key.
	oc := func(o string) string {
		return "http.route=" + route + ",idempotency.outcome=" + o + ",idempotency.scope.class=scoped"
	}
	// The invalid key's call never reached the store, but its scope is the
	// request's.
	equalMaps(t, otelidem.MetricCalls, h.sums(otelidem.MetricCalls, "{call}", true), map[string]int64{
		oc("completed"):         5, // k1, k2, k3 (a takeover), k4 (a permanent error), k5 (a marker)
		oc("replayed"):          2, // k1's value, k4's stored error
		oc("mismatch"):          1,
		oc("in_progress"):       1,
		oc("result_not_stored"): 1,
		oc("invalid_key"):       1,
		oc("store_error"):       1,
		oc("lease_lost"):        1,
	})
	equalMaps(t, otelidem.MetricTakeovers, h.sums(otelidem.MetricTakeovers, "{call}", true), map[string]int64{
		common: 1, // k3
	})
	equalMaps(t, otelidem.MetricFnDuration, h.counts(otelidem.MetricFnDuration), map[string]uint64{
		oc("completed"):  5,
		oc("lease_lost"): 1,
	})
	equalMaps(t, otelidem.MetricActiveLeases, h.sums(otelidem.MetricActiveLeases, "{lease}", false), map[string]int64{
		common: 0,
	})
	st := func(op, errType string) string {
		if errType != "" {
			return "error.type=" + errType + ",idempotency.store.operation=" + op
		}
		return "idempotency.store.operation=" + op
	}
	// Claims: 11 calls reached the memory store, and 2 attempts the store
	// that is down. Completions: k1, k2, k3, k4 (the permanent error), k5
	// (the marker of a result over the runner's limit), and k7's lost.
	equalMaps(t, otelidem.MetricStoreDuration, h.counts(otelidem.MetricStoreDuration), map[string]uint64{
		st("claim", ""):              11,
		st("claim", "_OTHER"):        2,
		st("complete", ""):           5,
		st("complete", "lease_lost"): 1,
	})

	// Spans: one per call of Do, store calls as its children.
	spans := h.spans.Ended()
	var outcomes []string
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	for _, s := range spans {
		switch {
		case s.Name() == "idempotency.do":
			outcomes = append(outcomes, attrOf(s, otelidem.AttrOutcome).AsString())
		case strings.HasPrefix(s.Name(), "idempotency.store."):
			p, ok := byID[s.Parent().SpanID()]
			if !ok || p.Name() != "idempotency.do" {
				t.Errorf("store span %s has no idempotency.do parent", s.Name())
			}
		default:
			t.Errorf("unexpected span %q", s.Name())
		}
	}
	want := []string{"completed", "replayed", "mismatch", "in_progress", "completed", "completed", "completed", "replayed", "completed", "result_not_stored", "invalid_key", "store_error", "lease_lost"}
	slices.Sort(want)
	slices.Sort(outcomes)
	if !slices.Equal(outcomes, want) {
		t.Errorf("span outcomes %v, want %v", outcomes, want)
	}
	// No attribute anywhere holds the tenant or a client key.
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			if v := kv.Value.String(); strings.Contains(v, tenant) || v == "k1" {
				t.Errorf("span %s: attribute %s=%s leaks the scope or key", s.Name(), kv.Key, v)
			}
		}
	}
}

func mustKey(t *testing.T, r *idempotency.Runner, req idempotency.Request) string {
	t.Helper()
	k, err := r.StorageKey(req)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}
