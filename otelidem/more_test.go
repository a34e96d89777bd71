package otelidem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/memory"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestHTTPRequestSpan: behind httpidem, the request's server span (made
// here as otelhttp would make it) gets the outcome, and the call's span
// and its store calls are its children.
func TestHTTPRequestSpan(t *testing.T) {
	h := newHarness(t, otelidem.Options{ScopeAttributes: []string{"", "http.route"}})
	r, err := idempotency.New(h.o.Store(memStore(nil)), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(r, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		return []string{r.Header.Get("X-Account"), r.Pattern}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	tracer := h.tp.Tracer("server")
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), "POST /payments", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		mux.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer srv.Close()

	send := func(body string) int {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set("Idempotency-Key", "key-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, want := range []int{201, 201, 422} {
		body := "a"
		if i == 2 {
			body = "b"
		}
		if got := send(body); got != want {
			t.Fatalf("request %d: status %d, want %d", i, got, want)
		}
	}

	var server []sdktrace.ReadOnlySpan
	ids := map[trace.SpanID]bool{}
	for _, s := range h.spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			server = append(server, s)
			ids[s.SpanContext().SpanID()] = true
		}
	}
	if len(server) != 3 {
		t.Fatalf("%d server spans, want 3", len(server))
	}
	want := []struct {
		outcome  string
		replayed bool
	}{{"completed", false}, {"replayed", true}, {"mismatch", false}}
	for i, s := range server {
		if got := attrOf(s, otelidem.AttrOutcome).AsString(); got != want[i].outcome {
			t.Errorf("request %d: outcome %q, want %q", i, got, want[i].outcome)
		}
		if got := attrOf(s, otelidem.AttrReplayed); got.Type() != attribute.BOOL || got.AsBool() != want[i].replayed {
			t.Errorf("request %d: replayed %v, want %v", i, got.String(), want[i].replayed)
		}
	}
	for _, s := range h.spans.Ended() {
		if s.Name() == "idempotency.do" && !ids[s.Parent().SpanID()] {
			t.Errorf("idempotency.do span is not a child of the request's span")
		}
		if s.Name() == "idempotency.do" && attrOf(s, attribute.Key("http.route")).AsString() != "POST /payments" {
			t.Errorf("idempotency.do span has no http.route: %v", s.Attributes())
		}
	}
}

// TestCallSpanAttributes: the span of a takeover carries its fence and
// attempt, its store calls are children, and fn's own spans too.
func TestCallSpanAttributes(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	clk := conformancetest.NewClock(time.Unix(1_700_000_000, 0))
	mem := memStore(&memory.Options{Now: clk.Now})
	r, err := idempotency.New(h.o.Store(mem), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	req := idempotency.Request{Key: "k"}
	cr, err := mem.Claim(context.Background(), idempotency.ClaimRequest{Key: mustKey(t, r, req), Token: "dead", Lease: time.Second, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	res, err := idempotency.Do(context.Background(), r, req, func(ctx context.Context) (int, error) {
		_, span := h.tp.Tracer("app").Start(ctx, "charge")
		span.End()
		return 1, nil
	})
	if err != nil || res.Fence <= cr.Fence || res.Attempt != 2 {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	var do sdktrace.ReadOnlySpan
	for _, s := range h.spans.Ended() {
		if s.Name() == "idempotency.do" {
			do = s
		}
	}
	if do == nil {
		t.Fatal("no idempotency.do span")
	}
	for k, want := range map[attribute.Key]string{
		otelidem.AttrOutcome:    "completed",
		otelidem.AttrFence:      attribute.Int64Value(res.Fence).String(),
		otelidem.AttrAttempt:    "2",
		otelidem.AttrReplayed:   "false",
		otelidem.AttrScopeClass: "shared",
	} {
		if got := attrOf(do, k).String(); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	children := map[string]bool{}
	for _, s := range h.spans.Ended() {
		if s.Parent().SpanID() == do.SpanContext().SpanID() {
			children[s.Name()] = true
		}
	}
	for _, name := range []string{"idempotency.store.claim", "idempotency.store.complete", "charge"} {
		if !children[name] {
			t.Errorf("no child span %q of idempotency.do (children: %v)", name, children)
		}
	}
	equalMaps(t, otelidem.MetricTakeovers, h.sums(otelidem.MetricTakeovers, "{call}", true), map[string]int64{
		"idempotency.scope.class=shared": 1,
	})
}

// TestOutsideDo: events reported outside a call of Do (the reconciler's)
// are counted one by one by their outcome, but for the claims acquired
// (a step of a call) and purges (an operator's act); a takeover counts in
// idempotency.takeovers.
func TestOutsideDo(t *testing.T) {
	h := newHarness(t, otelidem.Options{Operation: func(ctx context.Context, scope []string) string { return "charge" }})
	ctx := context.Background()
	for _, e := range []idempotency.Event{
		{Outcome: idempotency.OutcomeAcquired, Attempt: 1},
		{Outcome: idempotency.OutcomeAcquired, Attempt: 3},
		{Outcome: idempotency.OutcomeCompleted},
		{Outcome: idempotency.OutcomeReplay, Err: &idempotency.StoredError{Message: "no"}},
		{Outcome: idempotency.OutcomeReplay},
		{Outcome: idempotency.OutcomeReleased},
		{Outcome: idempotency.OutcomeStoreError, Err: errDown},
		{Outcome: idempotency.OutcomePurged},
	} {
		h.o.Observe(ctx, e)
	}
	oc := func(o string) string {
		return "idempotency.operation=charge,idempotency.outcome=" + o + ",idempotency.scope.class=shared"
	}
	equalMaps(t, otelidem.MetricCalls, h.sums(otelidem.MetricCalls, "{call}", true), map[string]int64{
		oc("completed"): 1, oc("replayed"): 2, oc("released"): 1, oc("store_error"): 1,
	})
	equalMaps(t, otelidem.MetricTakeovers, h.sums(otelidem.MetricTakeovers, "{call}", true), map[string]int64{
		"idempotency.operation=charge,idempotency.scope.class=shared": 1,
	})
}

// TestConcurrent: many goroutines on a few keys; every call is counted
// once, and no lease is left counted.
func TestConcurrent(t *testing.T) {
	h := newHarness(t, otelidem.Options{ScopeClass: func([]string) string { return "test" }})
	r, err := idempotency.New(h.o.Store(memStore(nil)), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	const workers, calls, keys = 16, 50, 5
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				req := idempotency.Request{Key: string(rune('a' + (w+i)%keys))}
				_, err := idempotency.Do(context.Background(), r, req, func(ctx context.Context) (int, error) {
					time.Sleep(50 * time.Microsecond)
					return i, nil
				})
				if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	total := int64(0)
	got := h.sums(otelidem.MetricCalls, "{call}", true)
	for k, n := range got {
		total += n
		if !strings.Contains(k, "idempotency.scope.class=test") {
			t.Errorf("attributes %s", k)
		}
	}
	if total != workers*calls {
		t.Errorf("%d calls counted, want %d: %v", total, workers*calls, got)
	}
	if acq := got["idempotency.outcome=completed,idempotency.scope.class=test"]; acq != keys {
		t.Errorf("%d completed, want %d (one per key)", acq, keys)
	}
	equalMaps(t, otelidem.MetricActiveLeases, h.sums(otelidem.MetricActiveLeases, "{lease}", false), map[string]int64{
		"idempotency.scope.class=test": 0,
	})
}

// TestOptions: New refuses options that cannot work, naming them.
func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		opts otelidem.Options
		want string
	}{
		{otelidem.Options{ScopeAttributes: []string{"a", "b", "c", "d", "e"}}, "ScopeAttributes"},
		{otelidem.Options{ScopeAttributes: []string{"idempotency.outcome"}}, "ScopeAttributes"},
		{otelidem.Options{MaxAttributeSets: -1}, "MaxAttributeSets"},
	} {
		_, err := otelidem.New(&tc.opts)
		if !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalidArgument naming %s", tc.opts, err, tc.want)
		}
	}
	if _, err := otelidem.New(nil); err != nil {
		t.Errorf("New(nil): %v", err)
	}
}

// TestMaxAttributeSets: past the bound, calls are counted under
// otel.metric.overflow=true, as the SDK's cardinality limit does.
func TestMaxAttributeSets(t *testing.T) {
	h := newHarness(t, otelidem.Options{ScopeAttributes: []string{"tenant"}, MaxAttributeSets: 1})
	r, err := idempotency.New(memStore(nil), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"t1", "t2", "t3", "t2"} {
		if _, err := idempotency.Do(context.Background(), r, idempotency.Request{Scope: []string{tenant}, Key: "k"}, func(ctx context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
	}
	oc := func(tenant, o string) string {
		return "idempotency.outcome=" + o + ",idempotency.scope.class=scoped,tenant=" + tenant
	}
	equalMaps(t, otelidem.MetricCalls, h.sums(otelidem.MetricCalls, "{call}", true), map[string]int64{
		oc("t1", "completed"): 1,
		"idempotency.outcome=completed,otel.metric.overflow=true": 2,
		"idempotency.outcome=replayed,otel.metric.overflow=true":  1,
	})
	equalMaps(t, otelidem.MetricActiveLeases, h.sums(otelidem.MetricActiveLeases, "{lease}", false), map[string]int64{
		"idempotency.scope.class=scoped,tenant=t1": 0,
		"otel.metric.overflow=true":                0,
	})
}

// TestUnsampledParent: under a parent span that was not sampled, no span
// is made, and the metrics are still recorded.
func TestUnsampledParent(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	r, err := idempotency.New(h.o.Store(memStore(nil)), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), unsampled)
	if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: "k"}, func(ctx context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if n := len(h.spans.Ended()); n != 0 {
		t.Errorf("%d spans under an unsampled parent", n)
	}
	equalMaps(t, otelidem.MetricCalls, h.sums(otelidem.MetricCalls, "{call}", true), map[string]int64{
		"idempotency.outcome=completed,idempotency.scope.class=shared": 1,
	})
}
