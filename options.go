package idempotency

import (
	"time"
)

// Defaults of the options below.
const (
	DefaultLease         = 30 * time.Second
	DefaultRetention     = 24 * time.Hour
	DefaultMaxResultSize = 1 << 20
	DefaultStoreAttempts = 3
	DefaultStoreBackoff  = 20 * time.Millisecond
	// DefaultStoreTimeout bounds each store call attempt when
	// [WithStoreTimeout] is not given (or a third of the lease, if that is
	// shorter). A claim or a completion is one small statement or script
	// that takes milliseconds; an attempt still unanswered after two
	// seconds is stuck (a black-holed network, a server that accepts
	// connections and never answers) and is better repeated, or failed, than
	// waited on. With the default three attempts, a store that never
	// answers fails a call in about six seconds instead of hanging it.
	DefaultStoreTimeout = 2 * time.Second
)

// Floors that [New] enforces, because a shorter duration is almost always a
// unit missed in configuration (WithLease(30) is 30 nanoseconds, not 30
// seconds) and would make fn run again for the same request: a lease that
// ends before the store can renew it is taken over while fn still runs; a
// result kept for less than a retry takes to come back is run again; a
// store timeout shorter than a round trip fails every completion after fn
// ran. Tests that need shorter ones say so with
// [WithUnsafeShortDurations]. A store may declare a higher lease floor of
// its own ([Limits]); that one always applies.
const (
	MinLease        = time.Second
	MinRetention    = time.Minute
	MinStoreTimeout = 10 * time.Millisecond
)

// An Option configures a [Runner]. Options are checked by [New].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	lease, retention, grace time.Duration
	graceSet                bool
	wait                    time.Duration
	codec                   Codec
	observer                Observer
	calls                   CallObserver // observer as a CallObserver, or nil
	permanent               func(error) bool
	maxKeyLen               int
	maxResult               int
	storeAttempts           int
	storeBackoff            time.Duration
	storeTimeout            time.Duration
	storeTimeoutSet         bool
	unsafeShort             bool
	cacheBytes              int64
	cacheTTL                time.Duration
	cacheSet                bool
}

func defaultConfig() config {
	return config{
		lease:         DefaultLease,
		retention:     DefaultRetention,
		codec:         JSONCodec{},
		permanent:     isMarkedPermanent,
		maxKeyLen:     DefaultMaxKeyLength,
		maxResult:     DefaultMaxResultSize,
		storeAttempts: DefaultStoreAttempts,
		storeBackoff:  DefaultStoreBackoff,
	}
}

// validate checks the configuration against itself and against the
// store's limits, and fills in the defaults that depend on other options.
// Every error names the option and the value it got.
func (c *config) validate(limits Limits) error {
	c.calls, _ = c.observer.(CallObserver)
	if !c.graceSet {
		c.grace = c.retention
	}
	if !c.storeTimeoutSet {
		c.storeTimeout = min(DefaultStoreTimeout, c.lease/3)
	}
	floor := func(option string, got, min time.Duration, why string) error {
		if got >= min || c.unsafeShort {
			return nil
		}
		return invalidArg("%s(%v) is shorter than %v: %s; if the unit was missed, write it (30*time.Second), or add WithUnsafeShortDurations() where a short one is meant (tests)", option, got, min, why)
	}
	switch {
	case c.lease <= 0:
		return invalidArg("WithLease(%v): the lease must be positive", c.lease)
	case c.retention <= 0:
		return invalidArg("WithRetention(%v): the retention must be positive", c.retention)
	case c.storeTimeoutSet && c.storeTimeout <= 0:
		return invalidArg("WithStoreTimeout(%v): the store timeout must be positive", c.storeTimeout)
	}
	if err := floor("WithLease", c.lease, MinLease,
		"a lease this short can end before a heartbeat renews it, and another call would take the key over and run fn again while it still runs"); err != nil {
		return err
	}
	if limits.MinLease > 0 && c.lease < limits.MinLease {
		return invalidArg("WithLease(%v) is shorter than the store's minimum lease, %v (Capabilities.Limits)", c.lease, limits.MinLease)
	}
	if err := floor("WithRetention", c.retention, MinRetention,
		"a result kept this briefly is gone before most retries arrive, and they run fn again"); err != nil {
		return err
	}
	if c.storeTimeoutSet {
		if err := floor("WithStoreTimeout", c.storeTimeout, MinStoreTimeout,
			"store calls this short time out, and a completion that times out after fn ran leaves the key to be taken over and fn run again"); err != nil {
			return err
		}
	}
	switch {
	case c.retention < c.lease:
		return invalidArg("WithRetention(%v) is shorter than the lease (WithLease, %v): a duplicate told to retry when the lease ends would find the result gone and run fn again", c.retention, c.lease)
	case c.storeTimeout > c.lease/3:
		return invalidArg("WithStoreTimeout(%v) does not fit in the lease (WithLease, %v): the heartbeat renews every third of the lease, so a store call must time out within %v for a renewal to be retried before the lease can end", c.storeTimeout, c.lease, c.lease/3)
	case c.grace < 0:
		return invalidArg("WithGrace(%v): the grace must not be negative", c.grace)
	case c.wait < 0:
		return invalidArg("WithWait(%v): the wait must not be negative", c.wait)
	case c.codec == nil:
		return invalidArg("WithCodec(nil): the codec must not be nil")
	case c.permanent == nil:
		return invalidArg("WithErrorPolicy(nil): the error policy must not be nil")
	case c.maxKeyLen <= 0 || c.maxKeyLen > MaxStorageKeyLen/2:
		return invalidArg("WithMaxKeyLength(%d): must be in 1..%d", c.maxKeyLen, MaxStorageKeyLen/2)
	case c.maxResult <= 0:
		return invalidArg("WithMaxResultSize(%d): must be positive", c.maxResult)
	case c.storeAttempts <= 0:
		return invalidArg("WithStoreRetries(%d, %v): attempts must be positive", c.storeAttempts, c.storeBackoff)
	case c.storeBackoff < 0:
		return invalidArg("WithStoreRetries(%d, %v): the backoff must not be negative", c.storeAttempts, c.storeBackoff)
	case c.cacheSet && (c.cacheBytes <= 0 || c.cacheTTL <= 0):
		return invalidArg("WithReplayCache(%d, %v): the size and the time to live must be positive", c.cacheBytes, c.cacheTTL)
	}
	return nil
}

// WithLease sets how long a holder's lease lasts without a heartbeat.
// While fn runs, the lease is renewed every third of this. A holder that
// crashes blocks its key for at most this long. [New] refuses a lease
// shorter than [MinLease] (unless [WithUnsafeShortDurations]) or than the
// store's own minimum. Default: [DefaultLease].
func WithLease(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lease = d })
}

// WithRetention sets how long a completed result is kept and replayed.
// It must be at least the lease, and [New] refuses one shorter than
// [MinRetention] (unless [WithUnsafeShortDurations]).
// Default: [DefaultRetention].
func WithRetention(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retention = d })
}

// Retention returns how long a completed result is kept ([WithRetention]),
// from the store's clock at completion: an edge tells its clients when a
// key expires from it (httpidem's Idempotency-Key-Expires).
func (r *Runner) Retention() time.Duration { return r.cfg.retention }

// WithGrace sets how long a STARTED record whose holder stopped renewing is
// kept after its lease ends, so that a retry within that time takes it over
// with its recovery points and a greater fence; after it, the record
// expires and a retry starts afresh. Default: the retention.
func WithGrace(d time.Duration) Option {
	return optionFunc(func(c *config) { c.grace, c.graceSet = d, true })
}

// WithWait makes a concurrent duplicate wait up to d for the first call to
// finish and then return its result (or run fn itself if the first call
// released the key), instead of failing at once with [ErrInProgress].
// Stores that implement [Watcher] wake the waiter; others are polled.
// In a transaction of the caller's ([Transactional]) Do does not wait: it
// answers ErrInProgress, and the transaction's owner may wait between
// transactions ([Runner.Wait]). Default: 0, no waiting.
func WithWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.wait = d })
}

// WithCodec sets the codec of stored values, recovery points and stored
// error messages: replace it to encrypt or redact what is stored.
// Default: [JSONCodec], under which a non-nil []byte result (such as the
// HTTP middleware's stored response) is stored as it is, not as base64
// inside JSON; a codec of your own sees every value, []byte included.
func WithCodec(codec Codec) Option {
	return optionFunc(func(c *config) { c.codec = codec })
}

// WithObserver sets an observer of every outcome. An observer that also
// implements [CallObserver] sees each call of [Do] as a whole. Default:
// none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) { c.observer = o })
}

// WithErrorPolicy sets the function that decides whether an error returned
// by fn is permanent (stored and replayed) or transient (the key is
// released and a retry runs fn again). Default: errors marked with
// [Permanent] are permanent, all others transient.
func WithErrorPolicy(permanent func(error) bool) Option {
	return optionFunc(func(c *config) { c.permanent = permanent })
}

// WithMaxKeyLength sets the longest client key accepted, in bytes.
// Default: [DefaultMaxKeyLength] (255).
func WithMaxKeyLength(n int) Option {
	return optionFunc(func(c *config) { c.maxKeyLen = n })
}

// WithMaxResultSize sets the largest encoded result that is stored. A
// larger successful result is not stored: a marker is, and retries get
// [ErrResultNotStored] instead of running fn again.
// Default: [DefaultMaxResultSize] (1 MiB).
func WithMaxResultSize(n int) Option {
	return optionFunc(func(c *config) { c.maxResult = n })
}

// WithStoreRetries sets how many times a store call is attempted when it
// fails with an error that may be transient (every error except
// [ErrLeaseLost], [ErrTooLarge], [ErrInvalidArgument] and context errors),
// and the first backoff between attempts (doubled each time, with
// jitter). Every retry repeats the call with the same token, which the
// store contract makes safe. Default: [DefaultStoreAttempts] attempts,
// [DefaultStoreBackoff].
func WithStoreRetries(attempts int, backoff time.Duration) Option {
	return optionFunc(func(c *config) { c.storeAttempts, c.storeBackoff = attempts, backoff })
}

// WithStoreTimeout bounds each store call attempt. A call that times out
// has an unknown outcome and is repeated with the same token (see
// [WithStoreRetries]); when every attempt times out, [Do] returns a
// [*StoreError]. The bound holds even when the context given to Do is
// never canceled (the calls after fn run on a context detached from the
// caller's), so a black-holed network gives an error instead of a hang.
// It must be positive and at most a third of the lease (the heartbeat's
// interval), and [New] refuses one shorter than [MinStoreTimeout] (unless
// [WithUnsafeShortDurations]). Default: [DefaultStoreTimeout], or a third
// of the lease if that is shorter.
func WithStoreTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.storeTimeout, c.storeTimeoutSet = d, true })
}

// WithReplayCache keeps the completed records this runner completes or
// replays in memory, up to maxBytes of keys and results in all, and
// answers repeats of them from there for at most ttl, never past the
// record's own expiry, without a round trip to the store. A completed
// record cannot change until it expires, so a repeat answered from memory
// gets what the store would answer, with one exception: a record deleted
// by another instance's [Runner.Purge] (or another runner's) is still
// answered from this runner's memory until its entry's ttl ends; a purge
// through this runner drops its entry at once. So ttl bounds how stale a
// purge can be seen; keep it short (seconds to a minute) where operators
// purge. A replay is cached only when the store says when the record
// expires (ClaimResult.ExpiresIn; every record this runner completes
// itself is). Calls in a transaction of the caller's ([Transactional])
// are answered from the cache but add nothing to it, as their completion
// may yet roll back. It is what a retry storm after an outage needs: the
// store is spared exactly when it is under stress. Default: no cache.
func WithReplayCache(maxBytes int64, ttl time.Duration) Option {
	return optionFunc(func(c *config) { c.cacheBytes, c.cacheTTL, c.cacheSet = maxBytes, ttl, true })
}

// WithUnsafeShortDurations lifts the floors [MinLease], [MinRetention] and
// [MinStoreTimeout], which [New] otherwise enforces against unit typos.
// It is meant for tests that run leases of a few hundred milliseconds on
// the in-memory store. It does not lift the rules that hold whatever the
// durations (the retention at least the lease, the store timeout within a
// third of the lease) nor a store's own minimum lease: below those, fn can
// run twice for one request.
func WithUnsafeShortDurations() Option {
	return optionFunc(func(c *config) { c.unsafeShort = true })
}
