package mongo_test

import (
	"context"
	"fmt"
	"os"

	"github.com/exactlyonce/idempotency"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// A payment handler de-duplicated through MongoDB: the second call with the
// same key replays the first call's result instead of charging again.
//
// The example needs a server, so it has no output comment: go test only
// compiles it. TestExample runs it against the real-server suite's server
// and checks that it prints:
//
//	pay_123 replayed: false
//	pay_123 replayed: true
//	charges: 1
func ExampleNew() {
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("IDEM_MONGO_URI")))
	if err != nil {
		panic(err)
	}
	defer client.Disconnect(ctx)

	coll := client.Database("example").Collection("idempotency")
	defer coll.Drop(ctx) // the example leaves nothing behind; a service keeps its collection

	store, err := idemmongo.New(coll, nil) // nil: majority write and read concerns, 1 MiB values
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil { // optional: checks the server, creates the TTL index
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}

	charges := 0
	charge := func(ctx context.Context) (string, error) {
		charges++
		return "pay_123", nil
	}
	req := idempotency.Request{Scope: []string{"tenant-42"}, Key: "order-7", Fingerprint: idempotency.FingerprintParts("POST", "/pay", "1000")}
	for range 2 {
		res, err := idempotency.Do(ctx, runner, req, charge)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Value, "replayed:", res.Replayed)
	}
	fmt.Println("charges:", charges)
}
