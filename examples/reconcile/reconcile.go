// Package reconcile is a runnable reconciler on each of the five stores
// (memory, PostgreSQL, Redis, etcd, MongoDB): a payment whose holder
// crashed after charging the card, whose client never retried, is found
// by idempotency.Reconcile and resolved by asking a (fake) payment
// gateway what happened, by the same downstream key the crashed holder
// charged with. See the package's examples and README.md.
package reconcile

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
)

// Receipt is the result of a payment, as the service stores it.
type Receipt struct {
	ChargeID string `json:"charge_id"`
}

// Gateway is a fake payment gateway that de-duplicates by idempotency
// key, as real ones do (Stripe's Idempotency-Key): a charge with a key it
// has seen returns the first charge.
type Gateway struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge ID
}

// NewGateway returns a gateway with no charges.
func NewGateway() *Gateway { return &Gateway{charges: map[string]string{}} }

// Charge charges once per key and returns the charge's ID.
func (g *Gateway) Charge(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if id, ok := g.charges[key]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(g.charges)+1)
	g.charges[key] = id
	return id
}

// Lookup returns the charge made with key, if any: what the reconciler
// asks.
func (g *Gateway) Lookup(key string) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id, ok := g.charges[key]
	return id, ok
}

// Charges counts the charges made.
func (g *Gateway) Charges() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.charges)
}

// Pay is the service's payment handler: it charges the gateway with the
// downstream key of the request, the same in every attempt and takeover.
func Pay(g *Gateway) func(ctx context.Context) (Receipt, error) {
	return func(ctx context.Context) (Receipt, error) {
		key, err := idempotency.DownstreamKey(ctx, "charge")
		if err != nil {
			return Receipt{}, err
		}
		return Receipt{ChargeID: g.Charge(key)}, nil
	}
}

// Resolver is the reconciler's resolver: it asks the gateway by the
// downstream key (derived, under the reconciler's takeover, exactly as
// the crashed holder derived it) whether the card was charged. Charged:
// record the receipt, so that a late retry gets it without a second
// charge. Not charged: release the key, so that a retry runs the payment.
func Resolver(g *Gateway) func(ctx context.Context, s idempotency.StuckRecord) (idempotency.Resolution[Receipt], error) {
	return func(ctx context.Context, s idempotency.StuckRecord) (idempotency.Resolution[Receipt], error) {
		key, err := idempotency.DownstreamKey(ctx, "charge")
		if err != nil {
			return idempotency.Resolution[Receipt]{}, err
		}
		if id, ok := g.Lookup(key); ok {
			return idempotency.CompleteWith(Receipt{ChargeID: id}), nil
		}
		return idempotency.ReleaseForRetry[Receipt](), nil
	}
}

// Crash leaves req's record as a holder that crashed leaves it: claimed,
// then (when charge is set) the gateway charged with the downstream key,
// then nothing: no completion, no renewal. It claims through the store
// with a lease of lease, as Do would, and returns the storage key.
func Crash(ctx context.Context, r *idempotency.Runner, s idempotency.Store, g *Gateway, req idempotency.Request, lease time.Duration, charge bool) (string, error) {
	key, err := r.StorageKey(req)
	if err != nil {
		return "", err
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: req.Fingerprint, Token: "crashed-holder", Lease: lease, Grace: time.Hour})
	if err != nil {
		return "", err
	}
	if res.Outcome != idempotency.OutcomeAcquired {
		return "", fmt.Errorf("crash: the claim of %q was %s", req.Key, res.Outcome)
	}
	if charge {
		g.Charge(idempotency.DownstreamKeyOf(key, "charge"))
	}
	return key, nil
}

// The payments of the examples: order-7's holder crashed after
// charging the card, order-8's before.
var (
	Charged    = idempotency.Request{Scope: []string{"acct_42", "POST /payments"}, Key: "order-7", Fingerprint: "amount=1000"}
	NotCharged = idempotency.Request{Scope: []string{"acct_42", "POST /payments"}, Key: "order-8", Fingerprint: "amount=500"}
)

// CrashPayments crashes the holders of [Charged] (after its charge) and
// [NotCharged] (before it), with leases of lease.
func CrashPayments(ctx context.Context, r *idempotency.Runner, s idempotency.Store, g *Gateway, lease time.Duration) error {
	if _, err := Crash(ctx, r, s, g, Charged, lease, true); err != nil {
		return err
	}
	_, err := Crash(ctx, r, s, g, NotCharged, lease, false)
	return err
}

// RetryPayments sends the clients' late retries of both payments and
// prints what they got, and how many charges the gateway made.
func RetryPayments(ctx context.Context, r *idempotency.Runner, g *Gateway) error {
	for _, req := range []idempotency.Request{Charged, NotCharged} {
		res, err := idempotency.Do(ctx, r, req, Pay(g))
		if err != nil {
			return err
		}
		fmt.Printf("retry of %s: %s, replayed %v\n", req.Key, res.Value.ChargeID, res.Replayed)
	}
	fmt.Println("charges at the gateway:", g.Charges())
	return nil
}
