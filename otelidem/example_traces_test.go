package otelidem_test

import (
	"context"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/memory"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The spans of a call and of its retry: one idempotency.do span per call,
// with the store calls (and fn's own spans) as its children.
func ExampleNew() {
	spans := tracetest.NewSpanRecorder() // in a service: an exporter's span processor
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := otelidem.New(&otelidem.Options{TracerProvider: tp}) // metrics: the global meter provider
	if err != nil {
		panic(err)
	}
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(tel.Store(store), idempotency.WithObserver(tel))
	if err != nil {
		panic(err)
	}

	ctx, request := tp.Tracer("server").Start(context.Background(), "POST /payments")
	req := idempotency.Request{Scope: []string{"acct_1"}, Key: "key-1"}
	for range 2 {
		idempotency.Do(ctx, runner, req, func(ctx context.Context) (string, error) {
			return "pay_1", nil
		})
	}
	request.End()

	for _, s := range spans.Ended() {
		fmt.Print(s.Name())
		for _, kv := range s.Attributes() {
			if kv.Key == otelidem.AttrOutcome {
				fmt.Print(" outcome=", kv.Value.AsString())
			}
		}
		fmt.Println()
	}
	// Output:
	// idempotency.store.claim
	// idempotency.store.complete
	// idempotency.do outcome=completed
	// idempotency.store.claim
	// idempotency.do outcome=replayed
	// POST /payments outcome=replayed
}
