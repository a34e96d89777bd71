package idempotency

import (
	"encoding/json"
	"time"
)

// Defaults of the options below.
const (
	DefaultLease         = 30 * time.Second
	DefaultRetention     = 24 * time.Hour
	DefaultMaxResultSize = 1 << 20
	DefaultStoreAttempts = 3
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
	permanent               func(error) bool
	maxKeyLen               int
	maxResult               int
	storeAttempts           int
	storeBackoff            time.Duration
	storeTimeout            time.Duration
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
		storeBackoff:  20 * time.Millisecond,
	}
}

func (c *config) validate() error {
	switch {
	case c.lease <= 0:
		return invalidArg("lease must be positive, got %v", c.lease)
	case c.retention <= 0:
		return invalidArg("retention must be positive, got %v", c.retention)
	case c.grace < 0:
		return invalidArg("grace must not be negative, got %v", c.grace)
	case c.wait < 0:
		return invalidArg("wait must not be negative, got %v", c.wait)
	case c.codec == nil:
		return invalidArg("nil codec")
	case c.permanent == nil:
		return invalidArg("nil error policy")
	case c.maxKeyLen <= 0 || c.maxKeyLen > MaxStorageKeyLen/2:
		return invalidArg("max key length must be in 1..%d, got %d", MaxStorageKeyLen/2, c.maxKeyLen)
	case c.maxResult <= 0:
		return invalidArg("max result size must be positive, got %d", c.maxResult)
	case c.storeAttempts <= 0:
		return invalidArg("store attempts must be positive, got %d", c.storeAttempts)
	case c.storeBackoff < 0:
		return invalidArg("store backoff must not be negative, got %v", c.storeBackoff)
	case c.storeTimeout < 0:
		return invalidArg("store timeout must not be negative, got %v", c.storeTimeout)
	}
	return nil
}

// WithLease sets how long a holder's lease lasts without a heartbeat.
// While fn runs, the lease is renewed every third of this. A holder that
// crashes blocks its key for at most this long. Default: [DefaultLease].
func WithLease(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lease = d })
}

// WithRetention sets how long a completed result is kept and replayed.
// Default: [DefaultRetention].
func WithRetention(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retention = d })
}

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
// Default: 0, no waiting.
func WithWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.wait = d })
}

// WithCodec sets the codec of stored values, recovery points and stored
// error messages: replace it to encrypt or redact what is stored.
// Default: [JSONCodec].
func WithCodec(codec Codec) Option {
	return optionFunc(func(c *config) { c.codec = codec })
}

// WithObserver sets an observer of every outcome. Default: none.
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
// 20ms backoff.
func WithStoreRetries(attempts int, backoff time.Duration) Option {
	return optionFunc(func(c *config) { c.storeAttempts, c.storeBackoff = attempts, backoff })
}

// WithStoreTimeout bounds each store call attempt. A call that times out
// has an unknown outcome and is repeated with the same token (see
// [WithStoreRetries]). Set it when the context given to [Do] may never be
// canceled (the calls after fn run on a context detached from the
// caller's), or when the store's driver has no timeouts of its own, so a
// black-holed network gives an error instead of a hang. The heartbeat is
// bounded by the lease regardless. Default: 0, no timeout of its own.
func WithStoreTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.storeTimeout = d })
}

// Codec encodes the values that are stored.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec encodes values with encoding/json.
type JSONCodec struct{}

// Marshal encodes v as JSON.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON data into v.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
