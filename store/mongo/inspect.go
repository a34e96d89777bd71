package mongo

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// The operator's part of the store ([idempotency.Inspector]). Stuck reads
// the partial index of STARTED records by lease deadline
// (startedIndex), from the oldest deadline up to the server's now, so it
// never reads a COMPLETED or released record, nor a holder whose lease
// is running.

// startedIndex is the key and the partial filter of the index of STARTED
// records: by lease deadline, then key, for the records whose state is
// STARTED only. A fresh claim inserts its entry, a renewal or takeover
// moves it (the lease deadline changes), a completion or release removes
// it (the state changes or goes): the cost each of those pays, in the
// write it makes anyway.
func startedIndex() (keys, filter bson.D) {
	return bson.D{{Key: fieldLease, Value: 1}, {Key: fieldID, Value: 1}},
		bson.D{{Key: fieldState, Value: stateStarted}}
}

// inspectProjection is what Inspect and Stuck read of a record:
// readProjection, the lease deadline (for Stuck's cursor), the
// checkpoints, and the time left before it expires by the server's clock.
func inspectProjection() bson.D {
	return append(readProjection(),
		bson.E{Key: fieldLease, Value: 1},
		bson.E{Key: fieldCheckpoints, Value: 1},
		bson.E{Key: "expiresIn", Value: op("$subtract", field(fieldExpires), "$$NOW")},
	)
}

// Inspect implements [idempotency.Inspector] with one find by _id: a
// record that is absent, released or expired by the server's clock is
// [idempotency.ErrNotFound].
func (s *Store) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	if err := s.begin(ctx); err != nil {
		return idempotency.RecordInfo{}, err
	}
	doc, err := s.c.findOne(ctx, keyFilter(key), inspectProjection())
	if err != nil {
		return idempotency.RecordInfo{}, s.fail(ctx, "inspect", err)
	}
	if doc == nil {
		return idempotency.RecordInfo{}, fmt.Errorf("%w: mongo: %q", idempotency.ErrNotFound, key)
	}
	if live, _ := doc.Lookup("live").BooleanOK(); !live {
		return idempotency.RecordInfo{}, fmt.Errorf("%w: mongo: %q", idempotency.ErrNotFound, key)
	}
	info, err := describe(key, doc)
	if err != nil {
		return idempotency.RecordInfo{}, fmt.Errorf("mongo: inspect: %w", err)
	}
	return info, nil
}

// describe is the RecordInfo of a document read with inspectProjection.
func describe(key string, doc bson.Raw) (idempotency.RecordInfo, error) {
	state, _ := doc.Lookup(fieldState).StringValueOK()
	fp, _ := decodeString(doc.Lookup(fieldFingerprint))
	fence, _ := doc.Lookup(fieldFence).AsInt64OK()
	attempt, _ := doc.Lookup(fieldAttempt).AsInt64OK()
	expires, _ := doc.Lookup("expiresIn").AsInt64OK()
	info := idempotency.RecordInfo{
		Key:         key,
		State:       idempotency.State(state),
		Fingerprint: idempotency.Fingerprint(fp),
		Fence:       fence,
		Attempt:     int(attempt),
		ExpiresIn:   time.Duration(max(expires, 0)) * time.Millisecond,
	}
	switch state {
	case stateStarted:
		if left, ok := doc.Lookup("left").AsInt64OK(); ok && left > 0 {
			info.LeaseLeft = time.Duration(left) * time.Millisecond
		}
		cps, err := checkpoints(doc)
		if err != nil {
			return info, fmt.Errorf("%w: record %q: %w", idempotency.ErrCorrupt, key, err)
		}
		info.Checkpoints = cps
	case stateCompleted:
		_, b, _ := doc.Lookup(fieldResult).BinaryOK()
		info.Result = append([]byte{}, b...)
	default:
		return info, fmt.Errorf("%w: record %q has unknown state %q", idempotency.ErrCorrupt, key, state)
	}
	return info, nil
}

// Purge implements [idempotency.Inspector] with one update, whatever the
// record's state: it leaves a released record, as Release does, so that
// the next claim's fence continues from the purged record's (see
// releasePipeline). A holder of the purged record finds no live record
// under its token and gets ErrLeaseLost; a Watch wakes with the update.
func (s *Store) Purge(ctx context.Context, key string) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if _, err := s.c.updateOne(ctx, keyFilter(key), releasePipeline(), letDoc()); err != nil {
		return s.fail(ctx, "purge", err)
	}
	return nil
}

// Stuck implements [idempotency.Inspector]: one hello for the server's
// now, then one find on the partial index of STARTED records (state
// STARTED, lease deadline at or before now, after the cursor's deadline
// and key; not expired), sorted by deadline and key. The cursor is the
// deadline and key of the last record listed. A record stuck during the
// whole listing keeps its deadline and is listed once; one renewed or
// taken over meanwhile moves in the index and may be listed or not.
func (s *Store) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if limit <= 0 {
		return nil, "", fmt.Errorf("%w: mongo: stuck: limit %d is not positive", idempotency.ErrInvalidArgument, limit)
	}
	after, err := parseStuckCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if err := s.begin(ctx); err != nil {
		return nil, "", err
	}
	now, err := s.c.serverNow(ctx)
	if err != nil {
		return nil, "", s.fail(ctx, "stuck: hello", err)
	}
	keys, _ := startedIndex()
	docs, err := s.c.find(ctx, stuckFilter(now, after), keys, inspectProjection(), int64(limit))
	if err != nil {
		return nil, "", s.fail(ctx, "stuck", err)
	}
	out := make([]idempotency.RecordInfo, 0, len(docs))
	for _, doc := range docs {
		key, ok := decodeString(doc.Lookup(fieldID))
		if !ok {
			return nil, "", fmt.Errorf("mongo: stuck: %w: a record's _id is %s", idempotency.ErrCorrupt, doc.Lookup(fieldID))
		}
		info, err := describe(key, doc)
		if err != nil {
			return nil, "", fmt.Errorf("mongo: stuck: %w", err)
		}
		out = append(out, info)
	}
	if len(docs) < limit {
		return out, "", nil
	}
	last := docs[len(docs)-1]
	lease, _ := last.Lookup(fieldLease).DateTimeOK()
	return out, stuckCursor{lease: lease, key: out[len(out)-1].Key}.String(), nil
}

// stuckCursor is where a page of Stuck ended: the lease deadline (ms)
// and the key of the last record listed.
type stuckCursor struct {
	lease int64
	key   string
	set   bool
}

// String encodes the cursor as base64url of "m1:<deadline ms>:<key>".
func (c stuckCursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte("m1:" + strconv.FormatInt(c.lease, 10) + ":" + c.key))
}

func parseStuckCursor(s string) (stuckCursor, error) {
	if s == "" {
		return stuckCursor{}, nil
	}
	bad := fmt.Errorf("%w: mongo: stuck: cursor %q is not one Stuck returned", idempotency.ErrInvalidArgument, s)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return stuckCursor{}, bad
	}
	rest, ok := strings.CutPrefix(string(b), "m1:")
	ms, key, ok2 := strings.Cut(rest, ":")
	lease, err := strconv.ParseInt(ms, 10, 64)
	if !ok || !ok2 || err != nil {
		return stuckCursor{}, bad
	}
	return stuckCursor{lease: lease, key: key, set: true}, nil
}

// stuckFilter matches the STARTED records whose lease ended by now and
// which have not expired, after the cursor in the index's order (lease
// deadline, then _id). The state equality lets the server use the
// partial index, and the deadline's bounds (from the cursor's deadline to
// now) are the range of it to scan; the $or passes over the keys of the
// cursor's own deadline up to the cursor's. The expiry is checked on the
// documents the index names. A string _id sorts before a binary one
// (BSON's order of types), and a comparison matches values of its own
// type only, so after a string cursor key come the greater strings and
// every binary key.
func stuckFilter(now time.Time, after stuckCursor) bson.D {
	nowDate := bson.NewDateTimeFromTime(now)
	deadline := bson.D{{Key: "$lte", Value: nowDate}}
	if after.set {
		deadline = bson.D{{Key: "$gte", Value: bson.DateTime(after.lease)}, {Key: "$lte", Value: nowDate}}
	}
	f := bson.D{
		{Key: fieldState, Value: stateStarted},
		{Key: fieldLease, Value: deadline},
		{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: nowDate}}},
	}
	if !after.set {
		return f
	}
	id := encodeString(after.key)
	branches := bson.A{
		bson.D{{Key: fieldLease, Value: bson.D{{Key: "$gt", Value: bson.DateTime(after.lease)}}}},
		bson.D{{Key: fieldID, Value: bson.D{{Key: "$gt", Value: id}}}},
	}
	if _, isString := id.(string); isString {
		branches = append(branches, bson.D{{Key: fieldID, Value: bson.D{{Key: "$type", Value: "binData"}}}})
	}
	return append(f, bson.E{Key: "$or", Value: branches})
}
