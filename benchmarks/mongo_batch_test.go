package benchmarks_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkMongoBatch compares DoBatch on the MongoDB store (fresh keys,
// 200-byte results, majority write concern) with a raw floor of the same
// batched commands on the same server and client: one unordered
// insertMany of the batch's 200-byte documents and one unordered bulk
// write of an updateOne by _id for each (the least a hand-written batch
// claim and completion could send). One op is one batch of size items;
// chunks of DoBatch and of the floor alternate. ns/op is DoBatch's per
// batch (divide by size for an item); raw-ns/op the floor's; ratio is
// raw-ns/op ÷ ns/op, the same per item; roundtrips/op counts DoBatch's
// commands per batch (3: the claims' update, their find, the
// completions' update). size=1 is next to BenchmarkMongoFloor's fresh Do.
//
//	go test -run '^$' -bench MongoBatch -benchtime 20x ./benchmarks/
//
// It runs when IDEM_MONGO_URI is set, and is skipped when
// scripts/servers/mongo.sh said no server could be had (IDEM_MONGO_ABSENT).
func BenchmarkMongoBatch(b *testing.B) {
	uri := bench.Server(b, bench.Mongo)
	for _, size := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) { mongoBatch(b, uri, size) })
	}
}

func mongoBatch(b *testing.B, uri string, size int) {
	r, rawColl, trips := mongoPair(b, uri, "batch")
	ctx := context.Background()
	value := strings.Repeat("v", bench.ResultSize)
	fn := func(context.Context, int) (bench.Payment, error) { return bench.Result, nil }
	do := func(_, i int) error {
		reqs := make([]idempotency.Request, size)
		for k := range reqs {
			reqs[k] = idempotency.Request{Scope: []string{"bench"}, Key: fmt.Sprintf("b%d-%d", i, k)}
		}
		for k, res := range idempotency.DoBatch(ctx, r, reqs, fn) {
			if res.Err != nil || !res.Ran {
				return fmt.Errorf("DoBatch item %d of batch %d: ran %v, %v", k, i, res.Ran, res.Err)
			}
		}
		return nil
	}
	raw := func(_, i int) error {
		docs := make([]any, size)
		ups := make([]mongo.WriteModel, size)
		for k := range docs {
			id := fmt.Sprintf("b%d-%d", i, k)
			docs[k] = bson.D{{Key: "_id", Value: id}, {Key: "v", Value: value}}
			ups[k] = mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: id}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "r", Value: value}}}})
		}
		if _, err := rawColl.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
			return err
		}
		_, err := rawColl.BulkWrite(ctx, ups, options.BulkWrite().SetOrdered(false))
		return err
	}
	if err := do(0, -1); err != nil {
		b.Fatal(err)
	}
	if err := raw(0, -1); err != nil {
		b.Fatal(err)
	}
	bench.Floor(b, 1, trips, do, raw)
	b.ReportMetric(float64(size), "items/op")
}
