package idempotency

// The lease a call of Do holds while fn runs: what fn can ask of it
// (FromContext, DownstreamKey, Step), then the holder behind them, its
// heartbeat, and the completion or release that ends it.

import (
	"container/heap"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Info describes the lease fn runs under. See [FromContext].
type Info struct {
	// Key is the client's idempotency key.
	Key string
	// StorageKey is the scoped key the record is stored under.
	StorageKey string
	// Fence strictly increases on every claim and takeover of the key:
	// guard your own writes with it (UPDATE ... WHERE fence < $fence) so a
	// stale holder's late write is refused.
	Fence int64
	// Attempt is 1 for a fresh claim and grows with every takeover.
	Attempt int
}

// FromContext returns the lease of the [Do] call whose fn received ctx
// (or a context derived from it).
func FromContext(ctx context.Context) (Info, bool) {
	if h := holderFrom(ctx); h != nil {
		return Info{Key: h.clientKey, StorageKey: h.key, Fence: h.fence, Attempt: h.attempt}, true
	}
	return Info{}, false
}

// DownstreamKey derives an idempotency key for a downstream call (a payment
// gateway, another service) from the key fn runs under: prefix, a colon,
// and 32 hex digits of a hash of the scoped storage key. It is the same in
// every attempt and takeover of the same request, differs across scopes
// and prefixes, and is short enough for any gateway (Stripe allows 255).
// Outside fn it returns an error wrapping [ErrInvalidArgument], never an
// empty key.
func DownstreamKey(ctx context.Context, prefix string) (string, error) {
	info, ok := FromContext(ctx)
	if !ok || info.StorageKey == "" {
		return "", invalidArg("DownstreamKey called outside Do")
	}
	return DownstreamKeyOf(info.StorageKey, prefix), nil
}

// DownstreamKeyOf is the key [DownstreamKey] derives for prefix inside a
// call of Do on storageKey (as [Runner.StorageKey] builds it, and
// [RecordInfo] and [StuckRecord] report it), for an operator who looks a
// stuck request up in the downstream's records by hand.
func DownstreamKeyOf(storageKey, prefix string) string {
	sum := sha256.Sum256([]byte(storageKey))
	return prefix + ":" + hex.EncodeToString(sum[:16])
}

// Step runs one named step of fn as a recovery point. The first time, it
// runs step and records its result under the lease; when the key is taken
// over after a crash, the new holder's Step with the same name returns the
// recorded result without running step again. So a payment flow of
// phases (create the payment row, call the gateway with a downstream key,
// record the answer) resumes where the crashed holder stopped.
//
// A recorded result that cannot be decoded (another codec or version, or
// damage) gives an error matching [ErrCorrupt], and step does not run. If
// fn returns that error (wrapped or not), [Do] neither completes nor
// releases the record: it keeps its recovery points and stays STARTED
// until its lease ends, listed by [Runner.Stuck], so that no retry runs
// the step again while the record lives.
//
// In a transaction of the caller's ([Transactional], such as the PostgreSQL
// adapter's DoTx), Step runs step and records nothing in the store: the
// transaction is the recovery point, as fn's writes commit together with
// its result or not at all. A later Step of the same name in the same call
// still returns the first result.
//
// An error from step is returned and nothing is recorded, so a later
// attempt runs the step again. If the result cannot be recorded, Step
// returns it together with an error: [ErrLeaseLost] (fn's context is then
// canceled) or a [*StoreError]; the step is then not a recovery point.
// Outside fn, Step returns an error wrapping [ErrInvalidArgument] without
// running step.
func Step[T any](ctx context.Context, name string, step func(ctx context.Context) (T, error)) (T, error) {
	var v T
	h := holderFrom(ctx)
	switch {
	case h == nil:
		return v, invalidArg("Step called outside Do")
	case name == "":
		return v, invalidArg("empty step name")
	case step == nil:
		return v, invalidArg("nil step")
	}
	r := h.r
	h.mu.Lock()
	b, done := h.points[name]
	lost := h.lost
	h.mu.Unlock()
	if lost {
		// A holder known to be stale must not start another effect.
		return v, ErrLeaseLost
	}
	if done {
		if err := r.cfg.codec.Unmarshal(b, &v); err != nil {
			var zero T
			return zero, &corruptPointError{fmt.Errorf("%w: recovery point %q: %w", ErrCorrupt, name, err)}
		}
		return v, nil
	}
	v, err := step(ctx)
	if err != nil {
		return v, err
	}
	b, err = r.cfg.codec.Marshal(v)
	if err != nil {
		return v, err
	}
	if !h.tx {
		err = r.retry(ctx, func(ctx context.Context) error {
			return r.store.Checkpoint(ctx, h.key, h.token, name, b)
		})
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		h.lose(err)
		return v, err
	case err != nil && errors.Is(context.Cause(ctx), ErrLeaseLost):
		// The checkpoint failed because fn was stopped for a lost lease.
		return v, fmt.Errorf("%w: %w", ErrLeaseLost, err)
	case err != nil:
		return v, &StoreError{Op: "checkpoint", Ran: true, Err: err}
	}
	h.mu.Lock()
	if h.points == nil {
		h.points = make(map[string][]byte)
	}
	h.points[name] = b
	h.mu.Unlock()
	return v, nil
}

// corruptPointError is Step's error for a recovery point it cannot
// decode: [run] leaves the record as it is when fn returns it, since a
// release would drop the point and let a retry run the step again.
type corruptPointError struct{ err error }

func (e *corruptPointError) Error() string { return e.err.Error() }
func (e *corruptPointError) Unwrap() error { return e.err }

// holder is the state of one acquired lease while fn runs. It is also the
// context fn's context derives from, carrying itself as a value (see
// [FromContext]) without the allocation of context.WithValue.
type holder struct {
	parent    context.Context
	r         *Runner
	key       string   // storage key
	scope     []string // the request's scope parts, for events
	clientKey string
	// fingerprint is the request's, for the replay cache.
	fingerprint Fingerprint
	token       Token
	fence       int64
	attempt     int
	// attempts bounds each store call's attempts: the runner's, or 1 in a
	// transaction.
	attempts int32
	cancel   context.CancelCauseFunc
	after    boundedCtx // the context of the store calls after fn
	// afterAttempt is the context of the first attempt of the store call
	// after fn (Complete or Release), which is made once.
	afterAttempt boundedCtx

	// The flags side by side, and next to mu, to keep the holder small.
	// leaveOnPanic: a panic in fn leaves the record for its lease to run
	// out instead of releasing it (the reconciler: a release would let a
	// retry run the effect again when it may have happened).
	leaveOnPanic     bool
	afterAttemptUsed bool
	// tx: the call runs in a transaction of the caller's (see
	// [Transactional]): no heartbeat, no recovery points, one attempt per
	// store call.
	tx      bool
	stopped bool // guarded by mu
	lost    bool // guarded by mu: the heartbeat lost the lease and canceled fn
	mu      sync.Mutex
	points  map[string][]byte // recovery points: handed over, then made here
	// next is when the next renewal is due, and index the holder's place
	// in its runner's heartbeat queue (-1: not queued). Guarded by the
	// queue's lock.
	next  mono
	index int
	// renewed is when the last successful renewal (or the claim) was
	// sent: the lease surely lasts until renewed+lease.
	renewed mono
}

type holderKey struct{}

func (h *holder) Deadline() (time.Time, bool) { return h.parent.Deadline() }
func (h *holder) Done() <-chan struct{}       { return h.parent.Done() }
func (h *holder) Err() error                  { return h.parent.Err() }
func (h *holder) Value(key any) any {
	if key == (holderKey{}) {
		return h
	}
	return h.parent.Value(key)
}

func holderFrom(ctx context.Context) *holder {
	if ctx == nil {
		return nil
	}
	h, _ := ctx.Value(holderKey{}).(*holder)
	return h
}

// startHeartbeat renews the lease every third of its length, through the
// runner's heartbeat schedule, until stopHeartbeat. The renewals and
// their events get the holder as their context: fn's values, not its
// cancellation.
func (h *holder) startHeartbeat(claimed mono) {
	if h.tx {
		return // the transaction holds the record locked
	}
	h.mu.Lock()
	h.renewed = claimed
	h.next = claimed.add(h.r.cfg.lease / 3)
	h.index = -1
	h.mu.Unlock()
	h.r.heartbeats.schedule(h)
}

// stopHeartbeat ends the renewals. A renewal already under way finds
// stopped set and neither acts on its result nor schedules another.
func (h *holder) stopHeartbeat() {
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	if !h.tx {
		h.r.heartbeats.unschedule(h)
	}
}

// errNotRenewed is why fn is stopped when no renewal succeeded in time.
var errNotRenewed = errors.New("idempotency: the lease could not be renewed before it could end")

// stopBy is when fn must have stopped unless a renewal succeeds first: a
// tenth of the lease before the lease can end by the store's clock, which
// is no earlier than the sending of the last successful renewal plus the
// lease. Called with mu held.
func (h *holder) stopBy() mono {
	lease := h.r.cfg.lease
	return h.renewed.add(lease - lease/10)
}

func (h *holder) beat() {
	r := h.r
	h.mu.Lock()
	if h.stopped || h.lost {
		h.mu.Unlock()
		return
	}
	stopBy := h.stopBy()
	h.mu.Unlock()

	// Renewals go on while fn runs, even after the caller's context ends:
	// fn may still be finishing its effect, and its lease must cover it.
	// But a renewal must succeed by stopBy: a store that hangs (a
	// black-holed network, a driver without timeouts) must not keep fn
	// running into a taker-over's lease, so fn is stopped at stopBy even
	// while the renewal is still under way.
	rctx, cancel := context.WithDeadline(context.WithoutCancel(h), stopBy.time())
	defer cancel()
	stopWatch := context.AfterFunc(rctx, func() {
		if !errors.Is(rctx.Err(), context.DeadlineExceeded) {
			return // the renewal finished first
		}
		h.lose(errNotRenewed)
	})
	sent := monoNow()
	err := r.retry(rctx, func(ctx context.Context) error {
		return r.store.Renew(ctx, h.key, h.token, r.cfg.lease)
	})
	stopWatch()

	h.mu.Lock()
	if h.stopped || h.lost {
		// fn has returned, or was stopped: whatever this renewal found is
		// for Complete or Release to find out.
		h.mu.Unlock()
		return
	}
	interval := r.cfg.lease / 3
	next := monoNow()
	switch {
	case err == nil:
		h.renewed = sent
		// The next renewal is due a third of a lease after this one was
		// sent, not after it returned: slow renewals that succeed must not
		// drift towards the cut-off.
		next = sent
	case errors.Is(err, ErrLeaseLost):
		h.mu.Unlock()
		h.lose(err)
		return
	default:
		left := time.Duration(h.stopBy() - monoNow())
		if left <= 0 {
			h.mu.Unlock()
			h.lose(err)
			return
		}
		// Try again soon, while there is time left.
		interval = max(min(interval, left/2), time.Millisecond)
		r.observe(h, Event{Outcome: OutcomeStoreError, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: sent.since(), Err: err})
	}
	h.next = next.add(interval)
	h.mu.Unlock()
	r.heartbeats.schedule(h)
}

// lose cancels fn's context with cause ErrLeaseLost, once, unless fn has
// returned. The observer and the cancellation run without mu held, so an
// observer that blocks or calls back cannot stall or deadlock fn.
func (h *holder) lose(err error) {
	h.mu.Lock()
	if h.lost || h.stopped {
		h.mu.Unlock()
		return
	}
	h.lost = true
	h.mu.Unlock()
	h.r.observe(h, Event{Outcome: OutcomeLeaseLost, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Err: err})
	h.cancel(ErrLeaseLost)
}

// wasLost reports whether the heartbeat found the lease lost.
func (h *holder) wasLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

func (h *holder) complete(ctx context.Context, stored []byte) error {
	r := h.r
	return r.retryIn(ctx, h.attemptStorage(), int(h.attempts), func(ctx context.Context) error {
		return r.store.Complete(ctx, h.key, h.token, stored, r.cfg.retention)
	})
}

// completed notes that the record was completed with stored, by a
// Complete sent at sent: it returns when the record expires (its retention
// counts from after sent), and keeps the record in the replay cache, but
// in a transaction, whose completion may yet roll back.
func (h *holder) completed(stored []byte, sent mono) time.Time {
	r := h.r
	expiry := sent.add(r.cfg.retention)
	if r.cache != nil && !h.tx {
		r.cache.put(&cached{key: h.key, fingerprint: h.fingerprint, stored: stored,
			fence: h.fence, attempt: h.attempt, expires: expiry.time()}, expiry)
	}
	return expiry.time()
}

// attemptStorage returns the holder's storage for the context of a store
// attempt the first time, then nil: a context handed to a store is never
// reused, as the store may still hold it (a watch it has not stopped).
func (h *holder) attemptStorage() *boundedCtx {
	if h.afterAttemptUsed {
		return nil
	}
	h.afterAttemptUsed = true
	return &h.afterAttempt
}

// release gives the key up after fn failed transiently or panicked
// (cause), so that a retry runs fn again at once. It returns the store's
// error, already observed.
func (h *holder) release(ctx context.Context, start mono, cause error) error {
	r := h.r
	err := r.retryIn(ctx, h.attemptStorage(), int(h.attempts), func(ctx context.Context) error {
		return r.store.Release(ctx, h.key, h.token)
	})
	e := Event{Outcome: OutcomeReleased, Key: h.key, Scope: h.scope, Fence: h.fence, Attempt: h.attempt, Duration: start.since(), Err: cause}
	switch {
	case errors.Is(err, ErrLeaseLost):
		e.Outcome, e.Err = OutcomeLeaseLost, err
	case err != nil:
		// The lease will end on its own; a retry waits for it.
		e.Outcome, e.Err = OutcomeStoreError, err
	}
	r.observe(ctx, e)
	return err
}

// heartbeats schedules the lease renewals of all of a runner's holders on
// one timer. A timer per call would cost two allocations and a timer
// operation on every Do; most calls finish long before their first
// renewal is due, and for them the schedule costs a heap push and pop.
// A due renewal runs on a goroutine of its own, so a slow store delays
// no other holder's.
type heartbeats struct {
	mu    sync.Mutex
	queue beatQueue
	timer *time.Timer // made on first use, then Reset
	armed mono        // when timer fires; zero when it is not armed
}

// schedule queues h's next renewal at h.next. It reschedules the timer
// only when h is due before the timer fires, which, as every holder renews
// at the same interval, is rare while holders keep arriving.
func (hb *heartbeats) schedule(h *holder) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	heap.Push(&hb.queue, h)
	if hb.armed == 0 || h.next < hb.armed {
		hb.arm(h.next)
	}
}

// unschedule removes h from the queue if it is there. The timer is left
// armed: a spurious firing finds nothing due and costs less than stopping
// and restarting it for every call.
func (hb *heartbeats) unschedule(h *holder) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if h.index >= 0 {
		heap.Remove(&hb.queue, h.index)
	}
}

// arm makes the timer fire at t. Called with mu held.
func (hb *heartbeats) arm(t mono) {
	d := time.Duration(t - monoNow())
	if hb.timer == nil {
		hb.timer = time.AfterFunc(d, hb.fire)
	} else {
		hb.timer.Reset(d)
	}
	hb.armed = t
}

// fire starts the renewals that are due and arms the timer for the next.
func (hb *heartbeats) fire() {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.armed = 0
	now := monoNow()
	for len(hb.queue) > 0 && hb.queue[0].next <= now {
		h := heap.Pop(&hb.queue).(*holder)
		go h.beat() // it schedules its next renewal itself
	}
	if len(hb.queue) > 0 {
		hb.arm(hb.queue[0].next)
	}
}

// beatQueue is a min-heap of holders by their next renewal.
type beatQueue []*holder

func (q beatQueue) Len() int           { return len(q) }
func (q beatQueue) Less(i, j int) bool { return q[i].next < q[j].next }
func (q beatQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}

func (q *beatQueue) Push(x any) {
	h := x.(*holder)
	h.index = len(*q)
	*q = append(*q, h)
}

func (q *beatQueue) Pop() any {
	old := *q
	n := len(old)
	h := old[n-1]
	old[n-1] = nil
	h.index = -1
	*q = old[:n-1]
	return h
}
