package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoClient returns a client of uri that counts its round trips (every
// command it sends: the driver's monitoring heartbeats are not commands)
// in trips.
func MongoClient(uri string, trips *atomic.Int64) (*mongo.Client, error) {
	mon := &event.CommandMonitor{Started: func(context.Context, *event.CommandStartedEvent) { trips.Add(1) }}
	return mongo.Connect(options.Client().ApplyURI(uri).SetMonitor(mon).SetMaxPoolSize(MaxConns))
}

// openMongo opens a collection of its own on the server at uri, with the
// store's defaults (majority write and read concerns), set up before the
// workloads run; Close drops it.
func (b *Backend) openMongo(ctx context.Context, uri string) error {
	c, err := MongoClient(uri, &b.trips)
	if err != nil {
		return fmt.Errorf("bench: mongo: %s: %w", Var(Mongo), err)
	}
	b.closers = append(b.closers, func() error { return c.Disconnect(context.Background()) })
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Ping(pctx, nil); err != nil {
		return fmt.Errorf("bench: mongo at %s unreachable: %w: %s", Var(Mongo), err, howTo(Mongo))
	}
	coll := c.Database("idembench").Collection("records_" + RandomHex(6))
	b.closers = append(b.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return coll.Drop(ctx)
	})
	s, err := idemmongo.New(coll, nil)
	if err != nil {
		return err
	}
	if err := s.Migrate(pctx); err != nil {
		return fmt.Errorf("bench: mongo: %w", err)
	}
	b.records = func(ctx context.Context) (map[string]int64, error) {
		// Released records (no state) are kept only for their fence.
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "s", Value: bson.D{{Key: "$exists", Value: true}}}})
		return map[string]int64{uri: n}, err
	}
	b.store, b.counted = s, true
	return nil
}
