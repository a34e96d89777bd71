package otelidem_test

import (
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// The instrumented store is a store like the one it wraps: the memory
// store through Observer.Store passes the conformance suite, batches,
// watches, listings and sweeps included, and every kind of operation the
// suite made is measured.
func TestInstrumentedStoreConforms(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
		s, err := memory.New(&memory.Options{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return h.o.Store(s)
	}, conformancetest.Capabilities{ControlledClock: true})
	// Every operation the suite made was measured (store calls outside a
	// call of Do make no span: a store call is never a trace of its own).
	// (Their latencies are not checked: the suite's bursts run hundreds
	// of calls at once.)
	hist, ok := h.metric(otelidem.MetricStoreDuration).Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is not a histogram", otelidem.MetricStoreDuration)
	}
	calls := map[string]uint64{}
	for _, p := range hist.DataPoints {
		if op, ok := p.Attributes.Value(otelidem.AttrStoreOperation); ok {
			calls[op.AsString()] += p.Count
		}
	}
	for _, op := range []string{"claim", "renew", "checkpoint", "complete", "release", "watch", "inspect", "purge", "stuck", "sweep", "claim_batch", "finish_batch"} {
		if calls[op] == 0 {
			t.Errorf("no %s call measured after the suite (measured: %v)", op, calls)
		}
	}
}
