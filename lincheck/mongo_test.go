package lincheck

import (
	"context"
	"os"
	"testing"
	"time"

	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestMongo checks the MongoDB store on the server at IDEM_MONGO_URI
// (mongo:7 in Docker in scripts/test.sh, when a Docker daemon answers).
// When none could be had, scripts/servers/mongo.sh sets IDEM_MONGO_ABSENT
// to the reason: the test is skipped with it, and scripts/test.sh ends
// with a loud line saying so. Without either variable the test fails.
func TestMongo(t *testing.T) {
	uri := os.Getenv("IDEM_MONGO_URI")
	if uri == "" {
		if reason := os.Getenv("IDEM_MONGO_ABSENT"); reason != "" {
			t.Skipf("MongoDB real-server test not run: %s", reason)
		}
		t.Fatal("IDEM_MONGO_URI is not set: run scripts/test.sh (which starts mongo:7 when a Docker daemon answers) or set IDEM_MONGO_URI")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(uint64(serverWorkload.Clients)))
	if err != nil {
		t.Fatalf("IDEM_MONGO_URI: %v", err)
	}
	defer client.Disconnect(context.Background())
	if err := client.Ping(ctx, nil); err != nil {
		t.Fatalf("MongoDB at IDEM_MONGO_URI unreachable: %v (run scripts/test.sh or set IDEM_MONGO_URI)", err)
	}
	// A throwaway collection per run.
	coll := client.Database("idemtest").Collection("lincheck_" + randomHex(6))
	defer func() {
		if err := coll.Drop(context.Background()); err != nil {
			t.Errorf("dropping %s: %v", coll.Name(), err)
		}
	}()
	store, err := idemmongo.New(coll, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	checkStore(t, store, serverWorkload)
}
