package mongo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
)

// Defaults and bounds of [Options].
const (
	// DefaultMaxValueSize is the largest result or checkpoint value stored
	// by default: 1 MiB.
	DefaultMaxValueSize = 1 << 20
	// MaxValueLimit is the highest MaxValueSize accepted: MongoDB's 16 MiB
	// document limit less 16 KiB for the key (up to 1 KiB) and the other
	// fields, so that a record holding a result of this size still fits.
	MaxValueLimit = 16<<20 - 16<<10
	// DefaultSweepBatch is how many records Sweep deletes per command.
	DefaultSweepBatch = 1000
)

// MinServerVersion is the oldest MongoDB the store runs on: 5.0, the first
// with let variables in findAndModify and update, through which every user
// value reaches the server as a literal.
const MinServerVersion = "5.0"

// The parts of MinServerVersion.
const minMajor, minMinor = 5, 0

// claimAttempts bounds how often Claim sends its update again when the
// record that blocked it changed before it could be read (released,
// expired, its lease ended). More than a few means the key is being
// claimed and released continuously.
const claimAttempts = 8

// ErrUnsupportedServer is returned (wrapped, with the reason) by
// [Store.Migrate], and so by the first operation, when the server cannot run
// the store: MongoDB older than [MinServerVersion], FerretDB, or a
// collection whose default collation is not binary.
var ErrUnsupportedServer = errors.New("mongo: unsupported server")

// errNoWatch is returned by Watch on a deployment without change streams.
var errNoWatch = errors.New("mongo: Watch needs change streams, which a standalone server does not have (a replica set or a sharded cluster does); callers poll instead")

// Options configure a [Store]. The zero value (and nil) means the defaults.
type Options struct {
	// MaxValueSize is the largest result (Complete) or checkpoint value
	// (Checkpoint) accepted, in bytes; a larger one gets
	// idempotency.ErrTooLarge before anything is sent. At most
	// [MaxValueLimit]. A record whose checkpoints together exceed
	// MongoDB's 16 MiB document limit also gets idempotency.ErrTooLarge,
	// from the server, with nothing written. Default [DefaultMaxValueSize].
	MaxValueSize int

	// WriteConcern of every write. Default majority (with the journal, as
	// the server's writeConcernMajorityJournalDefault decides): a claim or
	// a completion is acknowledged only once a majority of the replica set
	// has it, so a failover cannot lose it. A lower setting (w: 1) is
	// faster and can lose an acknowledged claim or completion when the
	// primary fails (see the README); w: 0 is refused, as the store must
	// read every reply.
	WriteConcern *writeconcern.WriteConcern

	// ReadConcern of the reads a claim makes after a duplicate key error,
	// and Release after a refused update (both in a causally consistent
	// session, so they see at least what the update saw). Default majority:
	// a replayed result is one a failover cannot roll back.
	ReadConcern *readconcern.ReadConcern

	// SkipIndex leaves the indexes to the operator: [Store.Migrate] creates
	// neither the TTL index (without it expired records stay until Sweep
	// deletes them) nor the partial index of STARTED records (without it
	// [Store.Stuck] scans the collection). See the README for both.
	SkipIndex bool

	// SweepBatch is how many records each of Sweep's commands deletes.
	// Default [DefaultSweepBatch].
	SweepBatch int
}

// Store is an [idempotency.Store] on a MongoDB collection, one document
// per record. It is safe for concurrent use. It implements
// [idempotency.Sweeper], [idempotency.Inspector] and [idempotency.Watcher]
// (effective on replica sets and sharded clusters).
type Store struct {
	c          collection
	drv        *driverCollection // nil when c is not the driver's
	maxValue   int
	sweepBatch int
	skipIndex  bool

	setupMu  sync.Mutex
	ready    atomic.Bool
	canWatch atomic.Bool
}

var (
	_ idempotency.Store     = (*Store)(nil)
	_ idempotency.Sweeper   = (*Store)(nil)
	_ idempotency.Watcher   = (*Store)(nil)
	_ idempotency.Inspector = (*Store)(nil)
)

// Capabilities reports what the store does beyond the [idempotency.Store]
// contract: it sweeps, lets operators inspect, purge and list stuck
// records ([Store.Inspect], [Store.Purge], [Store.Stuck]), watches through
// change streams (on a replica set or a sharded cluster; a standalone
// server's Watch reports that it cannot, and callers poll), and keeps
// values up to [Options.MaxValueSize].
func (s *Store) Capabilities() idempotency.Capabilities {
	return idempotency.Capabilities{Watcher: s, Sweeper: s, Inspector: s,
		Limits: idempotency.Limits{MaxValueSize: s.maxValue}}
}

// Key returns the _id of storageKey's document, as every adapter's Key
// returns the backend's key of a record, for tests and operators: the
// storage key itself.
func (s *Store) Key(storageKey string) string { return storageKey }

// New returns a store on coll, which it never closes or drops. opts may
// be nil. New sends nothing: the first operation (or [Store.Migrate], to
// fail early) checks the server and creates the indexes. It returns an
// error wrapping idempotency.ErrInvalidArgument for a nil collection or
// unusable options.
//
// The store uses its own copy of coll with the write and read concerns of
// opts and primary read preference, whatever coll was given.
func New(coll *mongo.Collection, opts *Options) (*Store, error) {
	if coll == nil {
		return nil, fmt.Errorf("%w: mongo: nil collection", idempotency.ErrInvalidArgument)
	}
	o, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	d := newDriverCollection(coll, &o)
	s := newStore(d, o)
	s.drv = d
	return s, nil
}

// checkOptions validates opts and fills in the defaults.
func checkOptions(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	invalid := func(format string, args ...any) (Options, error) {
		return o, fmt.Errorf("%w: mongo: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
	}
	switch {
	case o.MaxValueSize == 0:
		o.MaxValueSize = DefaultMaxValueSize
	case o.MaxValueSize < 0 || o.MaxValueSize > MaxValueLimit:
		return invalid("MaxValueSize %d is outside 1..%d (MongoDB documents hold at most 16 MiB)", o.MaxValueSize, MaxValueLimit)
	}
	switch {
	case o.SweepBatch == 0:
		o.SweepBatch = DefaultSweepBatch
	case o.SweepBatch < 0:
		return invalid("negative SweepBatch %d", o.SweepBatch)
	}
	if o.WriteConcern == nil {
		o.WriteConcern = writeconcern.Majority()
	}
	if !o.WriteConcern.IsValid() || !o.WriteConcern.Acknowledged() {
		return invalid("WriteConcern %+v: the store reads every write's reply, so it must be acknowledged (w >= 1 or \"majority\")", *o.WriteConcern)
	}
	if o.ReadConcern == nil {
		o.ReadConcern = readconcern.Majority()
	}
	switch o.ReadConcern.Level {
	case "local", "majority", "linearizable":
	default:
		return invalid("ReadConcern %q: use \"majority\" (the default), \"local\" or \"linearizable\"", o.ReadConcern.Level)
	}
	return o, nil
}

func newStore(c collection, o Options) *Store {
	return &Store{c: c, maxValue: o.MaxValueSize, sweepBatch: o.SweepBatch, skipIndex: o.SkipIndex}
}

// Migrate checks that the server can run the store and prepares the
// collection: MongoDB [MinServerVersion] or later (not FerretDB), a
// collection without a default collation (keys compare byte for byte),
// the TTL index on the deletion time and the partial index of STARTED
// records by lease deadline, for Stuck (unless [Options.SkipIndex]). It
// also learns whether the deployment has change streams, for Watch. Every
// operation runs it first until it succeeds once, so calling it is only
// needed to fail at start-up rather than at the first request. Errors
// about the server wrap [ErrUnsupportedServer].
func (s *Store) Migrate(ctx context.Context) error {
	if s.ready.Load() {
		return nil
	}
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.ready.Load() {
		return nil
	}
	info, hello, err := s.c.serverInfo(ctx)
	if err != nil {
		return s.fail(ctx, "setup: buildInfo and hello", err)
	}
	if err := checkServer(info); err != nil {
		return err
	}
	coll, err := s.c.collation(ctx)
	if err != nil {
		return s.fail(ctx, "setup: listCollections", err)
	}
	if err := checkCollation(coll); err != nil {
		return err
	}
	if !s.skipIndex {
		if err := s.c.createIndexes(ctx); err != nil {
			return s.fail(ctx, "setup: creating the indexes "+ttlIndexName+" and "+startedIndexName, err)
		}
	}
	s.canWatch.Store(hasChangeStreams(hello))
	s.ready.Store(true)
	return nil
}

// checkServer refuses FerretDB and MongoDB older than MinServerVersion.
func checkServer(info bson.Raw) error {
	if v, ok := info.Lookup("ferretdbVersion").StringValueOK(); ok {
		return fmt.Errorf("%w: FerretDB %s answers for MongoDB, but its conditional updates are not atomic and it has no $$NOW update pipelines or TTL indexes; the store needs MongoDB %s or later", ErrUnsupportedServer, v, MinServerVersion)
	}
	version, _ := info.Lookup("version").StringValueOK()
	major, minor, ok := versionOf(info)
	if !ok {
		return fmt.Errorf("%w: buildInfo reports no version (%q); the store needs MongoDB %s or later", ErrUnsupportedServer, version, MinServerVersion)
	}
	if major < minMajor || major == minMajor && minor < minMinor {
		return fmt.Errorf("%w: MongoDB %s is older than %s, the oldest version the store runs on (it sends let variables with findAndModify and update, new in 5.0); upgrade the server to %s or later", ErrUnsupportedServer, version, MinServerVersion, MinServerVersion)
	}
	return nil
}

// versionOf reads major and minor from buildInfo's versionArray, or else
// from its version string.
func versionOf(info bson.Raw) (major, minor int, ok bool) {
	if arr, isArr := info.Lookup("versionArray").ArrayOK(); isArr {
		vals, err := arr.Values()
		if err == nil && len(vals) >= 2 {
			ma, ok1 := vals[0].AsInt64OK()
			mi, ok2 := vals[1].AsInt64OK()
			if ok1 && ok2 {
				return int(ma), int(mi), true
			}
		}
	}
	v, _ := info.Lookup("version").StringValueOK()
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return ma, mi, true
}

// checkCollation refuses a collection whose default collation is not the
// binary ("simple") one: under a case-insensitive collation, say, keys
// "Key" and "key" would be one record.
func checkCollation(c bson.Raw) error {
	if c == nil {
		return nil
	}
	if locale, _ := c.Lookup("locale").StringValueOK(); locale == "simple" {
		return nil
	}
	return fmt.Errorf("%w: the collection has the default collation %s, under which distinct keys can compare equal; use a collection without a collation (or with locale \"simple\")", ErrUnsupportedServer, c)
}

// hasChangeStreams reports whether hello describes a replica set member or
// a mongos, the deployments with change streams.
func hasChangeStreams(hello bson.Raw) bool {
	if _, ok := hello.Lookup("setName").StringValueOK(); ok {
		return true
	}
	msg, _ := hello.Lookup("msg").StringValueOK()
	return msg == "isdbgrid"
}

// begin checks what every operation checks first: a context not yet done,
// and a server that passed Migrate.
func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.Migrate(ctx)
}

// Claim implements [idempotency.Store.Claim] with one findAndModify
// upsert: see claimFilter and claimPipeline. When the record may not be
// acquired, the upsert fails with a duplicate key error and one read in
// the same causally consistent session tells the outcome.
func (s *Store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := idempotency.ValidateClaim("mongo", r); err != nil {
		return idempotency.ClaimResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	cctx, end, err := s.c.causal(ctx)
	if err != nil {
		return idempotency.ClaimResult{}, s.fail(ctx, "claim", err)
	}
	defer end()
	let := claimLet(string(r.Fingerprint), string(r.Token), r.Lease, r.Grace)
	for range claimAttempts {
		doc, err := s.c.findOneAndUpdate(cctx, claimFilter(r.Key), claimPipeline(), let)
		if err == nil {
			return acquired(doc, r)
		}
		if !mongo.IsDuplicateKeyError(err) {
			return idempotency.ClaimResult{}, s.fail(ctx, "claim", err)
		}
		// Another record holds the key: read it. Never "not claimed" on
		// the duplicate key error alone.
		doc, err = s.c.findOne(cctx, keyFilter(r.Key), readProjection())
		if err != nil {
			return idempotency.ClaimResult{}, s.fail(ctx, "claim: reading the record that holds the key", err)
		}
		if res, ok := decideFromRead(doc, r); ok {
			return res, nil
		}
		// It changed in between (released, expired, lease ended): decide
		// again.
	}
	return idempotency.ClaimResult{}, fmt.Errorf("mongo: claim: the record of key %q changed between the update and the read %d times; try again", r.Key, claimAttempts)
}

// acquired reads the document a claim's update returned: the record as
// the request now holds it.
func acquired(doc bson.Raw, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	state, _ := doc.Lookup(fieldState).StringValueOK()
	tok, _ := decodeString(doc.Lookup(fieldToken))
	fence, okF := doc.Lookup(fieldFence).AsInt64OK()
	attempt, okA := doc.Lookup(fieldAttempt).AsInt64OK()
	if state != stateStarted || tok != string(r.Token) || !okF || !okA {
		return idempotency.ClaimResult{}, fmt.Errorf("mongo: claim: the update returned a record not held by the claim: %s", doc)
	}
	res := idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: fence, Attempt: int(attempt)}
	cps, err := checkpoints(doc)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	res.Checkpoints = cps
	return res, nil
}

// checkpoints decodes the checkpoint array into a map of fresh slices.
func checkpoints(doc bson.Raw) (map[string][]byte, error) {
	v := doc.Lookup(fieldCheckpoints)
	if v.Type == 0 || v.Type == bson.TypeNull {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("mongo: corrupt checkpoints %s", v)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, fmt.Errorf("mongo: corrupt checkpoints: %w", err)
	}
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string][]byte, len(vals))
	for _, item := range vals {
		d, ok := item.DocumentOK()
		name, okN := decodeString(d.Lookup("k"))
		_, value, okV := d.Lookup("v").BinaryOK()
		if !ok || !okN || !okV {
			return nil, fmt.Errorf("mongo: corrupt checkpoint %s", item)
		}
		m[name] = append([]byte{}, value...)
	}
	return m, nil
}

// decideFromRead decides a claim from the record that blocked its upsert,
// as read afterwards. ok is false when the record no longer blocks it
// (gone, expired, released, its lease ended, or it is the claim's own):
// the claim must be sent again.
func decideFromRead(doc bson.Raw, r idempotency.ClaimRequest) (idempotency.ClaimResult, bool) {
	if doc == nil {
		return idempotency.ClaimResult{}, false
	}
	if live, _ := doc.Lookup("live").BooleanOK(); !live {
		return idempotency.ClaimResult{}, false
	}
	fence, _ := doc.Lookup(fieldFence).AsInt64OK()
	attempt, _ := doc.Lookup(fieldAttempt).AsInt64OK()
	res := idempotency.ClaimResult{Fence: fence, Attempt: int(attempt)}
	fp, _ := decodeString(doc.Lookup(fieldFingerprint))
	state, _ := doc.Lookup(fieldState).StringValueOK()
	tok, _ := decodeString(doc.Lookup(fieldToken))
	switch {
	case fp != string(r.Fingerprint):
		res.Outcome = idempotency.OutcomeMismatch
	case state == stateCompleted:
		res.Outcome = idempotency.OutcomeReplay
		_, b, _ := doc.Lookup(fieldResult).BinaryOK()
		res.Result = append([]byte{}, b...)
	case state != stateStarted || tok == string(r.Token):
		return res, false
	default:
		left, ok := doc.Lookup("left").AsInt64OK()
		if !ok || left <= 0 {
			return res, false
		}
		res.Outcome = idempotency.OutcomeInProgress
		res.RetryAfter = time.Duration(left) * time.Millisecond
	}
	return res, true
}

// Renew implements [idempotency.Store.Renew] with one update conditional
// on the token.
func (s *Store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: mongo: lease must be positive, got %v", idempotency.ErrInvalidArgument, lease)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	let := letDoc(varToken, encodeString(string(token)), varLease, millis(lease))
	return s.held(ctx, "renew", key, renewPipeline(), let)
}

// Checkpoint implements [idempotency.Store.Checkpoint] with one update
// conditional on the token.
func (s *Store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: mongo: checkpoint of %d bytes, limit %d (Options.MaxValueSize)", idempotency.ErrTooLarge, len(value), s.maxValue)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	let := letDoc(varToken, encodeString(string(token)), varName, encodeString(name), varValue, binary(value))
	return s.held(ctx, "checkpoint", key, checkpointPipeline(), let)
}

// Complete implements [idempotency.Store.Complete] with one update
// conditional on the token.
func (s *Store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if len(result) > s.maxValue {
		return fmt.Errorf("%w: mongo: result of %d bytes, limit %d (Options.MaxValueSize)", idempotency.ErrTooLarge, len(result), s.maxValue)
	}
	if retention <= 0 {
		return fmt.Errorf("%w: mongo: retention must be positive, got %v", idempotency.ErrInvalidArgument, retention)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	matched, err := s.c.updateOne(ctx, completeFilter(key), completePipeline(),
		letDoc(varToken, encodeString(string(token)), varRetention, millis(retention), varResult, binary(result)))
	if err != nil {
		return s.fail(ctx, "complete", err)
	}
	if matched == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// held runs a write under a lease: pipeline on the live STARTED record
// under key held under the token of let, or ErrLeaseLost.
func (s *Store) held(ctx context.Context, opName, key string, pipeline bson.A, let bson.D) error {
	matched, err := s.c.updateOne(ctx, heldFilter(key), pipeline, let)
	if err != nil {
		return s.fail(ctx, opName, err)
	}
	if matched == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Release implements [idempotency.Store.Release] with one update
// conditional on the token, which leaves a released record: absent to
// every operation, kept only for its fence until the TTL index or Sweep
// deletes it. When the update matches nothing, one read (in the same
// causally consistent session) tells an absent or expired record (success)
// from one held by another token or completed (ErrLeaseLost).
func (s *Store) Release(ctx context.Context, key string, token idempotency.Token) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	cctx, end, err := s.c.causal(ctx)
	if err != nil {
		return s.fail(ctx, "release", err)
	}
	defer end()
	let := letDoc(varToken, encodeString(string(token)))
	for range claimAttempts {
		matched, err := s.c.updateOne(cctx, heldFilter(key), releasePipeline(), let)
		if err != nil {
			return s.fail(ctx, "release", err)
		}
		if matched > 0 {
			return nil
		}
		doc, err := s.c.findOne(cctx, keyFilter(key), readProjection())
		if err != nil {
			return s.fail(ctx, "release: reading the record", err)
		}
		if done, lost := releaseFromRead(doc, token); done {
			return lost
		}
	}
	return fmt.Errorf("mongo: release: the record of key %q changed between the update and the read %d times; try again", key, claimAttempts)
}

// releaseFromRead decides a Release whose update matched nothing from the
// record read afterwards: absent or not live is a success, held by another
// token or completed is ErrLeaseLost. done is false when the record is the
// token's own live STARTED record (it changed in between): send the
// update again.
func releaseFromRead(doc bson.Raw, token idempotency.Token) (done bool, err error) {
	if doc == nil {
		return true, nil
	}
	if live, _ := doc.Lookup("live").BooleanOK(); !live {
		return true, nil
	}
	state, _ := doc.Lookup(fieldState).StringValueOK()
	tok, _ := decodeString(doc.Lookup(fieldToken))
	if state == stateStarted && tok == string(token) {
		return false, nil
	}
	return true, idempotency.ErrLeaseLost
}

// Sweep implements [idempotency.Sweeper]: it deletes records whose
// deletion time (their expiry, or the millisecond after their fence if
// that is later) is before the server's now, read once per call from
// hello's localTime, in commands of at most [Options.SweepBatch] records.
// Each delete checks the deletion time again, so a record claimed since
// it was found is kept.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	_, hello, err := s.c.serverInfo(ctx)
	if err != nil {
		return 0, s.fail(ctx, "sweep: hello", err)
	}
	now, ok := hello.Lookup("localTime").TimeOK()
	if !ok {
		return 0, fmt.Errorf("mongo: sweep: hello has no localTime: %s", hello)
	}
	total := 0
	for limit <= 0 || total < limit {
		n := s.sweepBatch
		if limit > 0 {
			n = min(n, limit-total)
		}
		ids, err := s.c.expiredIDs(ctx, now, int64(n))
		if err != nil {
			return total, s.fail(ctx, "sweep", err)
		}
		if len(ids) == 0 {
			break
		}
		deleted, err := s.c.deleteExpired(ctx, ids, now)
		if err != nil {
			return total, s.fail(ctx, "sweep", err)
		}
		total += int(deleted)
		if deleted == 0 || len(ids) < n {
			break
		}
	}
	return total, nil
}

// fail wraps a driver error with the operation's name. When ctx is done
// the context's error is wrapped too, so errors.Is finds it; a document
// the server (or the driver) refused as too large wraps
// idempotency.ErrTooLarge, as nothing was written.
func (s *Store) fail(ctx context.Context, opName string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("mongo: %s: %w (%w)", opName, cerr, err)
	}
	if isTooLarge(err) {
		return fmt.Errorf("%w: mongo: %s: %w", idempotency.ErrTooLarge, opName, err)
	}
	return fmt.Errorf("mongo: %s: %w", opName, err)
}

// The server's error codes for a document over the 16 MiB limit.
const (
	codeBSONObjectTooLarge   = 10334
	codeUpdateResultTooLarge = 17419
)

// isTooLarge reports whether err says that a document would exceed the
// server's size limit: the server refused the write, or the driver refused
// to send it. Either way nothing was written.
func isTooLarge(err error) bool {
	if errors.Is(err, driver.ErrDocumentTooLarge) {
		return true
	}
	var se mongo.ServerError
	if errors.As(err, &se) {
		return se.HasErrorCode(codeBSONObjectTooLarge) || se.HasErrorCode(codeUpdateResultTooLarge)
	}
	return false
}
