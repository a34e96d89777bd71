package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency/internal/typednil"
)

// Store is the contract a storage backend implements. It works on bytes and
// opaque strings; encoding, key scoping, heartbeats and error policy live in
// [Do] above it.
//
// A record lives under a storage key and is in one of two states, STARTED
// or COMPLETED (see [State]). Every implementation must keep these rules,
// which the conformancetest package checks:
//
//  1. One atomic operation decides a claim. Never read, then write.
//  2. Every write made under a lease (Renew, Checkpoint, Complete, Release)
//     is conditional on the token, atomically. A holder whose lease was
//     taken over gets [ErrLeaseLost] and changes nothing.
//  3. Lease and retention deadlines are judged by the backend's clock where
//     it has one; a store without one takes an injectable clock. Never
//     compare a deadline with the client's wall clock when the server can
//     decide.
//  4. Every operation is safe to repeat with the same token: a Claim whose
//     reply was lost returns Acquired again for that token; a Complete that
//     already landed succeeds; releasing an absent record succeeds. [Do]
//     relies on this to retry after an ambiguous error without ever running
//     the effect twice.
//  5. An error that may have been applied is reported as an error, never as
//     a definite outcome such as "not claimed".
//  6. Expired records disappear on their own (TTL) or through [Sweeper];
//     correctness never depends on when deletion runs: an expired record
//     is treated as absent by every operation.
//  7. A canceled context changes nothing that was not already committed,
//     and the context's error is returned (wrapped or not, so that
//     errors.Is finds it).
//  8. Values are copied both ways. The store keeps no reference to a slice
//     it is given (a result, a checkpoint value): the caller may change or
//     reuse it once the call returns. The Result and Checkpoints of a
//     ClaimResult, the map and every value in it, belong to the caller.
//
// Fences strictly increase for a storage key across takeovers and across
// deletion and re-creation of its record, so a fence seen by an old holder
// is always smaller than any fence handed out after it.
//
// The end of a lease does not take the record from its holder; only a
// takeover or the record's expiry does. Until then the holder's Claim is a
// repeat (same fence), and its Renew, Checkpoint, Complete and Release
// succeed, as they would before the lease ended.
//
// Native errors (a driver's, a network's) are wrapped with %w so callers can
// reach them with errors.As. The suite checks rules 3 and 5 only in part,
// with an injectable clock and contexts that end during calls: a server's
// clock, a connection cut after a write and the wrapping of native errors
// are for an adapter's own tests.
type Store interface {
	// Claim atomically decides what a request for r.Key may do, following
	// this table (the fingerprint is compared byte for byte):
	//
	//	record          fingerprint  lease    outcome
	//	none/expired    -            -        OutcomeAcquired: new record, new fence
	//	any             different    -        OutcomeMismatch
	//	COMPLETED       same         -        OutcomeReplay with the stored result
	//	STARTED         same         live     OutcomeInProgress with the time left
	//	STARTED         same         expired  OutcomeAcquired by takeover: token
	//	                                      r.Token, a greater fence, Attempt+1,
	//	                                      the checkpoints handed over
	//
	// A STARTED record already held under r.Token (a repeated Claim whose
	// reply was lost) returns OutcomeAcquired with the same fence, attempt
	// and checkpoints, whether or not its lease has ended. A Claim under the
	// token of an expired record finds no record and acquires afresh.
	//
	// An acquired record's lease ends r.Lease after the store's now; the
	// record itself is kept for r.Grace past the end of its lease (so that a
	// takeover finds its checkpoints) and then expires. A repeated Claim
	// sets both anew, as a takeover does: r.Lease from now, then r.Grace,
	// whatever the earlier Claim asked for.
	Claim(ctx context.Context, r ClaimRequest) (ClaimResult, error)

	// Renew sets the lease of the STARTED record held under token to end
	// lease after the store's now, sooner or later than before, and its
	// retention to lease plus the grace of the Claim that last acquired it.
	// It returns ErrLeaseLost when the record is absent, expired, COMPLETED,
	// or held under another token. A lease that ended but was not taken over
	// is renewed like a live one.
	Renew(ctx context.Context, key string, token Token, lease time.Duration) error

	// Checkpoint stores value under name in the STARTED record held under
	// token, replacing any earlier value of that name and keeping the other
	// names. It returns ErrLeaseLost as Renew does, and ErrTooLarge when the
	// store cannot keep the value. It does not change the lease.
	Checkpoint(ctx context.Context, key string, token Token, name string, value []byte) error

	// Complete moves the STARTED record held under token to COMPLETED with
	// result, drops its checkpoints (no later Claim returns them, not even
	// after the record expires), and keeps it for retention from the store's
	// now. Completing again a record already COMPLETED under the same token
	// succeeds and changes nothing, neither the result nor the retention. It
	// returns ErrLeaseLost when the record is absent, expired or held under
	// another token, and ErrTooLarge, having written nothing, when result is
	// larger than the store can keep.
	Complete(ctx context.Context, key string, token Token, result []byte, retention time.Duration) error

	// Release deletes the STARTED record held under token, so that the next
	// Claim acquires it afresh (with a greater fence). Releasing an absent
	// or expired record succeeds, whoever held it and in whatever state. It
	// returns ErrLeaseLost when the record is held under another token or is
	// COMPLETED.
	Release(ctx context.Context, key string, token Token) error
}

// Sweeper is the part of a store whose expired records are not removed by
// the backend itself (or not promptly); see [Capabilities]. Sweep deletes expired records, at
// most limit of them (limit <= 0 means no limit), and reports how many it
// deleted. It may delete fewer, working in batches or skipping records that
// concurrent calls hold, but it makes progress: a call that finds expired
// records nobody holds deletes at least one, so calling it until it returns
// 0 deletes every record that expired before the first call. It never
// deletes a live record: a STARTED one within its lease plus grace, even
// after a Renew or a repeated Claim moved that deadline, or a COMPLETED one
// within its retention. It is safe to run from several processes at once.
// Correctness never depends on sweeping: it only bounds storage.
type Sweeper interface {
	Sweep(ctx context.Context, limit int) (int, error)
}

// Watcher is the part of a store that can push a change of a record
// (completion, release, deletion) instead of being polled; see
// [Capabilities]. Watch blocks
// until the record under key may have changed since the call began, or
// until ctx is done, in which case it returns the context's error. It must
// not miss a Complete or Release of the record made after it began; other
// changes (a takeover, the end of a lease, expiry, a sweep) it may miss,
// since callers also poll at the lease's retry-after hint. A spurious
// wake-up is allowed.
type Watcher interface {
	Watch(ctx context.Context, key string) error
}

// Inspector is the part of a store that lets operators and the reconciler
// see and fix records (see [Runner.Inspect], [Runner.Purge], [Runner.Stuck]
// and [Reconcile]); see [Capabilities]. It reads and deletes; it never claims, so it cannot
// make two holders.
type Inspector interface {
	// Inspect returns the record under key, with its result and its
	// checkpoints. It returns [ErrNotFound] when the record is absent or
	// expired.
	Inspect(ctx context.Context, key string) (RecordInfo, error)

	// Purge deletes the record under key, whatever its state. The next
	// Claim acquires the key afresh, with a greater fence, and a holder of
	// the purged record gets ErrLeaseLost from its next Renew, Checkpoint,
	// Complete or Release. Purging an absent or expired record succeeds.
	Purge(ctx context.Context, key string) error

	// Stuck lists the STARTED records whose lease has ended and which have
	// not expired: their holder stopped renewing, and nobody took them
	// over. It returns at most limit of them (limit is positive), starting
	// after cursor ("" for the first page), and the cursor of the next
	// page, "" after the last. Every record that is stuck during the whole
	// listing is listed once; one that changes during it may be listed or
	// not.
	Stuck(ctx context.Context, cursor string, limit int) ([]RecordInfo, string, error)
}

// RecordInfo describes a record, for [Inspector].
type RecordInfo struct {
	// Key is the storage key.
	Key string
	// State is StateStarted or StateCompleted.
	State State
	// Fingerprint is the fingerprint of the request that created the record.
	Fingerprint Fingerprint
	// Fence and Attempt are those of the record's last acquisition.
	Fence   int64
	Attempt int
	// LeaseLeft is, for a STARTED record, the time left on its holder's
	// lease by the store's clock; zero once the lease has ended.
	LeaseLeft time.Duration
	// ExpiresIn is the time left before the record expires, by the store's
	// clock.
	ExpiresIn time.Duration
	// Result is the stored result of a COMPLETED record.
	Result []byte
	// ResultSize is the length of the stored result. Stores may leave it
	// zero; [Runner.Inspect] sets it, and leaves Result out unless asked.
	ResultSize int
	// Checkpoints are the recovery points of a STARTED record.
	Checkpoints map[string][]byte
}

// Token identifies one holder's lease on a record. [Do] generates 128
// random bits for every call (rendered as 32 lowercase hex digits); stores
// treat it as an opaque string and compare it exactly.
type Token string

// ClaimRequest is the input of [Store.Claim].
type ClaimRequest struct {
	// Key is the storage key: scope and client key, already encoded without
	// ambiguity by the caller. Stores must accept any valid UTF-8 string
	// without NUL of up to [MaxStorageKeyLen] bytes.
	Key string
	// Fingerprint identifies the request; only equality matters.
	Fingerprint Fingerprint
	// Token is the new holder's token.
	Token Token
	// Lease is how long the lease lasts from the store's now. Positive.
	Lease time.Duration
	// Grace is how long a STARTED record is kept after its lease ends, so a
	// takeover can find its checkpoints. Not negative.
	Grace time.Duration
}

// ClaimResult is the output of [Store.Claim].
type ClaimResult struct {
	// Outcome is what the store decided.
	Outcome Outcome
	// Fence is the record's fence: for OutcomeAcquired the new holder's
	// fence, for the other outcomes the current one, when known.
	Fence int64
	// Attempt counts the acquisitions of this record: 1 for a fresh claim,
	// one more for every takeover.
	Attempt int
	// RetryAfter is, for OutcomeInProgress, the time left on the current
	// holder's lease as judged by the store.
	RetryAfter time.Duration
	// Result is the stored result, for OutcomeReplay.
	Result []byte
	// ExpiresIn is, for OutcomeReplay, the time left before the record
	// expires, by the store's clock, when the store knows it without
	// another round trip; zero when it does not say. It is optional: [Do]
	// then neither caches the replay ([WithReplayCache]) nor tells when
	// the record expires (Result.ExpiresAt).
	ExpiresIn time.Duration
	// Checkpoints are the recovery points of the record, for
	// OutcomeAcquired by takeover or by a repeated claim. Empty otherwise.
	Checkpoints map[string][]byte
}

// MaxStorageKeyLen is the longest storage key [Do] hands to a store. It
// bounds the client key (see [WithMaxKeyLength]) plus the encoded scope.
const MaxStorageKeyLen = 1024

// Capabilities is what a store can do beyond the [Store] contract, stated
// in one place: the runner, wrappers of a store (otelidem's instrumented
// store, a user's) and the conformancetest suite all read it through
// [CapabilitiesOf]. A part a store lacks is nil; what needs it answers an
// error matching errors.ErrUnsupported ([Runner.Inspect] without an
// Inspector), or does without it ([Do] polls without a Watcher).
//
// A store states its capabilities with a method
//
//	Capabilities() idempotency.Capabilities
//
// or, more simply, by implementing the part interfaces itself: a store
// without the method has the parts it implements ([Watcher], [Inspector],
// [Sweeper], [Transactional]) and no limits. A wrapper that instruments
// every call implements the method, returning the wrapped store's parts
// wrapped (or nil), so it keeps exactly the capabilities of what it wraps
// without a type per combination; a wrapper that only says what it wraps
// (Unwrap) keeps them as they are.
type Capabilities struct {
	// Watcher pushes changes of a record, waking a duplicate that waits
	// ([WithWait]) without polling.
	Watcher Watcher
	// Inspector lets operators see, purge and list stuck records, and
	// [Reconcile] resolve them.
	Inspector Inspector
	// Sweeper deletes expired records the backend does not delete itself.
	Sweeper Sweeper
	// Transactional runs the store's calls inside a transaction of the
	// caller's, together with fn's writes.
	Transactional Transactional
	// Batcher claims and finishes many records in one round trip
	// ([DoBatch]); without it, a batch makes one call per item.
	Batcher Batcher
	// Limits are what the store can honour; [New] refuses a configuration
	// the store would break.
	Limits Limits
}

// Limits describes what a store can honour. The zero value means no limits.
type Limits struct {
	// MinLease is the shortest lease the store keeps faithfully. [New]
	// refuses a shorter [WithLease], even with [WithUnsafeShortDurations].
	MinLease time.Duration
	// Resolution is the granularity of the store's leases and deadlines:
	// a store whose lease TTLs are whole seconds (etcd) declares a second,
	// and may end a lease up to that much later than asked. Zero means a
	// millisecond or finer.
	Resolution time.Duration
	// MaxValueSize is the largest result the store keeps; Complete refuses
	// a larger one with [ErrTooLarge]. Zero means at least 1 MiB. [Do]
	// records the marker of [ErrResultNotStored] at once for a larger
	// result, without sending it first.
	MaxValueSize int
	// MaxBatch is the most items the store's Batcher takes in one call
	// (a statement's parameter limit, a transaction's operation limit);
	// [DoBatch] splits larger batches. Zero means no limit.
	MaxBatch int
}

// CapabilitiesOf returns what s can do: the result of its method
// Capabilities if it has one; else, for a wrapper (a store with a method
// Unwrap() Store, see [StoreAs]), what the wrapped store can do; else the
// parts s implements itself. A declared part that s implements too is s's
// own: so a type that embeds a store and overrides one of its methods
// (Inspect, to count or log the calls) has its override used.
func CapabilitiesOf(s Store) Capabilities {
	var c Capabilities
	switch d := s.(type) {
	case interface{ Capabilities() Capabilities }:
		c = d.Capabilities()
	case interface{ Unwrap() Store }:
		if inner := d.Unwrap(); !isNil(inner) && inner != s {
			c = CapabilitiesOf(inner)
		}
	default:
		c.Watcher, _ = s.(Watcher)
		c.Inspector, _ = s.(Inspector)
		c.Sweeper, _ = s.(Sweeper)
		c.Transactional, _ = s.(Transactional)
		c.Batcher, _ = s.(Batcher)
		return c
	}
	if w, ok := s.(Watcher); ok && c.Watcher != nil {
		c.Watcher = w
	}
	if in, ok := s.(Inspector); ok && c.Inspector != nil {
		c.Inspector = in
	}
	if sw, ok := s.(Sweeper); ok && c.Sweeper != nil {
		c.Sweeper = sw
	}
	if tx, ok := s.(Transactional); ok && c.Transactional != nil {
		c.Transactional = tx
	}
	if b, ok := s.(Batcher); ok && c.Batcher != nil {
		c.Batcher = b
	}
	return c
}

// Batcher is the part of a store that claims, and then finishes, many
// independent records in one round trip each, for [DoBatch]. Each item
// obeys the rules of [Store] as its own call would: ClaimBatch decides each
// claim as Claim does, and FinishBatch completes or releases each record
// as Complete or Release does, conditional on the item's token. Items are
// independent: one's failure or refusal never changes another's outcome,
// and a repeat of a batch with the same tokens (after an ambiguous error)
// is safe item by item (rule 4). The keys of one batch are distinct
// ([DoBatch] sends each storage key once). A batch larger than the backend
// takes in one operation is split by the store, or declared in [Limits]
// MaxBatch.
type Batcher interface {
	// ClaimBatch claims each request. It returns one result and one error
	// per request, in order; errs[i] is what Claim would have returned for
	// reqs[i] (an error for the whole batch, such as a lost connection,
	// is the error of every item it may have applied to).
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) (results []ClaimResult, errs []error)
	// FinishBatch completes (Release false) or releases (Release true)
	// each record held under its item's token. It returns one error per
	// item, in order: nil, ErrLeaseLost, ErrTooLarge, or what the store's
	// Complete or Release would return.
	FinishBatch(ctx context.Context, items []Finish) []error
}

// Finish is one item of [Batcher.FinishBatch]: the completion or the
// release of the record under Key held under Token.
type Finish struct {
	Key   string
	Token Token
	// Release makes the item a Release; otherwise it is a Complete with
	// Result and Retention.
	Release   bool
	Result    []byte
	Retention time.Duration
}

// Transactional is the part of a store whose calls can run inside a
// database transaction of the caller's, together with fn's own writes (the
// PostgreSQL adapter's DoTx and TxExecutor bind a transaction to a
// context). When InTx reports true for the context a call of [Do] gets,
// the key, fn's writes and fn's result commit together or not at all, and
// Do runs the same loop with these differences, which follow from the
// transaction:
//
//   - the store's Claim holds the record locked until the transaction ends,
//     so nobody can take it over: Do renews no lease. A Claim that gives up
//     waiting for another transaction's lock answers OutcomeInProgress;
//   - a store call is sent once: a failed statement belongs to the
//     transaction, which its owner ends, and is not repeated;
//   - [Step] records no recovery point: there is no partial progress to
//     resume, as fn's writes commit with its result or not at all;
//   - before a permanent error is recorded, Discard undoes the writes fn
//     made since the claim, so that the error is stored without them;
//   - a duplicate is never waited for inside the transaction ([WithWait]):
//     Do answers [ErrInProgress] at once, since a wait would hold the
//     transaction, and its connection, for the length of another call.
//     Whoever owns the transaction may end it and try again in a new one
//     (the PostgreSQL adapter's TxExecutor does, within [Runner.Wait]).
type Transactional interface {
	// InTx reports whether the store's calls with ctx run in a
	// transaction of the caller's.
	InTx(ctx context.Context) bool
	// Discard undoes, in ctx's transaction, the writes made since the
	// claim of key under token, keeping the claim.
	Discard(ctx context.Context, key string, token Token) error
}

// StoreAs finds the first store of type S in the chain that starts at s and
// follows wrappers: a store that wraps another (instrumentation, a cache)
// says so with a method Unwrap() Store, as wrapped errors do. Adapters use
// it to reach their own store behind a wrapper, as the PostgreSQL adapter's
// transactional mode does.
func StoreAs[S Store](s Store) (S, bool) {
	for range 16 {
		if v, ok := s.(S); ok && !isNil(v) {
			return v, true
		}
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	var zero S
	return zero, false
}

// ValidateClaim returns an error wrapping [ErrInvalidArgument], prefixed
// with the adapter's name (its package name), when r is not a request [Do]
// could send: an empty key or token, a non-positive lease or a negative
// grace. Adapters call it first in Claim, so that every store refuses the
// same requests in the same words.
func ValidateClaim(adapter string, r ClaimRequest) error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: %s: claim: empty key", ErrInvalidArgument, adapter)
	case r.Token == "":
		return fmt.Errorf("%w: %s: claim: empty token", ErrInvalidArgument, adapter)
	case r.Lease <= 0:
		return fmt.Errorf("%w: %s: claim: lease must be positive, got %v", ErrInvalidArgument, adapter, r.Lease)
	case r.Grace < 0:
		return fmt.Errorf("%w: %s: claim: grace must not be negative, got %v", ErrInvalidArgument, adapter, r.Grace)
	}
	return nil
}

// isNil reports whether v is nil or holds a nil pointer: a typed nil such
// as (*postgres.Store)(nil), whose methods would panic on first use.
func isNil(v any) bool { return typednil.Is(v) }
