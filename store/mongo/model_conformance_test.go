package mongo

import (
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
)

// modelMaxValue is a limit below the default, so the suite checks the
// exact boundary with small values.
const modelMaxValue = 64 << 10

// TestModelConformance runs the conformance suite on the store over the
// model of MongoDB (model_test.go), with the suite's clock as $$NOW: a
// check of the filters and pipelines the store builds, and of how it reads
// their replies, under the model's reading of the operators. It is no
// evidence of MongoDB's own behaviour (atomicity, $$NOW, TTL): that is the
// real-server suite's job.
func TestModelConformance(t *testing.T) {
	conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
		return newStore(newModel(clock.Now), mustOptions(t, &Options{MaxValueSize: modelMaxValue}))
	}, conformancetest.Capabilities{ControlledClock: true, Skip: []string{"watcher"}}) // the model has no change streams
}

// mustOptions checks opts as New does.
func mustOptions(t testing.TB, opts *Options) Options {
	t.Helper()
	o, err := checkOptions(opts)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
