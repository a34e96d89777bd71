package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A batch of requests, each with its own key, in two store round trips:
// one for every claim, one for every completion. An invalid key fails its
// item only; two items with one key run once; a retried batch replays
// the items that completed.
func ExampleDoBatch() {
	store, err := memory.New(nil) // or a PostgreSQL, Redis, ... store
	if err != nil {
		panic(err)
	}
	r, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	reqs := []idempotency.Request{
		{Scope: []string{"acct_42"}, Key: "pay-1", Fingerprint: "100 EUR"},
		{Scope: []string{"acct_42"}, Key: "pay-2", Fingerprint: "250 EUR"},
		{Scope: []string{"acct_42"}, Key: "pay-1", Fingerprint: "100 EUR"}, // the same payment twice in one batch
		{Scope: []string{"acct_42"}, Key: "", Fingerprint: "5 EUR"},        // no key
	}
	charges := 0
	charge := func(ctx context.Context, i int) (string, error) {
		charges++
		return fmt.Sprintf("ch_%d (%s)", charges, reqs[i].Fingerprint), nil
	}
	for round := 1; round <= 2; round++ {
		for i, res := range idempotency.DoBatch(context.Background(), r, reqs, charge) {
			switch {
			case errors.Is(res.Err, idempotency.ErrInvalidKey):
				fmt.Printf("round %d, item %d: invalid key\n", round, i)
			case res.Err != nil:
				fmt.Printf("round %d, item %d: %v\n", round, i, res.Err)
			default:
				fmt.Printf("round %d, item %d: %s, %s\n", round, i, res.Outcome, res.Value)
			}
		}
	}
	fmt.Println("charges:", charges)
	// Output:
	// round 1, item 0: completed, ch_1 (100 EUR)
	// round 1, item 1: completed, ch_2 (250 EUR)
	// round 1, item 2: replayed, ch_1 (100 EUR)
	// round 1, item 3: invalid key
	// round 2, item 0: replayed, ch_1 (100 EUR)
	// round 2, item 1: replayed, ch_2 (250 EUR)
	// round 2, item 2: replayed, ch_1 (100 EUR)
	// round 2, item 3: invalid key
	// charges: 2
}
