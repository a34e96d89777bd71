package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A payment handler charges once, however often the client retries.
// README.md shows this as a complete program.
func Example() {
	store, err := memory.New(nil) // or postgres.New, redis.New
	if err != nil {
		panic(err)
	}
	r, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	body := []byte(`{"amount": 1000, "currency": "EUR"}`)
	fp, err := idempotency.FingerprintJSON(body) // RFC 8785: key order, 1.0 vs 1 don't matter
	if err != nil {
		panic(err) // broken JSON: answer 400
	}
	req := idempotency.Request{
		Scope:       []string{"acct_42", "POST /payments"}, // tenant, route: never shared
		Key:         "9f2c4e1a-order-7",                    // the client's Idempotency-Key
		Fingerprint: fp,
	}
	charge := func(ctx context.Context) (string, error) {
		fmt.Println("charging the card")
		return "ch_1", nil
	}
	for range 3 { // a double click and a retry
		res, err := idempotency.Do(ctx, r, req, charge)
		fmt.Println(res.Value, res.Replayed, err)
	}
	// Output:
	// charging the card
	// ch_1 false <nil>
	// ch_1 true <nil>
	// ch_1 true <nil>
}

// A permanent error is stored and replayed, so a retry cannot succeed
// after the balance changed underneath it; other errors release the key.
func ExamplePermanent() {
	store, _ := memory.New(nil)
	r, _ := idempotency.New(store)
	ctx := context.Background()
	req := idempotency.Request{Key: "order-8"}
	balance := 50
	pay := func(ctx context.Context) (int, error) {
		if balance < 100 {
			return 0, idempotency.Permanent(errors.New("payment exceeds balance"))
		}
		balance -= 100
		return balance, nil
	}
	_, err := idempotency.Do(ctx, r, req, pay)
	fmt.Println(err)
	balance = 500 // a top-up arrives; the retry still replays the refusal
	res, err := idempotency.Do(ctx, r, req, pay)
	fmt.Println(res.Replayed, err, errors.Is(err, idempotency.ErrPermanent))
	// Output:
	// payment exceeds balance
	// true payment exceeds balance true
}

// Recovery points let a holder that takes over a crashed one skip the
// steps that already ran; the downstream key is the same in every attempt.
func ExampleStep() {
	store, _ := memory.New(nil)
	r, _ := idempotency.New(store)
	ctx := context.Background()
	res, err := idempotency.Do(ctx, r, idempotency.Request{Key: "order-9"}, func(ctx context.Context) (string, error) {
		id, err := idempotency.Step(ctx, "create-payment-row", func(ctx context.Context) (int, error) {
			return 1001, nil // INSERT INTO payments ... RETURNING id
		})
		if err != nil {
			return "", err
		}
		gatewayKey, err := idempotency.DownstreamKey(ctx, "charge")
		if err != nil {
			return "", err
		}
		return idempotency.Step(ctx, "call-gateway", func(ctx context.Context) (string, error) {
			// gateway.Charge(ctx, id, Idempotency-Key: gatewayKey)
			return fmt.Sprintf("payment %d charged with key %.15s...", id, gatewayKey), nil
		})
	})
	fmt.Println(res.Value, err)
	// Output:
	// payment 1001 charged with key charge:7342f54c... <nil>
}

// Semantically equal JSON bodies have the same fingerprint.
func ExampleFingerprintJSON() {
	a, _ := idempotency.FingerprintJSON([]byte(`{"amount":100,"currency":"EUR"}`))
	b, _ := idempotency.FingerprintJSON([]byte(`{"currency":"EUR", "amount":1.0e2}`))
	c, _ := idempotency.FingerprintJSON([]byte(`{"currency":"EUR","amount":101}`))
	fmt.Println(a == b, a == c)
	// Output:
	// true false
}

// A concurrent duplicate gets ErrInProgress with a retry-after hint.
func ExampleInProgressError() {
	store, _ := memory.New(nil)
	r, _ := idempotency.New(store)
	ctx := context.Background()
	req := idempotency.Request{Key: "order-10"}
	_, _ = idempotency.Do(ctx, r, req, func(ctx context.Context) (int, error) {
		// While the first call runs, a duplicate arrives.
		_, err := idempotency.Do(ctx, r, req, func(ctx context.Context) (int, error) { return 2, nil })
		var ip *idempotency.InProgressError
		fmt.Println(errors.Is(err, idempotency.ErrInProgress), errors.As(err, &ip) && ip.RetryAfter > 0)
		return 1, nil
	})
	// Output:
	// true true
}
