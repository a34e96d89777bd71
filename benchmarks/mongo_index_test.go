package benchmarks_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkMongoStartedIndex measures what the partial index of STARTED
// records (which Stuck reads) costs a fresh Do: Do on a store whose
// collection has it, against Do on one whose collection has only the TTL
// index (Options.SkipIndex, the TTL index created by hand), chunks of
// the two alternating on one client. ns/op is with the index,
// noindex-ns/op without, ratio noindex ÷ index (1: the index costs
// nothing measurable).
//
//	go test -run '^$' -bench MongoStartedIndex -count 5 -benchtime 2000x ./benchmarks/
//
// It runs when IDEM_MONGO_URI is set, and is skipped when
// scripts/servers/mongo.sh said no server could be had (IDEM_MONGO_ABSENT).
func BenchmarkMongoStartedIndex(b *testing.B) {
	uri := bench.Server(b, bench.Mongo)
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("op=fresh/callers=%d", callers), func(b *testing.B) {
			var trips atomic.Int64
			c, err := bench.MongoClient(uri, &trips)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			defer c.Disconnect(ctx)
			name := "index_" + bench.RandomHex(6)
			runner := func(coll *mongo.Collection, opts *idemmongo.Options) *idempotency.Runner {
				s, err := idemmongo.New(coll, opts)
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
				return r
			}
			with := c.Database("idembench").Collection(name + "_with")
			without := c.Database("idembench").Collection(name + "_without")
			defer with.Drop(ctx)
			defer without.Drop(ctx)
			if _, err := without.Indexes().CreateOne(ctx, mongo.IndexModel{
				Keys: bson.D{{Key: "x", Value: 1}}, Options: options.Index().SetName("idem_expiry").SetExpireAfterSeconds(0),
			}); err != nil {
				b.Fatal(err)
			}
			rWith, rWithout := runner(with, nil), runner(without, &idemmongo.Options{SkipIndex: true})
			fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
			do := func(r *idempotency.Runner) func(g, i int) error {
				return func(_, i int) error {
					_, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: fmt.Sprintf("k%d", i)}, fn)
					return err
				}
			}
			bench.Compare(b, callers, &trips, "noindex", do(rWith), do(rWithout))
		})
	}
}
