package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
)

// TestRoundTrips counts the commands and pipelines a Do sends, with a
// go-redis hook: a fresh request costs two round trips (claim, complete),
// a replay one (claim), with or without waiting for replicas (the WAIT is
// pipelined with the script). On a server without replicas, waiting for
// one fails the claim in one round trip.
func TestRoundTrips(t *testing.T) {
	replicas := len(onlineReplicas(t, newSingle(t)))
	for _, opts := range []idemredis.Options{{}, {Replicas: 1}} {
		c := newSingle(t)
		var h countHook
		ctx := context.Background()
		fn := func(context.Context) (string, error) { return "ok", nil }
		req := idempotency.Request{Scope: []string{"tenant"}, Key: "order-1", Fingerprint: fingerprint}
		if opts.Replicas > replicas {
			opts.ReplicaTimeout = 10 * time.Millisecond
			s := newStore(t, c, &opts)
			addHook(t, s, &h)
			r, err := idempotency.New(s, idempotency.WithStoreRetries(1, 0))
			if err != nil {
				t.Fatal(err)
			}
			// Load the scripts first (see below); the claim is written but
			// not replicated.
			_, _ = idempotency.Do(ctx, r, idempotency.Request{Key: "warm-up"}, fn)
			h.n.Store(0)
			if _, err := idempotency.Do(ctx, r, req, fn); !errors.Is(err, idemredis.ErrNotReplicated) {
				t.Fatalf("Do waiting for a replica of a server with none: %v, want ErrNotReplicated", err)
			}
			if n := h.n.Swap(0); n != 1 {
				t.Errorf("Replicas=1 without a replica: Do took %d round trips, want 1", n)
			}
			continue
		}
		s := newStore(t, c, &opts)
		addHook(t, s, &h)
		r, err := idempotency.New(s)
		if err != nil {
			t.Fatal(err)
		}
		// Load the scripts first: after a SCRIPT FLUSH the first EVALSHA of
		// each script costs one more round trip (NOSCRIPT, then EVAL).
		if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: "warm-up"}, fn); err != nil {
			t.Fatal(err)
		}
		h.n.Store(0)
		res, err := idempotency.Do(ctx, r, req, fn)
		if err != nil || res.Replayed {
			t.Fatalf("fresh Do: %+v, %v", res, err)
		}
		if n := h.n.Swap(0); n != 2 {
			t.Errorf("Replicas=%d: fresh Do took %d round trips, want 2", opts.Replicas, n)
		}
		res, err = idempotency.Do(ctx, r, req, fn)
		if err != nil || !res.Replayed || res.Value != "ok" {
			t.Fatalf("replayed Do: %+v, %v", res, err)
		}
		if n := h.n.Swap(0); n != 1 {
			t.Errorf("Replicas=%d: replayed Do took %d round trips, want 1", opts.Replicas, n)
		}
	}
}
