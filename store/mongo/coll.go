package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
)

// collection is every command the store sends, so that the documents,
// filters and pipelines it builds can be checked without a server (the
// package's tests run them on a model of the operators they use). The
// driver's implementation is driverCollection; each method is one command.
type collection interface {
	// findOneAndUpdate runs findAndModify with upsert and returns the
	// document after the update. A duplicate key error is returned as the
	// driver's error.
	findOneAndUpdate(ctx context.Context, filter bson.D, pipeline bson.A, let bson.D) (bson.Raw, error)
	// updateOne runs an update of one document and reports how many matched.
	updateOne(ctx context.Context, filter bson.D, pipeline bson.A, let bson.D) (matched int64, err error)
	// findOne returns the projected document matching filter, or nil.
	findOne(ctx context.Context, filter, projection bson.D) (bson.Raw, error)
	// expiredIDs returns up to limit _ids of documents whose deletion time
	// is before now.
	expiredIDs(ctx context.Context, now time.Time, limit int64) ([]any, error)
	// deleteExpired deletes the documents of ids whose deletion time is
	// still before now, and reports how many it deleted.
	deleteExpired(ctx context.Context, ids []any, now time.Time) (int64, error)
	// serverInfo runs buildInfo and hello.
	serverInfo(ctx context.Context) (buildInfo, hello bson.Raw, err error)
	// collation returns the default collation of the collection, nil when
	// it has none or does not exist yet.
	collation(ctx context.Context) (bson.Raw, error)
	// createIndexes creates the TTL index on the deletion time and the
	// partial index of STARTED records by lease deadline.
	createIndexes(ctx context.Context) error
	// find returns up to limit projected documents that match filter, in
	// the order of sort.
	find(ctx context.Context, filter, sort, projection bson.D, limit int64) ([]bson.Raw, error)
	// serverNow runs hello and returns the server's clock (its localTime).
	serverNow(ctx context.Context) (time.Time, error)
	// causal returns a context whose operations run in one causally
	// consistent session, and the function that ends it.
	causal(ctx context.Context) (context.Context, func(), error)
}

// ttlIndexName is the name of the TTL index on the deletion time, and
// startedIndexName of the partial index of STARTED records (see
// startedIndex).
const (
	ttlIndexName     = "idem_expiry"
	startedIndexName = "idem_started"
)

// driverCollection sends the commands with the Go driver.
type driverCollection struct {
	// writes carries the store's write concern, reads its read concern,
	// local read concern "local" and stream read concern "majority" (what
	// a change stream delivers anyway), all with primary read preference.
	writes, reads, local, stream *mongo.Collection
}

func newDriverCollection(c *mongo.Collection, o *Options) *driverCollection {
	opts := options.Collection().SetWriteConcern(o.WriteConcern).SetReadConcern(o.ReadConcern).SetReadPreference(readpref.Primary())
	c = c.Clone(opts)
	// local is for Watch: it must see a write the moment the primary
	// applied it (see watch.go).
	return &driverCollection{
		writes: c,
		reads:  c,
		local:  c.Clone(options.Collection().SetReadConcern(readconcern.Local())),
		stream: c.Clone(options.Collection().SetReadConcern(readconcern.Majority())),
	}
}

func (d *driverCollection) findOneAndUpdate(ctx context.Context, filter bson.D, pipeline bson.A, let bson.D) (bson.Raw, error) {
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After).SetLet(let)
	return d.writes.FindOneAndUpdate(ctx, filter, pipeline, opts).Raw()
}

func (d *driverCollection) updateOne(ctx context.Context, filter bson.D, pipeline bson.A, let bson.D) (int64, error) {
	res, err := d.writes.UpdateOne(ctx, filter, pipeline, options.UpdateOne().SetLet(let))
	if err != nil {
		return 0, err
	}
	return res.MatchedCount, nil
}

func (d *driverCollection) findOne(ctx context.Context, filter, projection bson.D) (bson.Raw, error) {
	raw, err := d.reads.FindOne(ctx, filter, options.FindOne().SetProjection(projection)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	return raw, err
}

func (d *driverCollection) expiredIDs(ctx context.Context, now time.Time, limit int64) ([]any, error) {
	cur, err := d.reads.Find(ctx, bson.D{{Key: fieldDelete, Value: bson.D{{Key: "$lt", Value: now}}}},
		options.Find().SetProjection(bson.D{{Key: fieldID, Value: 1}}).SetLimit(limit))
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	var ids []any
	for cur.Next(ctx) {
		ids = append(ids, cur.Current.Lookup(fieldID))
	}
	return ids, cur.Err()
}

func (d *driverCollection) deleteExpired(ctx context.Context, ids []any, now time.Time) (int64, error) {
	res, err := d.writes.DeleteMany(ctx, sweepDeleteFilter(ids, now))
	if err != nil {
		return 0, err
	}
	return res.DeletedCount, nil
}

// sweepDeleteFilter matches the documents of ids that are still to be
// deleted at now: a record claimed again since it was found has a later
// deletion time and is kept.
func sweepDeleteFilter(ids []any, now time.Time) bson.D {
	return bson.D{
		{Key: fieldID, Value: bson.D{{Key: "$in", Value: bson.A(ids)}}},
		{Key: fieldDelete, Value: bson.D{{Key: "$lt", Value: now}}},
	}
}

func (d *driverCollection) serverInfo(ctx context.Context) (bson.Raw, bson.Raw, error) {
	db := d.writes.Database()
	info, err := db.RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Raw()
	if err != nil {
		return nil, nil, err
	}
	hello, err := db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		return nil, nil, err
	}
	return info, hello, nil
}

func (d *driverCollection) collation(ctx context.Context) (bson.Raw, error) {
	specs, err := d.writes.Database().ListCollectionSpecifications(ctx, bson.D{{Key: "name", Value: d.writes.Name()}})
	if err != nil || len(specs) == 0 {
		return nil, err
	}
	if c, ok := specs[0].Options.Lookup("collation").DocumentOK(); ok {
		return c, nil
	}
	return nil, nil
}

func (d *driverCollection) createIndexes(ctx context.Context) error {
	keys, filter := startedIndex()
	_, err := d.writes.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{
			Keys:    bson.D{{Key: fieldDelete, Value: 1}},
			Options: options.Index().SetName(ttlIndexName).SetExpireAfterSeconds(0),
		},
		{
			Keys:    keys,
			Options: options.Index().SetName(startedIndexName).SetPartialFilterExpression(filter),
		},
	})
	return err
}

func (d *driverCollection) find(ctx context.Context, filter, sort, projection bson.D, limit int64) ([]bson.Raw, error) {
	cur, err := d.reads.Find(ctx, filter, options.Find().SetSort(sort).SetProjection(projection).SetLimit(limit))
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	var docs []bson.Raw
	for cur.Next(ctx) {
		docs = append(docs, append(bson.Raw(nil), cur.Current...))
	}
	return docs, cur.Err()
}

func (d *driverCollection) serverNow(ctx context.Context) (time.Time, error) {
	hello, err := d.writes.Database().RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		return time.Time{}, err
	}
	now, ok := hello.Lookup("localTime").TimeOK()
	if !ok {
		return time.Time{}, fmt.Errorf("hello has no localTime: %s", hello)
	}
	return now, nil
}

func (d *driverCollection) causal(ctx context.Context) (context.Context, func(), error) {
	sess, err := d.writes.Database().Client().StartSession(options.Session().SetCausalConsistency(true))
	if err != nil {
		return nil, nil, err
	}
	return mongo.NewSessionContext(ctx, sess), func() { sess.EndSession(context.WithoutCancel(ctx)) }, nil
}
