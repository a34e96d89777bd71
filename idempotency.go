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
	store Store
	caps  Capabilities
	cfg   config
	// maxPayload bounds an encoded result: the configured limit, or the
	// store's, less the byte of framing.
	maxPayload int
	// rawBytes: []byte results are stored as they are rather than through
	// the codec, which the default JSONCodec allows; a codec of the
	// caller's (encryption, redaction) must see every value.
	rawBytes   bool
	cache      *replayCache // nil without WithReplayCache
	heartbeats heartbeats
}

// New returns a Runner on store. It returns an error wrapping
// [ErrInvalidArgument], naming the option and the value it got, for a nil
// store (also a typed nil such as a nil *postgres.Store) or for any
// configuration under which fn could run twice for one request because
// of the configuration alone: a lease, retention or store timeout below
// its floor ([MinLease], [MinRetention], [MinStoreTimeout]) or below the
// store's own minimum ([Limits]), a retention shorter than the lease, or a
// store timeout that does not fit in a third of the lease. It reads the
// store's [Capabilities] once, and sends nothing to the store.
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
	caps := CapabilitiesOf(store)
	if err := cfg.validate(caps.Limits); err != nil {
		return nil, err
	}
	r := &Runner{store: store, caps: caps, cfg: cfg, maxPayload: cfg.maxResult}
	if m := caps.Limits.MaxValueSize; m > 0 {
		r.maxPayload = min(r.maxPayload, m-1)
	}
	_, r.rawBytes = cfg.codec.(JSONCodec)
	if cfg.cacheBytes > 0 {
		r.cache = newReplayCache(cfg.cacheBytes, cfg.cacheTTL)
	}
	return r, nil
}

// Store returns the runner's store.
func (r *Runner) Store() Store { return r.store }

// StoreTimeout returns the bound on each store call attempt (see
// [WithStoreTimeout]), for calls of one's own made next to the store's
// (an adapter's transaction begin and commit).
func (r *Runner) StoreTimeout() time.Duration { return r.cfg.storeTimeout }

// Wait returns how long a concurrent duplicate waits for the first call
// (see [WithWait]); 0 means it does not wait. An executor that runs calls
// in transactions of its own reads it to wait between them, as [Do] does
// not wait inside a transaction (see [Transactional]).
func (r *Runner) Wait() time.Duration { return r.cfg.wait }

// Result is what [Do] returns, also alongside an error: it says how the
// call ended, in the words every edge answers from.
type Result[T any] struct {
	// Value is fn's result, from this run or from the store.
	Value T
	// Outcome is how the call ended (see [Outcome] for the table the
	// edges answer from): OutcomeCompleted when fn ran and its outcome was
	// recorded, OutcomeReplay for a stored result, and so on.
	Outcome Outcome
	// Replayed reports that the result (or error) comes from an earlier run
	// and fn did not run in this call.
	Replayed bool
	// Ran reports that fn ran in this call, so that its effects may have
	// happened whatever the outcome: an edge then answers with fn's own
	// answer. An execution mode that rolls fn's writes back with the key
	// (a transaction that did not commit) reports false.
	Ran bool
	// Fence is the record's fence: the one fn ran under, or for a replay
	// the one of the run that completed it.
	Fence int64
	// Attempt is how many times the record was acquired: 1 unless it was
	// taken over.
	Attempt int
	// RetryAfter is, for OutcomeInProgress, the time left on the other
	// holder's lease, as judged by the store (see [RetryAfter] for the
	// delay an edge tells its client).
	RetryAfter time.Duration
	// ExpiresAt is, for OutcomeCompleted and for a replay, a time until
	// which the store keeps the record, by this process's clock: the
	// record's retention ends then or a little later (measured from before
	// the store call that set or reported it). Zero when the store does not
	// say (see ClaimResult.ExpiresIn).
	ExpiresAt time.Time
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
// Result.Outcome says which of these happened, in one word (see
// [Outcome]); edges answer from it, not from the error.
//
// On a store with a [Transactional] part, a ctx bound to a transaction of
// the caller's (the PostgreSQL adapter's DoTx does it) runs the same loop
// inside that transaction: the key, fn's writes and its result commit
// together.
//
// Invalid input (a nil runner or fn, an invalid key) gives an error
// wrapping [ErrInvalidArgument] or [ErrInvalidKey] before the store is
// touched.
func Do[T any](ctx context.Context, r *Runner, req Request, fn func(ctx context.Context) (T, error)) (res Result[T], err error) {
	switch {
	case r == nil:
		return res, invalidArg("nil runner")
	case fn == nil:
		return res, invalidArg("nil fn")
	case ctx == nil:
		return res, invalidArg("nil context")
	}
	co := r.cfg.calls
	if co == nil {
		return do(ctx, r, req, fn)
	}
	// A CallObserver sees the call as a whole, fn timed.
	ctx = co.StartCall(ctx, req.Scope)
	c := Call{Scope: req.Scope, Outcome: OutcomeReleased, Err: ErrFnPanicked}
	defer func() {
		// Also when fn panics: c.Err is then still ErrFnPanicked.
		if c.Err != ErrFnPanicked {
			c.Outcome = res.Outcome
		}
		c.Replayed, c.Fence, c.Attempt, c.Ran = res.Replayed, res.Fence, res.Attempt, res.Ran || c.Ran
		co.EndCall(ctx, c)
	}()
	res, err = do(ctx, r, req, func(ctx context.Context) (T, error) {
		c.Ran = true
		fnStart := time.Now()
		defer func() { c.FnDuration = time.Since(fnStart) }()
		return fn(ctx)
	})
	c.Err = err
	return res, err
}

// do is Do's loop: validate, claim, then run fn and complete or release,
// or answer from the claim (replay, mismatch, in progress, waiting when
// asked to).
func do[T any](ctx context.Context, r *Runner, req Request, fn func(ctx context.Context) (T, error)) (res Result[T], err error) {
	key, err := r.StorageKey(req)
	if err != nil {
		res.Outcome = OutcomeInvalidKey
		r.observe(ctx, Event{Outcome: OutcomeInvalidKey, Scope: req.Scope, Err: err})
		return res, err
	}
	tx := r.caps.Transactional != nil && r.caps.Transactional.InTx(ctx)
	attempts := r.cfg.storeAttempts
	if tx {
		attempts = 1
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
		if r.cache != nil {
			if e, ok := r.cache.get(key); ok {
				return replayCached[T](ctx, r, req, e)
			}
		}
		start := monoNow()
		var cr ClaimResult
		err := r.retryIn(ctx, nil, attempts, func(ctx context.Context) error {
			var err error
			cr, err = r.store.Claim(ctx, claimReq)
			return err
		})
		var took time.Duration
		if r.cfg.observer != nil {
			took = start.since()
		}
		ev := Event{Key: key, Scope: req.Scope, Fence: cr.Fence, Attempt: cr.Attempt, Duration: took}
		if err == nil && (cr.Outcome < OutcomeAcquired || cr.Outcome > OutcomeMismatch) {
			err = fmt.Errorf("store returned invalid outcome %v", cr.Outcome)
		}
		if err != nil {
			res.Outcome = OutcomeStoreError
			ev.Outcome, ev.Err, ev.Fence, ev.Attempt = OutcomeStoreError, err, 0, 0
			r.observe(ctx, ev)
			return res, &StoreError{Op: "claim", Err: err}
		}
		res.Fence, res.Attempt = cr.Fence, cr.Attempt
		switch cr.Outcome {
		case OutcomeAcquired:
			ev.Outcome = OutcomeAcquired
			r.observe(ctx, ev)
			h := &holder{parent: ctx, r: r, key: key, scope: req.Scope, clientKey: req.Key, fingerprint: req.Fingerprint, token: claimReq.Token,
				fence: cr.Fence, attempt: cr.Attempt, points: cr.Checkpoints, tx: tx, attempts: int32(attempts)}
			return run(ctx, h, start, res, fn)
		case OutcomeReplay:
			err = replayClaim(r, &res, start, key, req.Fingerprint, cr)
			ev.Outcome, ev.Err = res.Outcome, err
			r.observe(ctx, ev)
			return res, err
		case OutcomeMismatch:
			res.Outcome = OutcomeMismatch
			ev.Outcome = OutcomeMismatch
			r.observe(ctx, ev)
			return res, ErrMismatch
		}
		// In progress: answer, or wait for the holder and claim again.
		res.Outcome, res.RetryAfter = OutcomeInProgress, cr.RetryAfter
		ev.Outcome = OutcomeInProgress
		r.observe(ctx, ev)
		left := time.Until(waitUntil)
		if r.cfg.wait <= 0 || left <= 0 || tx {
			// In a transaction a wait would hold it, and its connection,
			// for the length of the other call (see Transactional).
			return res, &InProgressError{RetryAfter: cr.RetryAfter}
		}
		if err := r.awaitChange(ctx, key, min(left, max(cr.RetryAfter, time.Millisecond)), &poll); err != nil {
			return res, err
		}
	}
}

// replayClaim makes res the replay of the completed record a claim found
// (starting at start), keeps it in the replay cache when the store said
// when it expires, and returns the replayed error, if any.
func replayClaim[T any](r *Runner, res *Result[T], start mono, key string, fp Fingerprint, cr ClaimResult) error {
	var err error
	res.Replayed = true
	res.Value, res.Outcome, err = decodeOutcome[T](r, cr.Result)
	if cr.ExpiresIn > 0 {
		expiry := start.add(cr.ExpiresIn)
		res.ExpiresAt = expiry.time()
		if r.cache != nil && res.Outcome != OutcomeCorrupt {
			r.cache.put(&cached{key: key, fingerprint: fp, stored: cr.Result,
				fence: cr.Fence, attempt: cr.Attempt, expires: res.ExpiresAt}, expiry)
		}
	}
	return err
}

// replayCached answers a call from the replay cache: the record's stored
// result, or ErrMismatch for another fingerprint (a record's fingerprint
// is as immutable as its result).
func replayCached[T any](ctx context.Context, r *Runner, req Request, e *cached) (res Result[T], err error) {
	res.Fence, res.Attempt = e.fence, e.attempt
	ev := Event{Key: e.key, Scope: req.Scope, Fence: e.fence, Attempt: e.attempt}
	if e.fingerprint != req.Fingerprint {
		res.Outcome, ev.Outcome = OutcomeMismatch, OutcomeMismatch
		r.observe(ctx, ev)
		return res, ErrMismatch
	}
	stored := e.stored
	if isBytes[T]() {
		// A []byte result shares the stored bytes: give each caller its
		// own, as the store does.
		stored = append([]byte(nil), stored...)
	}
	res.Replayed, res.ExpiresAt = true, e.expires
	res.Value, res.Outcome, err = decodeOutcome[T](r, stored)
	ev.Outcome, ev.Err = res.Outcome, err
	r.observe(ctx, ev)
	return res, err
}

// awaitChange waits for the record under key to change, for at most d:
// through the store's Watcher when it has one, else by polling with a
// growing interval.
func (r *Runner) awaitChange(ctx context.Context, key string, d time.Duration, poll *time.Duration) error {
	if w := r.caps.Watcher; w != nil {
		wctx, cancel := context.WithTimeout(ctx, d)
		err := w.Watch(wctx, key)
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

// run executes fn as the holder of a fresh lease and records its outcome:
// completes the record with it, or releases the key after a transient
// error or a panic.
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
	res.Ran = true
	v, fnErr := fn(fnCtx)
	panicked = false
	h.stopHeartbeat()
	if fnErr != nil {
		if o, leave := leavesRecord(fnErr); leave {
			// Neither complete nor release: the record stays STARTED and
			// its lease runs out (the reconciler's undecided resolver, or
			// a recovery point that cannot be decoded: a release would
			// drop it).
			res.Outcome = o
			return res, fnErr
		}
	}
	lost := errors.Is(context.Cause(fnCtx), ErrLeaseLost)

	sctx := after()
	defer sctx.stop()

	stored, keep, encErr := encodeOutcome(r, v, fnErr)
	if !keep {
		err := h.release(sctx, start, fnErr)
		switch {
		case errors.Is(err, ErrLeaseLost):
			lost = true
		case err != nil:
			res.Outcome = OutcomeStoreError
		default:
			res.Outcome = OutcomeReleased
		}
		if lost {
			res.Outcome = OutcomeLeaseLost
			return res, fmt.Errorf("%w: %w", ErrLeaseLost, fnErr)
		}
		return res, fnErr
	}
	sent := monoNow() // the record's retention counts from after this
	var err error
	if h.tx && fnErr != nil {
		// A permanent error is recorded without the writes of the run that
		// returned it.
		err = r.retryIn(sctx, nil, 1, func(ctx context.Context) error {
			return r.caps.Transactional.Discard(ctx, h.key, h.token)
		})
	}
	if err == nil {
		err = h.complete(sctx, stored)
	}
	if errors.Is(err, ErrTooLarge) && fnErr == nil {
		// The store keeps less than it declared: store the marker instead.
		encErr = err
		stored = []byte{resultNotStored}
		err = h.complete(sctx, stored)
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		res.Outcome = OutcomeLeaseLost
		if !h.wasLost() { // else the heartbeat has reported it
			r.observe(ctx, Event{Outcome: OutcomeLeaseLost, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: err})
		}
		if fnErr != nil {
			return res, fmt.Errorf("%w: %w", ErrLeaseLost, fnErr)
		}
		res.Value = v
		return res, fmt.Errorf("%w: fn ran but its result was not recorded", ErrLeaseLost)
	case err != nil:
		res.Outcome = OutcomeStoreError
		r.observe(ctx, Event{Outcome: OutcomeStoreError, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: err})
		res.Value = v
		return res, &StoreError{Op: "complete", Ran: true, Err: err}
	}
	res.Outcome = OutcomeCompleted
	res.ExpiresAt = h.completed(stored, sent)
	if r.cfg.observer != nil {
		r.observe(ctx, Event{Outcome: OutcomeCompleted, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: encErr})
	}
	if fnErr != nil {
		return res, fnErr
	}
	res.Value = v
	return res, nil
}

// leavesRecord reports whether fn's error asks [run] to neither complete
// nor release the record, and the call's outcome then. A function of its
// own, so that the targets of errors.As are allocated only when fn failed.
func leavesRecord(fnErr error) (Outcome, bool) {
	var le *leaveError
	var cp *corruptPointError
	switch {
	case errors.As(fnErr, &cp):
		return OutcomeCorrupt, true
	case errors.As(fnErr, &le):
		return OutcomeUnknown, true
	}
	return 0, false
}

// Executor runs a function at most once per request, with the semantics
// of [Do], in an execution mode of its own choosing. Integrations that
// store bytes (the HTTP middleware stores responses) take an Executor, so
// a service can plug in a mode a store adapter offers, such as running fn
// inside a database transaction that also records the key (see the
// PostgreSQL adapter's TxExecutor). A [*Runner] is the Executor of [Do].
//
// Execute must return what Do returns: a [Result] whose Outcome and Ran
// say how the call ended (the edges answer from them), and Do's errors
// ([ErrInProgress], [ErrMismatch], [ErrInvalidKey], [ErrResultNotStored],
// a [*StoredError] for a replayed permanent error, a [*StoreError] when the
// store failed). Ran (in the Result and the StoreError) must be true only
// when fn's effects may have happened: a mode that rolls fn's writes back
// together with the key reports false.
type Executor interface {
	Execute(ctx context.Context, req Request, fn func(ctx context.Context) ([]byte, error)) (Result[[]byte], error)
}

var _ Executor = (*Runner)(nil)

// Execute is [Do] for functions that return bytes: it makes a Runner an
// [Executor].
func (r *Runner) Execute(ctx context.Context, req Request, fn func(ctx context.Context) ([]byte, error)) (Result[[]byte], error) {
	return Do(ctx, r, req, fn)
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
