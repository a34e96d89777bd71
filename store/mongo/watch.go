package mongo

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// codeChangeStreamHistoryLost is the server's error when a change stream
// is asked to start before the oldest entry of the oplog.
const codeChangeStreamHistoryLost = 286

// watchMargin is how far before the read of the record's state the change
// stream starts, in whole seconds of cluster time. A write whose oplog
// time was reserved before the read but that committed after it (an
// "oplog hole", microseconds wide) is then still delivered; events older
// than the read that changed nothing since are recognized and skipped.
const watchMargin = 1

// Watch implements [idempotency.Watcher] with a change stream on the
// collection, filtered to the record under key. It returns when the
// record is not a live STARTED record (it may have changed before the
// call), and otherwise after a change event following which the record's
// state, holder or fence differ from what it first read: a completion, a
// release, a takeover, a deletion. Expiry writes nothing and is not seen;
// callers also poll. The first read and the re-reads use read concern
// "local" on the primary, so they see a write as soon as it is applied;
// the stream starts a second (of cluster time) before the first read. On a
// standalone server, which has no change streams, Watch returns an error
// at once and callers poll.
func (s *Store) Watch(ctx context.Context, key string) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if s.drv == nil || !s.canWatch.Load() {
		return errNoWatch
	}
	coll := s.drv.local
	sess, err := coll.Database().Client().StartSession()
	if err != nil {
		return s.fail(ctx, "watch", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	first, err := s.readVersion(mongo.NewSessionContext(ctx, sess), coll, key)
	if err != nil {
		return err
	}
	if !first.started {
		return nil
	}
	opts := options.ChangeStream()
	if t := sess.OperationTime(); t != nil {
		start := *t
		if start.T > watchMargin {
			start = bson.Timestamp{T: t.T - watchMargin}
		}
		opts.SetStartAtOperationTime(&start)
	}
	stream := s.drv.stream
	cs, err := stream.Watch(ctx, watchPipeline(key), opts)
	if t := sess.OperationTime(); err != nil && t != nil && isCode(err, codeChangeStreamHistoryLost) {
		// The oplog does not reach back a second (a new deployment): start
		// at the read itself.
		cs, err = stream.Watch(ctx, watchPipeline(key), options.ChangeStream().SetStartAtOperationTime(t))
	}
	if err != nil {
		return s.fail(ctx, "watch", err)
	}
	defer cs.Close(context.WithoutCancel(ctx))
	for cs.Next(ctx) {
		now, err := s.readVersion(ctx, coll, key)
		if err != nil {
			return err
		}
		if now != first {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.fail(ctx, "watch", cs.Err())
}

// version is what Watch compares of a record.
type version struct {
	started bool // a live STARTED record
	token   string
	fence   int64
}

// readVersion reads the record's version by the server's clock.
func (s *Store) readVersion(ctx context.Context, coll *mongo.Collection, key string) (version, error) {
	raw, err := coll.FindOne(ctx, keyFilter(key), options.FindOne().SetProjection(watchProjection())).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return version{}, nil
	}
	if err != nil {
		return version{}, s.fail(ctx, "watch: reading the record", err)
	}
	return watchVersion(raw), nil
}

// watchProjection is what Watch reads of a record: enough for its version.
func watchProjection() bson.D {
	return bson.D{
		{Key: fieldState, Value: 1},
		{Key: fieldToken, Value: 1},
		{Key: fieldFence, Value: 1},
		{Key: "live", Value: exprLive()},
	}
}

// watchVersion extracts the version from a document read with
// watchProjection.
func watchVersion(doc bson.Raw) version {
	live, _ := doc.Lookup("live").BooleanOK()
	state, _ := doc.Lookup(fieldState).StringValueOK()
	if !live || state != stateStarted {
		return version{}
	}
	tok, _ := decodeString(doc.Lookup(fieldToken))
	fence, _ := doc.Lookup(fieldFence).AsInt64OK()
	return version{started: true, token: tok, fence: fence}
}

// isCode reports whether err is a server error with code.
func isCode(err error, code int) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(code)
}
