package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sender delivers one event to its destination: a broker, a webhook, a
// queue. It returns nil once the destination has the event. Delivery is at
// least once: a Sender may be handed an event it delivered before (a relay
// died before recording the delivery, or the reply was lost), so the
// receiver de-duplicates on [Event.ID].
//
// Send must return when its context is done (the context carries
// [RelayOptions.SendTimeout]). An error wrapping
// [idempotency.ErrPermanent] ([idempotency.Permanent]) dead-letters the
// event at once; any other error is retried after a backoff. A Send that
// panics counts as a failed attempt (the panic and its stack are logged).
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// SenderFunc is a function that is a [Sender].
type SenderFunc func(ctx context.Context, m Message) error

// Send calls f(ctx, m).
func (f SenderFunc) Send(ctx context.Context, m Message) error { return f(ctx, m) }

// Defaults and limits of [RelayOptions].
const (
	DefaultBatchSize       = 100
	DefaultLease           = 30 * time.Second
	DefaultSendTimeout     = 10 * time.Second
	DefaultMaxAttempts     = 20
	DefaultBackoff         = time.Second
	DefaultMaxBackoff      = 15 * time.Minute
	DefaultPollInterval    = time.Second
	DefaultCleanupInterval = time.Minute

	// MaxBatchSize is the largest BatchSize accepted.
	MaxBatchSize = 10_000
	// MinLease is the shortest Lease accepted.
	MinLease = time.Second
	// MinPollInterval is the shortest PollInterval accepted.
	MinPollInterval = 10 * time.Millisecond
)

// RelayOptions configure a [Relay]. The zero value (or nil) means defaults.
type RelayOptions struct {
	// BatchSize is how many events one claim takes, at most
	// [MaxBatchSize]. Default: [DefaultBatchSize] (100).
	BatchSize int
	// Parallelism is how many events of a batch are sent at the same time.
	// A batch holds at most one event per ordering key (only the head of
	// a key can be claimed), so this never reorders a key's events.
	// Default: 1, one after the other.
	Parallelism int
	// Lease is how long a claim keeps its batch from other relays. If the
	// relay dies, the batch is claimed again by another relay when the
	// lease ends; a live relay starts no send it could not finish (and
	// record) within the lease, and releases what it did not send. At
	// least [MinLease], and at least SendTimeout plus twice
	// [Options.Timeout] plus a second's grace for a sender that overruns
	// its timeout (a quarter of SendTimeout when that is less). Default:
	// [DefaultLease] (30s).
	Lease time.Duration
	// SendTimeout bounds each call of the Sender (through its context). A
	// Sender that has not returned a grace period after it (a quarter of
	// SendTimeout, at most a second) is abandoned: the attempt counts as
	// failed and the relay moves on, leaving the call running. Default:
	// [DefaultSendTimeout] (10s).
	SendTimeout time.Duration
	// MaxAttempts is how many attempts an event gets: after that many
	// failures it is dead-lettered ([Table.DeadLetters]), with the last
	// error kept. Default: [DefaultMaxAttempts] (20).
	MaxAttempts int
	// Backoff and MaxBackoff shape the delay before the next attempt after
	// a failure: a random duration between 0 and
	// min(MaxBackoff, Backoff × 2^(attempt-1)) ("full jitter"), so that
	// many failing events do not retry in step. A retry happens at the
	// first claim after the delay, so at most PollInterval later.
	// Defaults: [DefaultBackoff] (1s) and [DefaultMaxBackoff] (15m); with
	// them 20 attempts span an hour or two.
	Backoff, MaxBackoff time.Duration
	// PollInterval is how long the relay waits for a notification before
	// it looks for events anyway: the latency when notifications do not
	// arrive (PgBouncer in transaction pooling, [Options.NoNotify], a lost
	// listener connection), and the granularity of retries. At least
	// [MinPollInterval]. Default: [DefaultPollInterval] (1s).
	PollInterval time.Duration
	// ListenConnect opens the relay's connection for LISTEN: one per
	// relay, held while it runs, reconnected when lost. It must be a
	// direct connection to the primary, not through PgBouncer's
	// transaction pooling, which does not deliver notifications. Default:
	// when the table's DB is a *pgxpool.Pool, a connection made with the
	// pool's connection configuration, outside the pool; otherwise the
	// relay polls only.
	ListenConnect func(ctx context.Context) (*pgx.Conn, error)
	// NoListen makes the relay poll only, with no connection of its own.
	NoListen bool
	// CleanupInterval is how often the relay runs [Table.Cleanup]. Relays
	// sharing a table divide the work. Default: [DefaultCleanupInterval].
	CleanupInterval time.Duration
	// NoCleanup stops the relay from cleaning up (run [Table.Cleanup]
	// yourself, or keep delivered events).
	NoCleanup bool
	// Logger receives the relay's database errors (Warn), dead letters
	// (Error) and failed attempts (Debug). Default: slog.Default().
	Logger *slog.Logger
}

// Relay delivers the events of a [Table] to a [Sender], at least once.
// Run relays in as many processes as needed: they share the events
// through SELECT ... FOR UPDATE SKIP LOCKED.
//
// A batch is claimed by one statement that leases it (and commits): the
// relay holds no transaction or lock while it sends. Then it records
// every outcome in one statement: delivered, failed (retried after a
// backoff, or dead-lettered after MaxAttempts), or released unsent. A
// relay that stops (its context is canceled) records what it sent,
// counts the send it interrupted as a failed attempt, and releases the
// rest, so other relays take them at once; a relay that dies (process
// killed, connection lost) leaves its batch leased, and other relays
// claim it when the lease ends. Either way nothing is lost, and an event
// is sent again only if its delivery was not recorded.
type Relay struct {
	t       *Table
	sender  Sender
	opts    RelayOptions
	grace   time.Duration // for a sender that ignores its context
	connect func(context.Context) (*pgx.Conn, error)
	log     *slog.Logger
	running atomic.Bool
}

// NewRelay returns a relay of t's events to sender. It returns an error
// wrapping [idempotency.ErrInvalidArgument], naming the option, for a nil
// table or sender or invalid options.
func NewRelay(t *Table, sender Sender, opts *RelayOptions) (*Relay, error) {
	switch {
	case t == nil:
		return nil, invalid("NewRelay: nil table")
	case sender == nil:
		return nil, invalid("NewRelay: nil sender")
	}
	var o RelayOptions
	if opts != nil {
		o = *opts
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Parallelism == 0 {
		o.Parallelism = 1
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	def(&o.Lease, DefaultLease)
	def(&o.SendTimeout, DefaultSendTimeout)
	def(&o.Backoff, DefaultBackoff)
	def(&o.MaxBackoff, DefaultMaxBackoff)
	def(&o.PollInterval, DefaultPollInterval)
	def(&o.CleanupInterval, DefaultCleanupInterval)
	grace := min(time.Second, o.SendTimeout/4)
	need := o.SendTimeout + grace + 2*t.opts.Timeout
	switch {
	case o.BatchSize < 0 || o.BatchSize > MaxBatchSize:
		return nil, invalid("RelayOptions.BatchSize must be in 1..%d, got %d", MaxBatchSize, o.BatchSize)
	case o.Parallelism < 0 || o.Parallelism > o.BatchSize:
		return nil, invalid("RelayOptions.Parallelism must be in 1..BatchSize (%d), got %d", o.BatchSize, o.Parallelism)
	case o.MaxAttempts < 0:
		return nil, invalid("RelayOptions.MaxAttempts must be positive, got %d", o.MaxAttempts)
	case o.SendTimeout < 0:
		return nil, invalid("RelayOptions.SendTimeout must be positive, got %v", o.SendTimeout)
	case o.Lease < MinLease:
		return nil, invalid("RelayOptions.Lease (%v) is shorter than %v: another relay would claim a batch while its relay still sends it (if the unit was missed, write it: 30*time.Second)", o.Lease, MinLease)
	case o.Lease < need:
		return nil, invalid("RelayOptions.Lease (%v) is shorter than SendTimeout (%v) + its grace (%v) + 2 × Options.Timeout (%v) = %v: a send and the statements around it must fit in the lease, or another relay claims the event while it is being sent", o.Lease, o.SendTimeout, grace, t.opts.Timeout, need)
	case o.Backoff < 0:
		return nil, invalid("RelayOptions.Backoff must be positive, got %v", o.Backoff)
	case o.MaxBackoff < o.Backoff:
		return nil, invalid("RelayOptions.MaxBackoff (%v) is shorter than Backoff (%v)", o.MaxBackoff, o.Backoff)
	case o.PollInterval < MinPollInterval:
		return nil, invalid("RelayOptions.PollInterval (%v) is shorter than %v: every relay would query the table that often while idle (if the unit was missed, write it: time.Second)", o.PollInterval, MinPollInterval)
	case o.CleanupInterval < 0:
		return nil, invalid("RelayOptions.CleanupInterval must be positive, got %v", o.CleanupInterval)
	}
	r := &Relay{t: t, sender: sender, opts: o, grace: grace, log: o.Logger}
	if r.log == nil {
		r.log = slog.Default()
	}
	if !o.NoListen {
		r.connect = o.ListenConnect
		if r.connect == nil {
			if pool, ok := t.db.(*pgxpool.Pool); ok {
				cfg := pool.Config().ConnConfig
				r.connect = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }
			}
		}
	}
	return r, nil
}

// Run delivers events until ctx is done, then records what it sent,
// releases what it did not, and returns nil: the end of ctx (canceled by
// the caller, or past its deadline) is how a relay is stopped, not a
// failure, so that Run fits an errgroup or a supervisor that reports
// errors. Database errors do not stop it: they are logged and the relay
// tries again after a pause (growing to 5 s). A Relay runs once at a
// time; Run on a running Relay returns [ErrRelayRunning], its only error.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRelayRunning
	}
	defer r.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	wake := make(chan struct{}, 1)
	if r.connect != nil {
		wg.Go(func() { r.listen(ctx, wake) })
	}
	if !r.opts.NoCleanup {
		wg.Go(func() { r.cleanupLoop(ctx) })
	}
	var pause time.Duration
	for ctx.Err() == nil {
		claimed, sent, retryIn, err := r.batch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			pause = min(max(2*pause, 50*time.Millisecond), 5*time.Second)
			r.log.Warn("outbox relay: database error; trying again", "table", r.t.names.Table, "pause", pause, "err", err)
			sleep(ctx, pause, nil)
			continue
		}
		pause = 0
		if claimed == r.opts.BatchSize || sent > 0 {
			// There may be more: a full batch, or events of ordering keys
			// whose head this batch delivered.
			continue
		}
		wait := r.opts.PollInterval
		if retryIn > 0 {
			wait = min(wait, retryIn)
		}
		sleep(ctx, wait, wake)
	}
	return nil
}

// sleep waits for d, or a wake-up on wake (nil: none), and reports
// whether ctx is still live.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-t.C:
	}
	return true
}

// outcome is what became of one claimed event.
type outcome struct {
	kind  outcomeKind
	err   error
	delay time.Duration // before the next attempt; negative: dead now
}

type outcomeKind uint8

const (
	unsent outcomeKind = iota
	delivered
	failed
	skipped // dead-lettered by the claim: not sent
)

// item is one event of a batch.
type item struct {
	id int64
	m  Message
}

// batch claims, sends and records one batch. It returns how many events
// the claim took, how many of them were delivered, and the shortest retry
// delay it scheduled (0: none).
func (r *Relay) batch(ctx context.Context) (claimed, sent int, retryIn time.Duration, err error) {
	token := newToken()
	start := time.Now()
	// The claim is not canceled with ctx: a canceled statement may still
	// commit on the server (its bytes were sent; the server runs them
	// even after the client hung up), and its batch would then stay
	// leased with nobody to send it. Run to its end (bounded by
	// Options.Timeout), a batch claimed after ctx is done is released at
	// once below.
	batch, out, err := r.claim(context.WithoutCancel(ctx), token)
	if err != nil || len(batch) == 0 {
		return 0, 0, 0, err
	}
	// The server's lease started after start: stopping by this time
	// leaves room to record the outcome before it ends.
	stopBy := start.Add(r.opts.Lease - r.t.opts.Timeout - r.grace)
	r.sendAll(ctx, batch, out, stopBy)

	for i, o := range out {
		switch o.kind {
		case delivered:
			sent++
		case failed:
			r.log.Debug("outbox relay: attempt failed", "table", r.t.names.Table, "event", batch[i].m.ID, "attempt", batch[i].m.Attempt, "retry_in", o.delay, "err", o.err)
			if o.delay >= 0 && (retryIn == 0 || o.delay < retryIn) {
				retryIn = max(o.delay, time.Millisecond)
			}
		case skipped:
			r.log.Error("outbox relay: event dead-lettered", "table", r.t.names.Table, "event", batch[i].m.ID, "attempts", batch[i].m.Attempt, "err", o.err)
		}
	}
	// The outcome is recorded even when ctx is done: it is what lets the
	// other relays take over at once.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.t.opts.Timeout)
	defer cancel()
	return len(batch), sent, retryIn, r.record(rctx, token, batch, out)
}

// claim takes a batch. Events that the claim dead-lettered come back with
// the outcome skipped, and events whose headers are not a JSON object
// already failed (for good).
func (r *Relay) claim(ctx context.Context, token string) ([]item, []outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, r.t.opts.Timeout)
	defer cancel()
	rows, err := r.t.db.Query(ctx, r.t.sql.claim, r.opts.BatchSize, r.opts.Lease.Microseconds(), r.opts.MaxAttempts, token)
	if err != nil {
		return nil, nil, wrapErr(ctx, "claim", err)
	}
	var (
		batch   []item
		out     []outcome
		c       item
		headers *string
		dead    bool
		lastErr *string
	)
	_, err = pgx.ForEachRow(rows, []any{&c.id, &c.m.ID, &c.m.Topic, &c.m.Key, &c.m.Payload, &headers, &c.m.Attempt, &c.m.EnqueuedAt, &dead, &lastErr}, func() error {
		e := c
		o := outcome{}
		switch {
		case dead:
			o.kind = skipped
			if lastErr != nil {
				o.err = errors.New(*lastErr)
			}
		case headers != nil:
			var err error
			if e.m.Headers, err = decodeHeaders(*headers); err != nil {
				// Written by hand (Enqueue writes an object): this event
				// cannot be sent as it is, the others can.
				o = outcome{kind: failed, err: err, delay: -1}
			}
		}
		batch = append(batch, e)
		out = append(out, o)
		return nil
	})
	if err != nil {
		// The claim may have committed: its events come back when their
		// lease ends.
		return nil, nil, wrapErr(ctx, "claim", err)
	}
	return batch, out, nil
}

// sendAll sends the batch's events, Parallelism at a time, and fills in
// their outcomes. It starts no send after stopBy minus SendTimeout, nor
// once ctx is done: those events stay unsent. Sends run on worker
// goroutines, one event after another; a worker whose send overruns
// SendTimeout and its grace is abandoned (the send counts as failed) and
// replaced, so a sender that ignores its context cannot stall the relay.
func (r *Relay) sendAll(ctx context.Context, batch []item, out []outcome, stopBy time.Time) {
	type worker struct {
		i     int       // the event it sends, or -1
		since time.Time // when that send started
		gone  bool      // abandoned
	}
	var (
		mu      sync.Mutex
		next    int
		workers = map[*worker]bool{}
		exited  = make(chan struct{}, 1)
		limit   = r.opts.SendTimeout + r.grace
	)
	// take gives w the next event to send; under mu.
	take := func(w *worker) bool {
		for next < len(batch) {
			i := next
			next++
			if out[i].kind != unsent || ctx.Err() != nil || time.Until(stopBy) < r.opts.SendTimeout {
				continue
			}
			w.i, w.since = i, time.Now()
			return true
		}
		w.i = -1
		return false
	}
	spawn := func() { // under mu
		w := &worker{i: -1}
		workers[w] = true
		go func() {
			mu.Lock()
			for take(w) {
				i := w.i
				mu.Unlock()
				err := r.sendOne(ctx, batch[i].m)
				mu.Lock()
				if w.gone {
					break // its outcome is decided already
				}
				out[i] = r.outcomeOf(ctx, batch[i].m, err)
			}
			delete(workers, w)
			mu.Unlock()
			select {
			case exited <- struct{}{}:
			default: // a wake-up is pending already
			}
		}()
	}
	mu.Lock()
	for range min(r.opts.Parallelism, len(batch)) {
		spawn()
	}
	mu.Unlock()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		mu.Lock()
		if len(workers) == 0 {
			mu.Unlock()
			return
		}
		now := time.Now()
		wake := now.Add(limit)
		for w := range workers {
			if w.i < 0 {
				continue
			}
			if due := w.since.Add(limit); now.Before(due) {
				if due.Before(wake) {
					wake = due
				}
				continue
			}
			w.gone = true
			delete(workers, w)
			err := fmt.Errorf("outbox: the sender did not return within RelayOptions.SendTimeout (%v) and %v more; abandoned it", r.opts.SendTimeout, r.grace)
			out[w.i] = outcome{kind: failed, err: err, delay: r.backoff(batch[w.i].m.Attempt)}
			spawn()
		}
		mu.Unlock()
		timer.Reset(time.Until(wake))
		select {
		case <-exited:
		case <-timer.C:
		}
	}
}

// sendOne calls the sender with SendTimeout, turning a panic into an
// error.
func (r *Relay) sendOne(ctx context.Context, m Message) (err error) {
	sctx, cancel := context.WithTimeout(ctx, r.opts.SendTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("outbox relay: sender panicked", "table", r.t.names.Table, "event", m.ID, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("outbox: the sender panicked: %v", p)
		}
	}()
	return r.sender.Send(sctx, m)
}

// outcomeOf is the outcome of a send of m that returned err.
func (r *Relay) outcomeOf(ctx context.Context, m Message, err error) outcome {
	switch {
	case err == nil:
		return outcome{kind: delivered}
	case ctx.Err() != nil:
		// Stopping: the attempt counts (the event may have arrived), but
		// not against the receiver. Another relay may retry at once.
		return outcome{kind: failed, err: fmt.Errorf("the relay stopped during the send: %w", err)}
	case errors.Is(err, idempotency.ErrPermanent):
		return outcome{kind: failed, err: err, delay: -1}
	}
	return outcome{kind: failed, err: err, delay: r.backoff(m.Attempt)}
}

// backoff returns the delay after the failure of attempt: full jitter over
// min(MaxBackoff, Backoff × 2^(attempt-1)).
func (r *Relay) backoff(attempt int) time.Duration {
	ceiling := r.opts.MaxBackoff
	if attempt >= 1 && attempt <= 62 {
		if d := r.opts.Backoff << (attempt - 1); d > 0 && d>>(attempt-1) == r.opts.Backoff {
			ceiling = min(ceiling, d)
		}
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}

// record writes the batch's outcomes in one statement, and logs the
// events that became dead.
func (r *Relay) record(ctx context.Context, token string, batch []item, out []outcome) error {
	var ok, unsentIDs, failedIDs, delays []int64
	var errs []string
	for i, o := range out {
		switch o.kind {
		case delivered:
			ok = append(ok, batch[i].id)
		case unsent:
			unsentIDs = append(unsentIDs, batch[i].id)
		case failed:
			failedIDs = append(failedIDs, batch[i].id)
			errs = append(errs, errorText(o.err))
			d := o.delay.Microseconds()
			if o.delay < 0 {
				d = -1
			}
			delays = append(delays, d)
		}
	}
	if len(failedIDs) == 0 && len(unsentIDs) == 0 {
		if len(ok) == 0 {
			return nil
		}
		if _, err := r.t.db.Exec(ctx, r.t.sql.delivered, ok); err != nil {
			return wrapErr(ctx, "record deliveries", err)
		}
		return nil
	}
	if ok == nil {
		ok = []int64{}
	}
	if unsentIDs == nil {
		unsentIDs = []int64{}
	}
	if failedIDs == nil {
		failedIDs, errs, delays = []int64{}, []string{}, []int64{}
	}
	rows, err := r.t.db.Query(ctx, r.t.sql.record, ok, failedIDs, errs, delays, token, r.opts.MaxAttempts, unsentIDs)
	if err != nil {
		return wrapErr(ctx, "record outcomes", err)
	}
	dead, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return wrapErr(ctx, "record outcomes", err)
	}
	if len(dead) > 0 {
		last := map[string]error{}
		for i, o := range out {
			if o.kind == failed {
				last[batch[i].m.ID] = o.err
			}
		}
		for _, id := range dead {
			r.log.Error("outbox relay: event dead-lettered", "table", r.t.names.Table, "event", id, "err", last[id])
		}
	}
	return nil
}

// maxErrorLen bounds the last error kept in the table.
const maxErrorLen = 4096

// errorText is err's message, valid UTF-8 without NUL (text columns
// refuse both), at most maxErrorLen bytes.
func errorText(err error) string {
	s := "unknown error"
	if err != nil {
		s = err.Error()
	}
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) > maxErrorLen {
		s = strings.ToValidUTF8(s[:maxErrorLen], "")
	}
	return s
}

// cleanupLoop runs the cleanup every CleanupInterval, the first time after
// a random part of it, so that relays started together spread out.
func (r *Relay) cleanupLoop(ctx context.Context) {
	wait := time.Duration(rand.Int64N(int64(r.opts.CleanupInterval)) + 1)
	for sleep(ctx, wait, nil) {
		wait = r.opts.CleanupInterval
		if _, err := r.t.Cleanup(ctx, 0); err != nil && ctx.Err() == nil {
			r.log.Warn("outbox relay: cleanup failed", "table", r.t.names.Table, "err", err)
		}
	}
}
