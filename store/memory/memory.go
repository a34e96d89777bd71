// Package memory is an in-memory [idempotency.Store]: the reference
// implementation of the store contract, the store of the examples and of
// unit tests, and a real store for a service that runs as one process.
//
// Records live in a map guarded by a mutex; replays of completed records
// take it for reading only, so they run side by side. Deadlines are judged by an
// injectable clock ([Options.Now]), so tests can move time forward instead
// of sleeping. Expired records are invisible to every operation, and every
// operation also deletes up to four expired records (the soonest expired
// first: completed records wait in a queue in the order they expire, the
// others in a heap), so memory stays bounded by the
// live records in a long-running process without a background goroutine,
// a Close method or calls to [Store.Sweep]. Fences come from one counter
// for the whole store, so a key's fence strictly increases across
// takeovers and across deletion and re-creation of its record.
//
// Nothing survives the process: a crash forgets every completed result,
// so a retry after a restart runs its effect again. Use a database-backed
// store where results must outlive the process.
package memory

import (
	"container/heap"
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
)

// DefaultMaxValueSize is the largest result or checkpoint value, in bytes,
// that a store keeps when [Options.MaxValueSize] is zero.
const DefaultMaxValueSize = 4 << 20

// sweepPerOp is how many expired records every operation deletes at most.
// Each operation creates at most one record, so deleting more than one
// expired record per operation keeps the expired backlog shrinking.
const sweepPerOp = 4

// staleSweepPerOp is how many entries of deleted records an operation
// drops at most from the queue of completed records. An operation
// deletes at most sweepPerOp+1 records, so dropping more keeps that
// backlog shrinking too.
const staleSweepPerOp = 4 * sweepPerOp

// Options configures a [Store]. The zero value (or a nil *Options) gives
// the defaults.
type Options struct {
	// Now is the store's clock, by which every lease and retention deadline
	// is judged. Nil means time.Now. Tests pass a manual clock, such as
	// conformancetest.Clock's Now method. It is called from concurrent
	// replays, so it must be safe for concurrent use, as both are.
	Now func() time.Time

	// MaxValueSize is the largest result or checkpoint value the store
	// keeps, in bytes; a larger one gives [idempotency.ErrTooLarge] and
	// writes nothing. Zero means [DefaultMaxValueSize]; for no limit, give
	// math.MaxInt. A negative value is refused.
	MaxValueSize int
}

// Store is an in-memory [idempotency.Store], also implementing
// [idempotency.Sweeper] and [idempotency.Watcher]. It is safe for
// concurrent use. The zero value is not usable: call [New].
type Store struct {
	now      func() time.Time
	maxValue int

	// base is the store clock's reading at New: deadlines are kept as
	// nanoseconds since base (see [Store.clock]).
	base      time.Time
	realClock bool // now is time.Now

	seed    maphash.Seed            // of the keys' hashes
	hashKey func(key string) uint64 // replaces maphash in tests of collisions

	mu sync.RWMutex // read-locked by replays only
	// records holds every record by the hash of its key (see hash), those
	// of keys with the same hash chained through next. A map by a fixed
	// size hash, computed once per operation, costs less than a map by
	// the key: a string key is hashed again on every map access and every
	// move when the map grows, each time reading the key's bytes, a cache
	// miss in a large store.
	records map[uint64]*record
	// Every record is in expiry or in done, which give the soonest to
	// expire. done holds COMPLETED records in the order they expire:
	// when every Complete asks for the same retention, as a runner does,
	// each completed record joins its end, at no cost but an append,
	// instead of walking down a heap of all records; a completion that
	// would expire before the last in done goes to expiry.
	expiry expiryHeap // STARTED records, and COMPLETED ones out of order
	done   fifo
	count  int   // records in records
	fence  int64 // last fence handed out, store-wide
}

// record is one key's record. Byte slices in it are owned by the store:
// copied in and copied out.
//
// A store keeps many records, and the garbage collector marks every
// pointer in them on every cycle: so the record's strings share one
// allocation and its instants are integers, which leaves a live COMPLETED
// record with two pointers (ids and result) instead of seven.
type record struct {
	// ids is the storage key, the fingerprint and the token, in this
	// order; keyLen and fpLen split it (see key, fingerprint and token).
	ids       string
	keyLen    int32
	fpLen     int32
	hash      uint64  // of the key, by which records holds it
	next      *record // the next record of the same hash; nil but for a collision
	fence     int64
	attempt   int
	leaseEnd  instant // STARTED only
	grace     time.Duration
	expires   instant // the record is absent from this instant on
	heapIndex int32   // in expiry; -1 when not there
	completed bool    // COMPLETED; else STARTED
	deleted   bool    // no longer in records: its entry in done is stale
	// checkpoints and changed are nil for most records.
	checkpoints map[string][]byte
	result      []byte
	// changed is closed, and set to nil, when the record completes, is
	// released, taken over or deleted. Made only when someone watches.
	changed chan struct{}
}

// instant is a reading of the store's clock: nanoseconds since the
// store's base (see [Store.clock]).
type instant int64

// add returns i plus d, saturating instead of overflowing.
func (i instant) add(d time.Duration) instant {
	if d > 0 && i > math.MaxInt64-instant(d) {
		return math.MaxInt64
	}
	return i + instant(d)
}

// sub returns the duration from j to i.
func (i instant) sub(j instant) time.Duration { return time.Duration(i - j) }

func (rec *record) key() string { return rec.ids[:rec.keyLen] }

func (rec *record) stateOf() idempotency.State {
	if rec.completed {
		return idempotency.StateCompleted
	}
	return idempotency.StateStarted
}

func (rec *record) fingerprint() idempotency.Fingerprint {
	return idempotency.Fingerprint(rec.ids[rec.keyLen : rec.keyLen+rec.fpLen])
}

func (rec *record) token() idempotency.Token {
	return idempotency.Token(rec.ids[rec.keyLen+rec.fpLen:])
}

// setIDs stores key, fingerprint and token in one allocation. It panics
// on a key or fingerprint of 2 GiB or more.
func (rec *record) setIDs(key string, fp idempotency.Fingerprint, token idempotency.Token) {
	if len(key) > math.MaxInt32 || len(fp) > math.MaxInt32 {
		panic("memory: key or fingerprint too long")
	}
	rec.ids = key + string(fp) + string(token)
	rec.keyLen, rec.fpLen = int32(len(key)), int32(len(fp))
}

// clock reads the store's clock as an instant: nanoseconds since base,
// saturated at about 292 years either side of it.
func (s *Store) clock() instant {
	if s.realClock {
		return instant(time.Since(s.base)) // the monotonic clock alone
	}
	return instant(s.now().Sub(s.base))
}

// New returns an empty store. A nil opts means the defaults. It returns an
// error wrapping [idempotency.ErrInvalidArgument] for invalid options, as
// every adapter's New does.
func New(opts *Options) (*Store, error) {
	if opts != nil && opts.MaxValueSize < 0 {
		return nil, invalid("MaxValueSize %d is negative (for no limit, give math.MaxInt)", opts.MaxValueSize)
	}
	s := &Store{
		now:      time.Now,
		maxValue: DefaultMaxValueSize,
		records:  make(map[uint64]*record),
		seed:     maphash.MakeSeed(),
	}
	if opts != nil {
		if opts.Now != nil {
			s.now = opts.Now
		}
		if opts.MaxValueSize != 0 {
			s.maxValue = opts.MaxValueSize
		}
	}
	s.base = s.now()
	s.realClock = opts == nil || opts.Now == nil
	return s, nil
}

var (
	_ idempotency.Store     = (*Store)(nil)
	_ idempotency.Sweeper   = (*Store)(nil)
	_ idempotency.Watcher   = (*Store)(nil)
	_ idempotency.Inspector = (*Store)(nil)
)

// Capabilities reports what the store does beyond the [idempotency.Store]
// contract: it watches, sweeps and inspects, and keeps values up to
// [Options.MaxValueSize].
func (s *Store) Capabilities() idempotency.Capabilities {
	return idempotency.Capabilities{Watcher: s, Inspector: s, Sweeper: s, Batcher: s,
		Limits: idempotency.Limits{MaxValueSize: s.maxValue}}
}

// ClaimBatch claims each request as [Store.Claim] does: with no round
// trip to save, it is the reference of [idempotency.Batcher], item by
// item.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	return idempotency.ClaimEach(ctx, s, reqs)
}

// FinishBatch completes or releases each item as [Store.Complete] and
// [Store.Release] do.
func (s *Store) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	return idempotency.FinishEach(ctx, s, items)
}

// Key returns the key under which the store keeps storageKey's record,
// as every adapter's Key returns the backend's key of a record: the
// storage key itself.
func (s *Store) Key(storageKey string) string { return storageKey }

// Claim atomically decides what a request for r.Key may do, as
// [idempotency.Store] documents. It returns an error wrapping
// [idempotency.ErrInvalidArgument] for an empty key, a non-positive lease or
// a negative grace, and ctx's error when ctx is already done.
func (s *Store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, err
	}
	if err := idempotency.ValidateClaim("memory", r); err != nil {
		return idempotency.ClaimResult{}, err
	}

	h := s.hash(r.Key)
	if res, ok := s.replay(h, r); ok {
		return res, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweepLocked(now, sweepPerOp, staleSweepPerOp)

	rec := s.lookupLocked(h, r.Key, now)
	if rec == nil {
		s.fence++
		rec = &record{
			fence:     s.fence,
			attempt:   1,
			heapIndex: -1,
		}
		rec.setIDs(r.Key, r.Fingerprint, r.Token)
		s.leaseLocked(rec, now, r.Lease, r.Grace)
		rec.hash, rec.next = h, s.records[h]
		s.records[h] = rec
		s.count++
		heap.Push(&s.expiry, rec)
		return idempotency.ClaimResult{
			Outcome: idempotency.OutcomeAcquired,
			Fence:   rec.fence,
			Attempt: rec.attempt,
		}, nil
	}

	res := idempotency.ClaimResult{Fence: rec.fence, Attempt: rec.attempt}
	switch {
	case rec.fingerprint() != r.Fingerprint:
		res.Outcome = idempotency.OutcomeMismatch
	case rec.completed:
		res.Outcome = idempotency.OutcomeReplay
		res.Result = clone(rec.result)
		res.ExpiresIn = rec.expires.sub(now)
	case rec.token() == r.Token:
		// A repeated claim whose reply was lost: same fence, lease anew.
		s.leaseLocked(rec, now, r.Lease, r.Grace)
		res.Outcome = idempotency.OutcomeAcquired
		res.Checkpoints = cloneMap(rec.checkpoints)
	case now < rec.leaseEnd:
		res.Outcome = idempotency.OutcomeInProgress
		res.RetryAfter = rec.leaseEnd.sub(now)
	default:
		// The holder's lease ended: take over, keeping its checkpoints.
		s.fence++
		rec.setIDs(rec.key(), rec.fingerprint(), r.Token)
		rec.fence = s.fence
		rec.attempt++
		s.leaseLocked(rec, now, r.Lease, r.Grace)
		rec.notify()
		res = idempotency.ClaimResult{
			Outcome:     idempotency.OutcomeAcquired,
			Fence:       rec.fence,
			Attempt:     rec.attempt,
			Checkpoints: cloneMap(rec.checkpoints),
		}
		if res.Checkpoints == nil {
			res.Checkpoints = map[string][]byte{}
		}
	}
	return res, nil
}

// replay answers a claim of a live COMPLETED record with the same
// fingerprint under the read lock, so that replays run side by side: such
// a record does not change until it expires or is purged, which take the
// write lock. Anything else is for Claim to decide under the write lock.
// Replays skip the sweep: they create no record, so the sweeps of the
// operations that do still outpace expiry.
func (s *Store) replay(h uint64, r idempotency.ClaimRequest) (idempotency.ClaimResult, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rec := s.getLocked(h, r.Key)
	if rec == nil || !rec.completed || rec.fingerprint() != r.Fingerprint {
		return idempotency.ClaimResult{}, false
	}
	now := s.clock()
	if now >= rec.expires {
		return idempotency.ClaimResult{}, false
	}
	return idempotency.ClaimResult{
		Outcome:   idempotency.OutcomeReplay,
		Fence:     rec.fence,
		Attempt:   rec.attempt,
		Result:    clone(rec.result),
		ExpiresIn: rec.expires.sub(now),
	}, true
}

// Renew extends the lease of the STARTED record held under token to lease
// from now, as [idempotency.Store] documents.
func (s *Store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return invalid("lease %v is not positive", lease)
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweepLocked(now, sweepPerOp, staleSweepPerOp)
	rec, err := s.heldLocked(h, key, token, now)
	if err != nil {
		return err
	}
	s.leaseLocked(rec, now, lease, rec.grace)
	return nil
}

// Checkpoint stores a copy of value under name in the STARTED record held
// under token, as [idempotency.Store] documents.
func (s *Store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.checkSize("checkpoint", value); err != nil {
		return err
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweepLocked(now, sweepPerOp, staleSweepPerOp)
	rec, err := s.heldLocked(h, key, token, now)
	if err != nil {
		return err
	}
	if rec.checkpoints == nil {
		rec.checkpoints = make(map[string][]byte)
	}
	rec.checkpoints[name] = clone(value)
	return nil
}

// Complete moves the STARTED record held under token to COMPLETED with a
// copy of result, kept for retention from now, as [idempotency.Store]
// documents.
func (s *Store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return invalid("retention %v is not positive", retention)
	}
	if err := s.checkSize("result", result); err != nil {
		return err
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweepLocked(now, sweepPerOp, staleSweepPerOp)
	rec := s.lookupLocked(h, key, now)
	switch {
	case rec == nil || rec.token() != token:
		return lost(key)
	case rec.completed:
		return nil // a repeated Complete that already landed
	}
	rec.completed = true
	rec.result = clone(result)
	rec.checkpoints = nil
	rec.leaseEnd = 0
	rec.expires = now.add(retention)
	if s.done.fits(rec.expires) {
		heap.Remove(&s.expiry, int(rec.heapIndex))
		s.done.push(rec)
	} else {
		heap.Fix(&s.expiry, int(rec.heapIndex))
	}
	rec.notify()
	return nil
}

// Release deletes the STARTED record held under token, as
// [idempotency.Store] documents.
func (s *Store) Release(ctx context.Context, key string, token idempotency.Token) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweepLocked(now, sweepPerOp, staleSweepPerOp)
	rec := s.lookupLocked(h, key, now)
	switch {
	case rec == nil:
		return nil
	case rec.token() != token || rec.completed:
		return lost(key)
	}
	s.deleteLocked(rec)
	return nil
}

// Sweep deletes up to limit expired records (limit <= 0: all of them) and
// reports how many it deleted. Calling it is optional: every operation
// already deletes a few expired records, and expired records are treated
// as absent whether or not they were deleted.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweepLocked(s.clock(), limit, 0), nil
}

// Watch blocks until the record under key may have changed: it completes,
// is released, is taken over or expires, or its lease ends. It returns nil
// at once when the key holds no STARTED record (there is nothing to wait
// for: a claim now decides), and ctx's error when ctx is done first.
//
// The end of a lease is awaited with a timer on the real clock, for the
// time left as the store's clock judges it; with a manual clock that
// timer gives at worst a spurious wake-up, which the contract allows.
func (s *Store) Watch(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h := s.hash(key)
	s.mu.Lock()
	now := s.clock()
	rec := s.lookupLocked(h, key, now)
	if rec == nil || rec.completed {
		s.mu.Unlock()
		return nil
	}
	left := rec.leaseEnd.sub(now)
	if left <= 0 {
		s.mu.Unlock()
		return nil // the lease has ended: the waiter may take over
	}
	if rec.changed == nil {
		rec.changed = make(chan struct{})
	}
	changed := rec.changed
	s.mu.Unlock()

	timer := time.NewTimer(left)
	defer timer.Stop()
	select {
	case <-changed:
		return nil
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Inspect returns the live record under key, as [idempotency.Inspector]
// documents.
func (s *Store) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.RecordInfo{}, err
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	rec := s.lookupLocked(h, key, now)
	if rec == nil {
		return idempotency.RecordInfo{}, fmt.Errorf("%w: memory: %s", idempotency.ErrNotFound, truncate(key))
	}
	return rec.info(now), nil
}

// Purge deletes the record under key, as [idempotency.Inspector]
// documents; the store-wide fence counter makes the next claim's fence
// greater.
func (s *Store) Purge(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec := s.lookupLocked(s.hash(key), key, s.clock()); rec != nil {
		s.deleteLocked(rec)
	}
	return nil
}

// Stuck lists the STARTED records whose lease has ended, in key order, as
// [idempotency.Inspector] documents; the cursor is the last key listed.
// It looks at every record, so it suits the store's sizes, not millions.
func (s *Store) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		return nil, "", invalid("limit %d is not positive", limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var stuck []*record
	for _, rec := range s.expiry { // every STARTED record
		if rec.key() > cursor && !rec.completed && now >= rec.leaseEnd && now < rec.expires {
			stuck = append(stuck, rec)
		}
	}
	slices.SortFunc(stuck, func(a, b *record) int { return strings.Compare(a.key(), b.key()) })
	next := ""
	if len(stuck) > limit {
		stuck = stuck[:limit]
		next = stuck[limit-1].key()
	}
	infos := make([]idempotency.RecordInfo, len(stuck))
	for i, rec := range stuck {
		infos[i] = rec.info(now)
	}
	return infos, next, nil
}

// info describes rec at now, with copies of its values.
func (rec *record) info(now instant) idempotency.RecordInfo {
	info := idempotency.RecordInfo{
		Key:         rec.key(),
		State:       rec.stateOf(),
		Fingerprint: rec.fingerprint(),
		Fence:       rec.fence,
		Attempt:     rec.attempt,
		ExpiresIn:   rec.expires.sub(now),
		Result:      clone(rec.result),
		ResultSize:  len(rec.result),
		Checkpoints: cloneMap(rec.checkpoints),
	}
	if !rec.completed {
		info.LeaseLeft = max(rec.leaseEnd.sub(now), 0)
	}
	return info
}

// Len reports how many records the store holds, counting expired records
// that no operation has deleted yet.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// hash returns the hash of key by which records holds its record.
func (s *Store) hash(key string) uint64 {
	if s.hashKey != nil {
		return s.hashKey(key)
	}
	return maphash.String(s.seed, key)
}

// getLocked returns the record under key, live or expired, or nil; h is
// the key's hash. Called with mu held, for reading at least.
func (s *Store) getLocked(h uint64, key string) *record {
	rec := s.records[h]
	for rec != nil && rec.key() != key {
		rec = rec.next
	}
	return rec
}

// lookupLocked returns the live record under key, or nil when there is
// none; h is the key's hash. An expired record found on the way is
// deleted.
func (s *Store) lookupLocked(h uint64, key string, now instant) *record {
	rec := s.getLocked(h, key)
	if rec == nil {
		return nil
	}
	if now >= rec.expires {
		s.deleteLocked(rec)
		return nil
	}
	return rec
}

// heldLocked returns the live STARTED record under key held under token,
// or an error wrapping ErrLeaseLost.
func (s *Store) heldLocked(h uint64, key string, token idempotency.Token, now instant) (*record, error) {
	rec := s.lookupLocked(h, key, now)
	if rec == nil || rec.token() != token || rec.completed {
		return nil, lost(key)
	}
	return rec, nil
}

// leaseLocked sets rec's lease to end lease after now and its expiry grace
// after that.
func (s *Store) leaseLocked(rec *record, now instant, lease, grace time.Duration) {
	rec.leaseEnd = now.add(lease)
	rec.grace = grace
	rec.expires = rec.leaseEnd.add(grace)
	if rec.heapIndex >= 0 {
		heap.Fix(&s.expiry, int(rec.heapIndex))
	}
}

func (s *Store) deleteLocked(rec *record) {
	if first := s.records[rec.hash]; first == rec {
		if rec.next == nil {
			delete(s.records, rec.hash)
		} else {
			s.records[rec.hash] = rec.next
		}
	} else {
		for p := first; p != nil; p = p.next {
			if p.next == rec {
				p.next = rec.next
				break
			}
		}
	}
	rec.next = nil
	if rec.heapIndex >= 0 {
		heap.Remove(&s.expiry, int(rec.heapIndex))
	} // else its entry in done is dropped when it comes up
	rec.deleted = true
	s.count--
	rec.notify()
}

// sweepLocked deletes up to limit expired records (limit <= 0: all), the
// soonest expired first. It drops the entries of deleted records it finds
// on the way in done, up to stale of them (stale <= 0: all).
func (s *Store) sweepLocked(now instant, limit, stale int) int {
	n, dropped := 0, 0
	for limit <= 0 || n < limit {
		var rec *record
		switch first, ok := s.done.first(); {
		case ok && (len(s.expiry) == 0 || first.at <= s.expiry[0].expires):
			if now < first.at {
				return n
			}
			s.done.pop()
			if first.rec.deleted {
				if dropped++; stale > 0 && dropped >= stale {
					return n
				}
				continue
			}
			rec = first.rec
		case len(s.expiry) > 0 && now >= s.expiry[0].expires:
			rec = s.expiry[0]
		default:
			return n
		}
		s.deleteLocked(rec)
		n++
	}
	return n
}

// fifo is a queue of records, which done keeps in the order they expire:
// a list of chunks, so that it grows without copying and gives memory
// back as its head moves on. Each entry holds its record's expiry, so
// that the queue is read without reading a record.
type fifo struct {
	head, tail *fifoChunk
	next       int // head.entries[next] is the first entry
	len        int
}

type fifoChunk struct {
	entries [256]fifoEntry
	n       int // entries used
	next    *fifoChunk
}

type fifoEntry struct {
	at  instant // rec.expires, which does not change once completed
	rec *record
}

// fits reports whether a record expiring at can join the end of the queue
// without breaking its order.
func (q *fifo) fits(at instant) bool {
	return q.len == 0 || q.tail.entries[q.tail.n-1].at <= at
}

func (q *fifo) push(rec *record) {
	if q.tail == nil || q.tail.n == len(q.tail.entries) {
		c := new(fifoChunk)
		if q.tail == nil {
			q.head, q.next = c, 0
		} else {
			q.tail.next = c
		}
		q.tail = c
	}
	q.tail.entries[q.tail.n] = fifoEntry{rec.expires, rec}
	q.tail.n++
	q.len++
}

// first returns the entry at the head, if any.
func (q *fifo) first() (fifoEntry, bool) {
	if q.len == 0 {
		return fifoEntry{}, false
	}
	return q.head.entries[q.next], true
}

// pop removes the head entry; the queue must not be empty.
func (q *fifo) pop() {
	q.head.entries[q.next] = fifoEntry{}
	q.next++
	q.len--
	switch {
	case q.len == 0: // head is tail: use it again from its start
		q.head.n, q.next = 0, 0
	case q.next == len(q.head.entries):
		q.head, q.next = q.head.next, 0
	}
}

func (s *Store) checkSize(what string, b []byte) error {
	if len(b) > s.maxValue {
		return fmt.Errorf("%w: memory: %s of %d bytes exceeds the limit of %d", idempotency.ErrTooLarge, what, len(b), s.maxValue)
	}
	return nil
}

// notify wakes the record's watchers.
func (rec *record) notify() {
	if rec.changed != nil {
		close(rec.changed)
		rec.changed = nil
	}
}

func lost(key string) error {
	return fmt.Errorf("%w: memory: key %q", idempotency.ErrLeaseLost, truncate(key))
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: memory: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
}

func truncate(key string) string {
	if len(key) > 64 {
		return key[:64] + "..."
	}
	return key
}

// clone copies b, keeping nil as nil and empty as empty.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

func cloneMap(m map[string][]byte) map[string][]byte {
	if m == nil {
		return nil
	}
	c := maps.Clone(m)
	for k, v := range c {
		c[k] = clone(v)
	}
	return c
}

// expiryHeap orders records by expiry, soonest first.
type expiryHeap []*record

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex = int32(i)
	h[j].heapIndex = int32(j)
}

func (h *expiryHeap) Push(x any) {
	rec := x.(*record)
	rec.heapIndex = int32(len(*h))
	*h = append(*h, rec)
}

func (h *expiryHeap) Pop() any {
	old := *h
	n := len(old)
	rec := old[n-1]
	old[n-1] = nil
	rec.heapIndex = -1
	*h = old[:n-1]
	return rec
}
