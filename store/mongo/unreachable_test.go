package mongo_test

// An unreachable server, with the real driver and no MongoDB: a closed
// port and a server that accepts connections and never answers. These
// run everywhere.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/internal/nettest"

	"github.com/exactlyonce/idempotency"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// blackHole and closedPort are the shared unreachable servers.
var (
	blackHole  = nettest.BlackHole
	closedPort = nettest.ClosedPort
)

// TestUnreachable runs Do against servers that cannot be reached, with
// the driver's default options: it fails with a store error within the
// bound the runner's store timeout sets (three attempts), fn never runs,
// and Ran says so.
func TestUnreachable(t *testing.T) {
	for name, addr := range map[string]string{"closed port": closedPort(t), "black hole": blackHole(t)} {
		t.Run(name, func(t *testing.T) {
			client, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?directConnection=true"))
			if err != nil {
				t.Fatal(err)
			}
			defer client.Disconnect(context.Background())
			store, err := idemmongo.New(client.Database("idem").Collection("records"), nil)
			if err != nil {
				t.Fatal(err)
			}
			runner, err := idempotency.New(store, idempotency.WithStoreTimeout(300*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			ran := false
			_, err = idempotency.Do(context.Background(), runner, idempotency.Request{Key: "k"}, func(ctx context.Context) (int, error) {
				ran = true
				return 1, nil
			})
			took := time.Since(start)
			var se *idempotency.StoreError
			if !errors.As(err, &se) || !errors.Is(err, idempotency.ErrStore) {
				t.Errorf("Do: %v, want a *StoreError", err)
			}
			if ran || se != nil && se.Ran {
				t.Errorf("fn ran (%v), or the StoreError says Ran, against an unreachable server: %+v", ran, se)
			}
			if took > 3*time.Second {
				t.Errorf("Do took %v, want about three store timeouts (0.9s)", took)
			}
			t.Logf("failed in %v: %v", took, err)

			// Every operation ends with its context.
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start = time.Now()
			_, err = store.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Second})
			if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
				t.Errorf("Claim under a 200ms deadline: %v after %v, want the deadline's error", err, time.Since(start))
			}
		})
	}
}
