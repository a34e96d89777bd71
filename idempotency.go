// Package idempotency gives a service exactly-once effects over
// at-least-once networks. A double click, a client timeout followed by a
// retry, a proxy that resends, a broker that redelivers: each request
// carries an idempotency key, and [Do] runs the effect at most once per
// key and request for the retention window, replaying the stored result
// to every retry.
//
// The state machine (STARTED → COMPLETED, with leases, fencing and
// takeover of crashed holders) is decided by a [Store]: the in-memory
// store in store/memory, the PostgreSQL, Redis, etcd and MongoDB adapters
// (each in its own module, so that this package imports no database
// driver), or an adapter of your own proven with the conformancetest
// package. Beyond [Do]: the inbox package for consumers, [Reconcile] for
// records a crashed holder left, and [Runner.Inspect] for operators.
//
// What is guaranteed, and what is not: at most one live lease per key; a
// holder whose lease was taken over can never complete, checkpoint or
// release; a completed result is replayed to every retry within retention.
// Exactly-once execution is impossible when a holder can outlive its lease
// (a long GC pause, a partition): for that case fn receives a fence
// ([FromContext]) that strictly increases on every takeover, so its own
// writes can refuse a stale holder, and recovery points ([Step]) so a
// taker-over skips the steps that already ran.
package idempotency

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Runner runs functions once per idempotency key against a [Store]. It is
// safe for concurrent use; make one per store and configuration.
type Runner struct {
	store      Store
	watcher    Watcher // store as a Watcher, or nil
	cfg        config
	heartbeats heartbeats
}

// New returns a Runner on store. It returns an error wrapping
// [ErrInvalidArgument], naming the option and the value it got, for a nil
// store (also a typed nil such as a nil *postgres.Store) or for any
// configuration under which fn could run twice for one request because
// of the configuration alone: a lease, retention or store timeout below
// its floor ([MinLease], [MinRetention], [MinStoreTimeout]) or below the
// store's own minimum ([LimitedStore]), a retention shorter than the
// lease, or a store timeout that does not fit in a third of the lease.
func New(store Store, opts ...Option) (*Runner, error) {
	if isNil(store) {
		return nil, invalidArg("nil store (%T)", store)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if isNil(o) {
			return nil, invalidArg("nil option")
		}
		o.apply(&cfg)
	}
	var limits Limits
	if ls, ok := store.(LimitedStore); ok {
		limits = ls.Limits()
	}
	if err := cfg.validate(limits); err != nil {
		return nil, err
	}
	r := &Runner{store: store, cfg: cfg}
	r.watcher, _ = store.(Watcher)
	return r, nil
}

// Store returns the runner's store.
func (r *Runner) Store() Store { return r.store }

// Lease returns the configured lease (see [WithLease]).
func (r *Runner) Lease() time.Duration { return r.cfg.lease }

// Retention returns the configured retention (see [WithRetention]).
func (r *Runner) Retention() time.Duration { return r.cfg.retention }

// StoreTimeout returns the bound on each store call attempt (see
// [WithStoreTimeout]), for adapters that run their own execution mode.
func (r *Runner) StoreTimeout() time.Duration { return r.cfg.storeTimeout }

// Observe hands e to the runner's observer, if it has one. It is exported
// for adapters that run their own execution mode, so their outcomes reach
// the same logs and metrics as [Do]'s.
func (r *Runner) Observe(ctx context.Context, e Event) { r.observe(ctx, e) }

// Request names one request: the scope it belongs to, the client's key and
// the fingerprint of what was asked.
type Request struct {
	// Scope parts (tenant, authenticated actor, operation or route) are
	// part of the storage key, encoded without ambiguity, so a key from one
	// scope never reaches another's record. Each part must be non-empty,
	// valid UTF-8 without control characters ([ErrInvalidKey] otherwise).
	// No parts at all means one key space for every caller.
	Scope []string
	// Key is the client's idempotency key: non-empty, at most the
	// configured length (255 bytes by default), valid UTF-8 without control
	// characters.
	Key string
	// Fingerprint identifies the request (see [FingerprintJSON]); a reused
	// key with another fingerprint gets [ErrMismatch]. An empty fingerprint
	// only matches an empty one.
	Fingerprint Fingerprint
}

// Result is what [Do] returns.
type Result[T any] struct {
	// Value is fn's result, from this run or from the store.
	Value T
	// Replayed reports that the result (or error) comes from an earlier run
	// and fn did not run in this call.
	Replayed bool
	// Fence is the record's fence: the one fn ran under, or for a replay
	// the one of the run that completed it.
	Fence int64
	// Attempt is how many times the record was acquired: 1 unless it was
	// taken over.
	Attempt int
}

// StorageKey validates req's key and scope and returns the storage key
// handed to the store. It returns an error wrapping [ErrInvalidKey] or
// [ErrInvalidArgument] for a request [Do] would refuse.
func (r *Runner) StorageKey(req Request) (string, error) {
	if len(req.Fingerprint) > MaxFingerprintLen {
		return "", invalidArg("fingerprint longer than %d bytes", MaxFingerprintLen)
	}
	return storageKey(req.Scope, req.Key, r.cfg.maxKeyLen)
}

// Do runs fn at most once for req's scope, key and fingerprint within the
// retention window, and returns its result to every retry.
//
//   - The first call claims the key and runs fn under a lease that is
//     renewed in the background; a returned value is stored and replayed
//     (Result.Replayed) to every later call with the same request.
//   - A call while another holds a live lease gets an [*InProgressError]
//     (matching [ErrInProgress]) with a retry-after hint, or waits for the
//     result when [WithWait] is set.
//   - A call with the same key and another fingerprint gets [ErrMismatch].
//   - An error from fn is transient by default: the key is released and a
//     retry runs fn again. An error marked [Permanent] (or classified so
//     by [WithErrorPolicy]) is stored and replayed as a [*StoredError].
//   - A panic in fn releases the key and panics again.
//   - If the lease is lost while fn runs (a heartbeat finds it taken over
//     or cannot renew it before it ends), fn's context is canceled with
//     cause [ErrLeaseLost] and Do's error matches ErrLeaseLost.
//   - After fn has succeeded it is never run again for this request: if the
//     result cannot be stored, a marker is, and retries get
//     [ErrResultNotStored].
//   - A stored result that cannot be decoded (written by another version
//     or codec, or damaged) gives an error matching [ErrCorrupt], with
//     Result.Replayed set; fn does not run.
//   - A store failure is a [*StoreError]; its Ran field says whether fn
//     had run, so the caller never takes "not run" for granted.
//
// Invalid input (a nil runner or fn, an invalid key) gives an error
// wrapping [ErrInvalidArgument] or [ErrInvalidKey] before the store is
// touched.
func Do[T any](ctx context.Context, r *Runner, req Request, fn func(ctx context.Context) (T, error)) (Result[T], error) {
	if r != nil && r.cfg.calls != nil && ctx != nil && fn != nil {
		return doCall(ctx, r, req, fn) // observer.go
	}
	return do(ctx, r, req, fn)
}

func do[T any](ctx context.Context, r *Runner, req Request, fn func(ctx context.Context) (T, error)) (Result[T], error) {
	var res Result[T]
	if r == nil {
		return res, invalidArg("nil runner")
	}
	if fn == nil {
		return res, invalidArg("nil fn")
	}
	if ctx == nil {
		return res, invalidArg("nil context")
	}
	key, err := r.StorageKey(req)
	if err != nil {
		r.observe(ctx, Event{Kind: EventInvalidKey, Scope: req.Scope, Err: err})
		return res, err
	}
	claimReq := ClaimRequest{
		Key:         key,
		Fingerprint: req.Fingerprint,
		Token:       newToken(),
		Lease:       r.cfg.lease,
		Grace:       r.cfg.grace,
	}
	var waitUntil time.Time
	if r.cfg.wait > 0 {
		waitUntil = time.Now().Add(r.cfg.wait)
	}
	poll := 10 * time.Millisecond
	for {
		start := monoNow()
		var cr ClaimResult
		err := r.retry(ctx, func(ctx context.Context) error {
			var err error
			cr, err = r.store.Claim(ctx, claimReq)
			return err
		})
		var took time.Duration
		if r.cfg.observer != nil {
			took = start.since()
		}
		if err != nil {
			r.observe(ctx, Event{Kind: EventStoreError, Key: key, Scope: req.Scope, Duration: took, Err: err})
			return res, &StoreError{Op: "claim", Err: err}
		}
		res.Fence, res.Attempt = cr.Fence, cr.Attempt
		switch cr.Outcome {
		case OutcomeAcquired:
			r.observe(ctx, Event{Kind: EventAcquired, Key: key, Scope: req.Scope, Fence: cr.Fence, Attempt: cr.Attempt, Duration: took})
			h := &holder{parent: ctx, r: r, key: key, scope: req.Scope, clientKey: req.Key, token: claimReq.Token, fence: cr.Fence, attempt: cr.Attempt, points: cr.Checkpoints}
			return run(ctx, h, start, res, fn)
		case OutcomeReplay:
			res.Replayed = true
			res.Value, err = DecodeOutcome[T](r, cr.Result)
			r.observe(ctx, Event{Kind: EventReplayed, Key: key, Scope: req.Scope, Fence: cr.Fence, Attempt: cr.Attempt, Duration: took, Err: err})
			return res, err
		case OutcomeMismatch:
			r.observe(ctx, Event{Kind: EventMismatch, Key: key, Scope: req.Scope, Duration: took})
			return res, ErrMismatch
		case OutcomeInProgress:
			r.observe(ctx, Event{Kind: EventInProgress, Key: key, Scope: req.Scope, Fence: cr.Fence, Attempt: cr.Attempt, Duration: took})
			left := time.Until(waitUntil)
			if r.cfg.wait <= 0 || left <= 0 {
				return res, &InProgressError{RetryAfter: cr.RetryAfter}
			}
			if err := r.awaitChange(ctx, key, min(left, max(cr.RetryAfter, time.Millisecond)), &poll); err != nil {
				return res, err
			}
		default:
			err := fmt.Errorf("store returned invalid outcome %v", cr.Outcome)
			r.observe(ctx, Event{Kind: EventStoreError, Key: key, Scope: req.Scope, Duration: took, Err: err})
			return res, &StoreError{Op: "claim", Err: err}
		}
	}
}

// Executor runs a function at most once per request, with the semantics
// of [Do], in an execution mode of its own choosing. Integrations that
// store bytes (the HTTP middleware stores responses) take an Executor, so
// a service can plug in a mode a store adapter offers, such as running fn
// inside a database transaction that also records the key (see the
// PostgreSQL adapter's TxExecutor). A [*Runner] is the Executor of [Do].
//
// Execute must report failures as Do does: [ErrInProgress],
// [ErrMismatch], [ErrInvalidKey], [ErrResultNotStored], a [*StoredError]
// for a replayed permanent error, and a [*StoreError] when the store
// failed. Its Ran field must be true only when fn's effects may have
// happened without the result being recorded; a mode that rolls fn's
// writes back together with the key reports Ran false.
type Executor interface {
	Execute(ctx context.Context, req Request, fn func(ctx context.Context) ([]byte, error)) (Result[[]byte], error)
}

var _ Executor = (*Runner)(nil)

// Execute is [Do] for functions that return bytes: it makes a Runner an
// [Executor].
func (r *Runner) Execute(ctx context.Context, req Request, fn func(ctx context.Context) ([]byte, error)) (Result[[]byte], error) {
	return Do(ctx, r, req, fn)
}

// awaitChange waits for the record under key to change, for at most d:
// through the store's Watcher when it has one, else by polling with a
// growing interval.
func (r *Runner) awaitChange(ctx context.Context, key string, d time.Duration, poll *time.Duration) error {
	if r.watcher != nil {
		wctx, cancel := context.WithTimeout(ctx, d)
		err := r.watcher.Watch(wctx, key)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
		// A watch that failed is no reason to fail the call: fall back to
		// polling.
	}
	t := time.NewTimer(min(d, *poll))
	defer t.Stop()
	*poll = min(2**poll, time.Second)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// run executes fn as the holder of a fresh lease and records its outcome.
func run[T any](ctx context.Context, h *holder, claimed mono, res Result[T], fn func(context.Context) (T, error)) (Result[T], error) {
	r := h.r
	start := claimed
	fnCtx, cancel := context.WithCancelCause(h)
	h.cancel = cancel
	defer cancel(nil)
	h.startHeartbeat(claimed)

	// The store calls after fn must happen even when the caller's context
	// is canceled (a Complete cut short would leave the key to be taken
	// over and fn run again; a Release lets a retry run at once), but not
	// for longer than the lease could hold.
	// The context lives in the holder: one allocation fewer.
	after := func() *boundedCtx {
		h.after = boundedCtx{values: ctx, deadline: monoNow().add(r.cfg.lease)}
		return &h.after
	}

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		h.stopHeartbeat()
		if h.leaveOnPanic {
			return // the record's lease runs out; it is listed as stuck again
		}
		sctx := after()
		defer sctx.stop()
		h.release(sctx, start, errors.New("fn panicked"))
	}()
	v, fnErr := fn(fnCtx)
	panicked = false
	h.stopHeartbeat()
	if fnErr != nil && leavesRecord(fnErr) {
		// Neither complete nor release: the record stays STARTED and its
		// lease runs out (the reconciler's undecided resolver, or a
		// recovery point that cannot be decoded: a release would drop it).
		return res, fnErr
	}
	lost := errors.Is(context.Cause(fnCtx), ErrLeaseLost)

	sctx := after()
	defer sctx.stop()

	stored, keep, encErr := EncodeOutcome(r, v, fnErr)
	if !keep {
		if err := h.release(sctx, start, fnErr); errors.Is(err, ErrLeaseLost) {
			lost = true
		}
		if lost {
			return res, fmt.Errorf("%w: %w", ErrLeaseLost, fnErr)
		}
		return res, fnErr
	}
	err := h.complete(sctx, stored)
	if errors.Is(err, ErrTooLarge) && fnErr == nil {
		// The store keeps less than we allow: store the marker instead.
		encErr = err
		stored = []byte{resultNotStored}
		err = h.complete(sctx, stored)
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		if !h.wasLost() { // else the heartbeat has reported it
			r.observe(ctx, Event{Kind: EventLeaseLost, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: err})
		}
		if fnErr != nil {
			return res, fmt.Errorf("%w: %w", ErrLeaseLost, fnErr)
		}
		res.Value = v
		return res, fmt.Errorf("%w: fn ran but its result was not recorded", ErrLeaseLost)
	case err != nil:
		r.observe(ctx, Event{Kind: EventStoreError, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: err})
		res.Value = v
		return res, &StoreError{Op: "complete", Ran: true, Err: err}
	}
	if r.cfg.observer != nil {
		r.observe(ctx, Event{Kind: EventCompleted, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: encErr})
	}
	if fnErr != nil {
		return res, fnErr
	}
	res.Value = v
	return res, nil
}

// leavesRecord reports whether fn's error asks [run] to neither complete
// nor release the record. A function of its own, so that the targets of
// errors.As are allocated only when fn failed.
func leavesRecord(fnErr error) bool {
	var le *leaveError
	var cp *corruptPointError
	return errors.As(fnErr, &le) || errors.As(fnErr, &cp)
}

// EncodeOutcome turns fn's outcome into the bytes to store. keep is false
// when fnErr is transient under r's error policy: nothing is to be stored
// and the key is to be released. A success whose value cannot be encoded,
// or is larger than the configured limit, becomes a marker that replays as
// [ErrResultNotStored]; the reason is returned as err, for logs.
//
// It is exported for adapters that run their own execution mode (such as a
// transaction in the caller's database) but must store what [Do] replays.
func EncodeOutcome[T any](r *Runner, v T, fnErr error) (stored []byte, keep bool, err error) {
	if fnErr != nil {
		var forced *forcedPermanent
		if errors.Is(fnErr, errRelease) || (!errors.As(fnErr, &forced) && !r.cfg.permanent(fnErr)) {
			return nil, false, nil
		}
		msg, err := r.cfg.codec.Marshal(fnErr.Error())
		if err != nil {
			// Still a permanent error, without its message.
			return []byte{resultError}, true, fmt.Errorf("idempotency: encode error message: %w", err)
		}
		return encodeResult(resultError, msg), true, nil
	}
	if isBytes[T]() && r.rawBytes() {
		// Bytes as they are: no base64 inside JSON, a third smaller and
		// no encoding. A nil slice goes through the codec, so that it
		// replays as nil.
		if b := any(v).([]byte); b != nil {
			if len(b) > r.cfg.maxResult {
				return []byte{resultNotStored}, true, fmt.Errorf("%w: result of %d bytes, limit %d", ErrTooLarge, len(b), r.cfg.maxResult)
			}
			return encodeResult(resultBytes, b), true, nil
		}
	}
	payload, err := r.cfg.codec.Marshal(v)
	switch {
	case err != nil:
		return []byte{resultNotStored}, true, fmt.Errorf("idempotency: encode result: %w", err)
	case len(payload) > r.cfg.maxResult:
		return []byte{resultNotStored}, true, fmt.Errorf("%w: result of %d bytes, limit %d", ErrTooLarge, len(payload), r.cfg.maxResult)
	}
	return encodeResult(resultValue, payload), true, nil
}

// NotStoredMarker returns the stored form of a success whose result could
// not be kept: it replays as [ErrResultNotStored]. Adapters with their own
// execution mode store it when the store refuses a result as too large.
func NotStoredMarker() []byte { return []byte{resultNotStored} }

// isBytes reports whether T is []byte.
func isBytes[T any]() bool {
	_, ok := any((*T)(nil)).(*[]byte)
	return ok
}

// rawBytes reports whether []byte results are stored as they are rather
// than through the codec: only with the default [JSONCodec], since a
// codec of the caller's (encryption, redaction) must see every value.
func (r *Runner) rawBytes() bool {
	_, ok := r.cfg.codec.(JSONCodec)
	return ok
}

// DecodeOutcome turns stored bytes made by [EncodeOutcome] back into the
// value, or the error to replay: a [*StoredError] for a permanent error,
// [ErrResultNotStored] for the marker. It decodes what every earlier
// version stored; bytes it cannot decode (written by another codec, or
// damaged) give an error matching [ErrCorrupt]. A []byte value may share
// memory with stored.
func DecodeOutcome[T any](r *Runner, stored []byte) (T, error) {
	kind, payload, err := decodeResult(stored)
	if err == nil && kind == resultBytes && isBytes[T]() {
		return any(payload).(T), nil // without the codec's allocations
	}
	return decodeOutcome[T](r, kind, payload, err)
}

func decodeOutcome[T any](r *Runner, kind byte, payload []byte, err error) (T, error) {
	var v T
	if err != nil {
		return v, err
	}
	switch kind {
	case resultBytes:
		// Stored from a []byte, read as another type: decode what the
		// codec would have stored.
		enc, err := r.cfg.codec.Marshal(payload)
		if err == nil {
			err = r.cfg.codec.Unmarshal(enc, &v)
		}
		if err != nil {
			var zero T
			return zero, fmt.Errorf("%w: result: %w", ErrCorrupt, err)
		}
		return v, nil
	case resultValue:
		if err := r.cfg.codec.Unmarshal(payload, &v); err != nil {
			var zero T // not what the codec left half done
			return zero, fmt.Errorf("%w: result: %w", ErrCorrupt, err)
		}
		return v, nil
	case resultError:
		if len(payload) == 0 {
			return v, &StoredError{Message: "idempotency: permanent error (its message could not be stored)"}
		}
		var msg string
		if err := r.cfg.codec.Unmarshal(payload, &msg); err != nil {
			return v, fmt.Errorf("%w: stored error message: %w", ErrCorrupt, err)
		}
		return v, &StoredError{Message: msg}
	default:
		return v, ErrResultNotStored
	}
}

func isMarkedPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// maxStoreBackoff bounds the doubling backoff between store attempts.
const maxStoreBackoff = 5 * time.Second

// retry calls f until it succeeds, fails with an error that is not worth
// retrying, or runs out of attempts. Each call repeats the same store
// operation with the same token, which rule 4 of [Store] makes safe. With
// [WithStoreTimeout], each attempt has its own deadline. When ctx ends
// during a backoff, the error matches both ctx's error and the store's.
func (r *Runner) retry(ctx context.Context, f func(context.Context) error) error {
	return r.retryIn(ctx, nil, f)
}

// retryIn is retry with first, when not nil, as the storage of the first
// attempt's context: a caller that makes one store call per request (the
// holder's Complete or Release) saves an allocation. first is used once.
func (r *Runner) retryIn(ctx context.Context, first *boundedCtx, f func(context.Context) error) error {
	backoff := min(r.cfg.storeBackoff, maxStoreBackoff)
	for attempt := 1; ; attempt++ {
		err := r.attempt(ctx, first, f)
		first = nil
		if err == nil || attempt >= r.cfg.storeAttempts || !retryable(ctx, err) {
			return err
		}
		// Full jitter keeps a crowd of retries from landing together.
		d := time.Duration(rand.Int64N(int64(backoff) + 1))
		backoff = min(2*backoff, maxStoreBackoff)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ctx.Err(), err)
		case <-t.C:
		}
	}
}

func (r *Runner) attempt(ctx context.Context, storage *boundedCtx, f func(context.Context) error) error {
	if r.cfg.storeTimeout <= 0 {
		return f(ctx)
	}
	if storage == nil {
		storage = new(boundedCtx)
	}
	actx := storage.initAttempt(ctx, r.cfg.storeTimeout)
	defer actx.stop()
	return f(actx)
}

// retryable reports whether a failed store call is worth repeating: not
// when the caller's ctx is done or the store gave a definite answer. A
// deadline the caller did not set (an attempt's, a driver's) leaves the
// outcome unknown, which a repeat with the same token resolves.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrTooLarge) &&
		!errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrCorrupt) &&
		!errors.Is(err, ErrNotFound) && !errors.Is(err, context.Canceled)
}

func (r *Runner) observe(ctx context.Context, e Event) {
	if r.cfg.observer != nil {
		r.cfg.observer.Observe(ctx, e)
	}
}

// newToken returns 128 random bits as 32 hex digits. A token must not
// collide with another holder's, which math/rand/v2's generator (ChaCha8,
// seeded by the operating system) ensures as well as crypto/rand does, at
// a tenth of the cost; a token is not a secret.
func newToken() Token {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	var h [32]byte
	hex.Encode(h[:], b[:])
	return Token(h[:])
}
