package idempotency_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A support case: a customer's retry keeps getting 409. Inspect shows the
// holder's lease is still live and which attempt it is.
func ExampleRunner_Inspect() {
	store, _ := memory.New(nil)
	r, _ := idempotency.New(store)
	ctx := context.Background()
	req := idempotency.Request{Scope: []string{"acct_42", "POST /payments"}, Key: "order-7"}
	started, gateway, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		idempotency.Do(ctx, r, req, func(ctx context.Context) (string, error) {
			close(started)
			<-gateway // a handler waiting on a slow payment gateway
			return "ch_1", nil
		})
	}()
	<-started
	info, err := r.Inspect(ctx, req, false)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.State, "attempt", info.Attempt, "lease live:", info.LeaseLeft > 0)
	close(gateway)
	<-done
	info, _ = r.Inspect(ctx, req, false)
	fmt.Println(info.State, info.ResultSize, "bytes")
	// Output:
	// started attempt 1 lease live: true
	// completed 7 bytes
}

// A holder crashed after its "charge" step and the client never retried.
// The reconciler takes the record over (as a retry would) and the
// resolver, seeing that the charge happened, records its result.
func ExampleReconcile() {
	clock := conformancetest.NewClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memory.New(&memory.Options{Now: clock.Now})
	r, _ := idempotency.New(store)
	ctx := context.Background()

	// The crashed holder, as the store saw it: claimed, one step done.
	key, _ := r.StorageKey(idempotency.Request{Scope: []string{"acct_42"}, Key: "order-7"})
	store.Claim(ctx, idempotency.ClaimRequest{Key: key, Token: "dead", Lease: idempotency.DefaultLease, Grace: time.Hour})
	store.Checkpoint(ctx, key, "dead", "charge", []byte(`"ch_123"`))
	clock.Advance(idempotency.DefaultLease + time.Second) // its lease runs out

	report, err := idempotency.Reconcile(ctx, r, 100, func(ctx context.Context, s idempotency.StuckRecord) (idempotency.Resolution[string], error) {
		if charge, ok := s.Checkpoints["charge"]; ok {
			// In a real service: ask the gateway with the downstream key
			// (idempotency.DownstreamKey(ctx, "charge")) what happened.
			return idempotency.CompleteWith("paid by " + string(charge)), nil
		}
		return idempotency.ReleaseForRetry[string](), nil
	})
	fmt.Printf("%+v %v\n", report, err)

	res, _ := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"acct_42"}, Key: "order-7"},
		func(ctx context.Context) (string, error) { return "charged again!", nil })
	fmt.Println(res.Value, res.Replayed)
	// Output:
	// {Listed:1 Completed:1 Failed:0 Released:0 Left:0 Skipped:0 Errors:0} <nil>
	// paid by "ch_123" true
}
