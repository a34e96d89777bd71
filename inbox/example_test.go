package inbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A consumer of a broker that delivers at least once: the first event
// arrives three times, the second is a poison message. The consumer's
// effect (crediting an account) happens once per event, and the broker is
// told what to do with each delivery.
func Example() {
	store, err := memory.New(nil) // or a PostgreSQL, Redis, ... store
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	in, err := inbox.New(runner, "ledger-consumer")
	if err != nil {
		panic(err)
	}
	balance := 0
	deliveries := []inbox.Message{
		{Source: "payments", ID: "evt_1", Payload: []byte(`{"credit":100}`)},
		{Source: "payments", ID: "evt_1", Payload: []byte(`{"credit":100}`)}, // redelivered
		{Source: "payments", ID: "evt_2", Payload: []byte(`{"credit":"lots"}`)},
		{Source: "payments", ID: "evt_1", Payload: []byte(`{"credit":100}`)}, // and again
		{Source: "payments", ID: "evt_2", Payload: []byte(`{"credit":"lots"}`)},
	}
	for _, msg := range deliveries {
		d, _ := in.Handle(context.Background(), msg, func(ctx context.Context) error {
			if msg.ID == "evt_2" {
				return idempotency.Permanent(errors.New("malformed credit"))
			}
			balance += 100
			return nil
		})
		fmt.Printf("%s duplicate=%v -> %v\n", msg.ID, d.Duplicate, d.Disposition)
	}
	fmt.Println("balance:", balance)
	// Output:
	// evt_1 duplicate=false -> ack
	// evt_1 duplicate=true -> ack
	// evt_2 duplicate=false -> dead-letter
	// evt_1 duplicate=true -> ack
	// evt_2 duplicate=true -> dead-letter
	// balance: 100
}

// A poll's messages in one batch: two store round trips for the whole
// batch, whatever its size. The redelivered evt_1 inside the batch is
// handled once; a transient failure (evt_3) is Retry, and its next
// delivery runs it; the batch delivered again is all duplicates.
func ExampleInbox_HandleBatch() {
	store, err := memory.New(nil) // or a PostgreSQL, Redis, ... store
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	in, err := inbox.New(runner, "ledger-consumer")
	if err != nil {
		panic(err)
	}
	balance, down := 0, true
	poll := []inbox.Message{
		{Source: "payments", ID: "evt_1", Payload: []byte(`{"credit":100}`)},
		{Source: "payments", ID: "evt_2", Payload: []byte(`{"credit":100}`)},
		{Source: "payments", ID: "evt_1", Payload: []byte(`{"credit":100}`)}, // redelivered in the same poll
		{Source: "payments", ID: "evt_3", Payload: []byte(`{"credit":100}`)},
	}
	handle := func(ctx context.Context, i int) error {
		if poll[i].ID == "evt_3" && down {
			down = false
			return errors.New("ledger database busy") // transient: Retry
		}
		balance += 100
		return nil
	}
	for round := 1; round <= 2; round++ {
		for i, d := range in.HandleBatch(context.Background(), poll, handle) {
			fmt.Printf("round %d: %s duplicate=%v -> %v\n", round, poll[i].ID, d.Duplicate, d.Disposition)
		}
	}
	fmt.Println("balance:", balance)
	// Output:
	// round 1: evt_1 duplicate=false -> ack
	// round 1: evt_2 duplicate=false -> ack
	// round 1: evt_1 duplicate=true -> ack
	// round 1: evt_3 duplicate=false -> retry
	// round 2: evt_1 duplicate=true -> ack
	// round 2: evt_2 duplicate=true -> ack
	// round 2: evt_1 duplicate=true -> ack
	// round 2: evt_3 duplicate=false -> ack
	// balance: 300
}
