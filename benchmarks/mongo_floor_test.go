package benchmarks_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// BenchmarkMongoFloor compares Do on the MongoDB store with a raw floor on
// the same server and client, with the same write concern (majority): for
// a fresh Do, an insertOne of a 200-byte document and an updateOne of it
// by _id (the least a hand-written claim and completion could send); for
// a replay, one findOne by _id (Do sends two commands there: the claim's
// upsert, refused by the unique index, and the read that decides). Chunks
// of Do and of the floor alternate, from 1 and from 16 goroutines. ns/op
// is Do's; raw-ns/op the floor's; ratio is raw-ns/op ÷ ns/op;
// roundtrips/op counts Do's commands.
//
//	go test -run '^$' -bench MongoFloor -benchtime 2000x ./benchmarks/
//
// It runs when IDEM_MONGO_URI is set, and is skipped when
// scripts/servers/mongo.sh said no server could be had (IDEM_MONGO_ABSENT).
func BenchmarkMongoFloor(b *testing.B) {
	uri := bench.Server(b, bench.Mongo)
	for _, op := range []string{"fresh", "replay"} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("op=%s/callers=%d", op, callers), func(b *testing.B) {
				mongoFloor(b, uri, op, callers)
			})
		}
	}
}

func mongoFloor(b *testing.B, uri, op string, callers int) {
	var trips atomic.Int64
	c, err := bench.MongoClient(uri, &trips)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	defer c.Disconnect(ctx)
	db := c.Database("idembench")
	name := "floor_" + bench.RandomHex(6)
	coll := db.Collection(name + "_store")
	rawColl := db.Collection(name+"_raw", options.Collection().SetWriteConcern(writeconcern.Majority()))
	defer coll.Drop(ctx)
	defer rawColl.Drop(ctx)
	s, err := idemmongo.New(coll, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	r, err := idempotency.New(s, idempotency.WithRetention(10*time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	value := strings.Repeat("v", bench.ResultSize)
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	do := func(key string) error {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: key}, fn)
		if err == nil && res.Replayed != (op == "replay") {
			err = fmt.Errorf("Do of %s: replayed %v in the %s workload", key, res.Replayed, op)
		}
		return err
	}
	rawFresh := func(key string) error {
		if _, err := rawColl.InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "v", Value: value}}); err != nil {
			return err
		}
		_, err := rawColl.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}}, bson.D{{Key: "$set", Value: bson.D{{Key: "r", Value: value}}}})
		return err
	}
	rawReplay := func(key string) error {
		return rawColl.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Err()
	}
	// Replays read one completed key per goroutine; warm-up opens the
	// connections.
	for g := range callers {
		if err := do(fmt.Sprintf("warm-%d", g)); err != nil && op == "fresh" {
			b.Fatal(err)
		}
		if op == "replay" {
			if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: fmt.Sprintf("hot-%d", g)}, fn); err != nil {
				b.Fatal(err)
			}
			if err := rawFresh(fmt.Sprintf("hot-%d", g)); err != nil && !mongo.IsDuplicateKeyError(err) {
				b.Fatal(err)
			}
		}
	}
	bench.Floor(b, callers, &trips,
		func(g, i int) error {
			if op == "replay" {
				return do(fmt.Sprintf("hot-%d", g))
			}
			return do(fmt.Sprintf("k%d", i))
		},
		func(g, i int) error {
			if op == "replay" {
				err := rawReplay(fmt.Sprintf("hot-%d", g))
				if errors.Is(err, mongo.ErrNoDocuments) {
					return fmt.Errorf("raw replay of hot-%d: no document", g)
				}
				return err
			}
			return rawFresh(fmt.Sprintf("k%d", i))
		})
}
