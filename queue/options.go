package queue

import (
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the options.
const (
	// DefaultExpiresHeader is the response header in which a server
	// advertises when it forgets a key: an HTTP-date (RFC 9110 §5.6.7),
	// such as "Sun, 06 Nov 1994 08:49:37 GMT". It is an assumption shared
	// with the server side of this library, which is adding the header
	// under this name; [WithExpiresHeader] names another.
	DefaultExpiresHeader = "Idempotency-Key-Expires"
	// DefaultKeyLifetime is how long the server is assumed to keep a key
	// after a request with it first reached it, when it advertises no
	// expiry: the library's default retention.
	DefaultKeyLifetime = idempotency.DefaultRetention
	// DefaultAttemptTimeout bounds each attempt: a server that stops
	// answering must not hold the queue.
	DefaultAttemptTimeout = 30 * time.Second
	// DefaultMinBackoff is the backoff before an item's first retry.
	DefaultMinBackoff = edge.DefaultMinBackoff
	// DefaultMaxBackoff caps the doubling backoff. It is longer than the
	// in-process clients' (5s): a queue retries for hours, and an offline
	// client should not spin.
	DefaultMaxBackoff = time.Minute
	// DefaultLockTimeout bounds the wait for the file's lock at Open.
	DefaultLockTimeout = time.Second
	// ExpiryMargin is how long before a key's expiry the last retry must
	// start: it covers the clocks' disagreement left after the server's
	// Date header corrects it (a second) and the time a request takes.
	ExpiryMargin = time.Minute
	// markWindow is how many items of an order the submitter marks as
	// sent in one write, ahead of their first attempts (see entry.sent).
	markWindow = 1024
)

// An Option configures a queue made by [Open].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// A Handler is told the end of an item, once its answer is definitive
// (it.State is [Done]) or it stopped (it.State is [Dead]); it.Response is
// the answer. It is called at least once per end: a crash after it
// returned and before the item was removed calls it again after the
// restart, with the server's replay of the same answer
// (it.Response.Replayed). A non-nil error keeps the item: it is sent
// again after a backoff, and the handler called again. It runs on the
// submitter's goroutine, so the item's order waits for it; a panic in it
// is not recovered.
type Handler func(ctx context.Context, it *Item) error

type config struct {
	transport      http.RoundTripper
	keyHeader      string
	replayHeader   string
	expiresHeader  string
	methods        []string
	maxBody        int64
	maxResponse    int
	attemptTimeout time.Duration
	keyLifetime    time.Duration
	backoff        edge.Backoff
	concurrency    int
	onDone         Handler
	prepare        func(*http.Request) error
	lockTimeout    time.Duration
	now            func() time.Time
	margin         time.Duration // ExpiryMargin; tests shorten it
}

func defaultConfig() config {
	return config{
		transport:      http.DefaultTransport,
		keyHeader:      httpidem.DefaultKeyHeader,
		replayHeader:   httpidem.DefaultReplayHeader,
		expiresHeader:  DefaultExpiresHeader,
		methods:        httpidem.DefaultMethods,
		maxBody:        httpidem.DefaultMaxBodySize,
		maxResponse:    httpidem.DefaultMaxResponseSize,
		attemptTimeout: DefaultAttemptTimeout,
		keyLifetime:    DefaultKeyLifetime,
		backoff:        edge.Backoff{MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff},
		concurrency:    1,
		lockTimeout:    DefaultLockTimeout,
		now:            time.Now,
		margin:         ExpiryMargin,
	}
}

func (c *config) check() error {
	switch {
	case edge.IsNil(c.transport):
		return invalidArg("WithTransport: nil transport")
	case !edge.ValidToken(c.keyHeader):
		return invalidArg("WithKeyHeader: invalid header name %q", c.keyHeader)
	case !edge.ValidToken(c.replayHeader):
		return invalidArg("WithReplayHeader: invalid header name %q", c.replayHeader)
	case !edge.ValidToken(c.expiresHeader):
		return invalidArg("WithExpiresHeader: invalid header name %q", c.expiresHeader)
	case len(c.methods) == 0:
		return invalidArg("WithMethods: no methods")
	case c.maxBody <= 0:
		return invalidArg("WithMaxBodySize: must be positive, got %d", c.maxBody)
	case c.maxResponse <= 0:
		return invalidArg("WithMaxResponseSize: must be positive, got %d", c.maxResponse)
	case c.attemptTimeout <= 0:
		return invalidArg("WithAttemptTimeout: must be positive, got %v", c.attemptTimeout)
	case c.keyLifetime <= c.margin:
		return invalidArg("WithKeyLifetime: must be longer than ExpiryMargin (%v), got %v", c.margin, c.keyLifetime)
	case c.concurrency < 1:
		return invalidArg("WithConcurrency: must be at least 1, got %d", c.concurrency)
	case c.lockTimeout <= 0:
		return invalidArg("WithLockTimeout: must be positive, got %v", c.lockTimeout)
	}
	for _, m := range c.methods {
		if !edge.ValidToken(m) {
			return invalidArg("WithMethods: invalid method %q", m)
		}
		if m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions || m == http.MethodTrace {
			return invalidArg("WithMethods: %s is safe by definition (RFC 9110) and needs no key", m)
		}
	}
	// The queue retries until an answer is definitive, the key is about
	// to expire or an operator drops the item: no bound on attempts or
	// time but those (the deadline given to Next).
	c.backoff.MaxAttempts = int(^uint(0) >> 1)
	c.backoff.MaxElapsed = time.Duration(1<<63 - 1)
	c.backoff.Now = c.now
	if msg := c.backoff.Check(); msg != "" {
		return invalidArg("%s", msg)
	}
	return nil
}

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: queue: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
}

// WithTransport sets the http.RoundTripper that sends the items.
// Default: http.DefaultTransport. Do not give an [httpidem.Transport]:
// the queue retries by itself, across restarts.
func WithTransport(rt http.RoundTripper) Option {
	return optionFunc(func(c *config) { c.transport = rt })
}

// WithOnDone sets the handler told of every item's end (see [Handler]).
// Default: none; the answers are dropped once definitive.
func WithOnDone(h Handler) Option {
	return optionFunc(func(c *config) { c.onDone = h })
}

// WithPrepare sets a function that may change each attempt's request just
// before it is sent: add a fresh credential (an Authorization header that
// must not be stored in the file, or that expires before a retry hours
// later), a trace header. It must not change the method, URL or body:
// the server would answer 422, the key being reused for another request.
// An error fails the attempt, which is retried after a backoff.
// Default: none.
func WithPrepare(prepare func(req *http.Request) error) Option {
	return optionFunc(func(c *config) { c.prepare = prepare })
}

// WithKeyHeader sets the request header that carries the key; it must be
// the server's (httpidem.WithKeyHeader). Default:
// [httpidem.DefaultKeyHeader] ("Idempotency-Key").
func WithKeyHeader(name string) Option {
	return optionFunc(func(c *config) { c.keyHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// WithReplayHeader sets the response header that marks a replayed answer;
// it must be the server's (httpidem.WithReplayHeader). Default:
// [httpidem.DefaultReplayHeader] ("Idempotent-Replayed").
func WithReplayHeader(name string) Option {
	return optionFunc(func(c *config) { c.replayHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// WithExpiresHeader sets the response header in which the server
// advertises when it forgets the key (an HTTP-date). Default:
// [DefaultExpiresHeader].
func WithExpiresHeader(name string) Option {
	return optionFunc(func(c *config) { c.expiresHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// WithKeyLifetime sets how long the server keeps a key after a request
// with it first reached the server (the retention of its runner,
// idempotency.WithRetention), for servers that advertise no expiry: an
// item whose request may have reached the server is not retried after
// that time less [ExpiryMargin], since the server would run it again; it
// goes to the dead letters, saying so. An expiry the server advertises
// ([WithExpiresHeader]) overrides it. Default: [DefaultKeyLifetime].
func WithKeyLifetime(d time.Duration) Option {
	return optionFunc(func(c *config) { c.keyLifetime = d })
}

// WithMethods sets the methods whose requests the queue takes: the ones
// the server de-duplicates by key (httpidem.WithMethods). Default:
// [httpidem.DefaultMethods] (POST and PATCH).
func WithMethods(methods ...string) Option {
	return optionFunc(func(c *config) { c.methods = append([]string(nil), methods...) })
}

// WithMaxBodySize sets the largest request body Enqueue takes, in bytes;
// it should not exceed the server's (httpidem.WithMaxBodySize). Default:
// [httpidem.DefaultMaxBodySize].
func WithMaxBodySize(n int64) Option {
	return optionFunc(func(c *config) { c.maxBody = n })
}

// WithMaxResponseSize sets how much of a response body is kept for the
// handler and the dead letters, in bytes; the rest is discarded and the
// Response marked Truncated. Default: [httpidem.DefaultMaxResponseSize].
func WithMaxResponseSize(n int) Option {
	return optionFunc(func(c *config) { c.maxResponse = n })
}

// WithAttemptTimeout bounds each attempt, the reading of the response
// included. An attempt that times out is retried like a network error.
// Default: [DefaultAttemptTimeout].
func WithAttemptTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.attemptTimeout = d })
}

// WithBackoff sets the backoff before an item's first retry (min) and its
// cap (max): it doubles after every failed attempt up to max, and each
// wait is drawn from [0, backoff] ("full jitter"), or is the server's
// Retry-After if that is longer. A restart starts it again from min.
// Default: [DefaultMinBackoff], [DefaultMaxBackoff].
func WithBackoff(min, max time.Duration) Option {
	return optionFunc(func(c *config) { c.backoff.MinBackoff, c.backoff.MaxBackoff = min, max })
}

// WithConcurrency sets how many items are sent at once. Items of one
// ordering key are always sent one after the other; a larger n lets
// items of different ordering keys overlap. Default: 1.
func WithConcurrency(n int) Option {
	return optionFunc(func(c *config) { c.concurrency = n })
}

// WithLockTimeout bounds how long Open waits for the file's lock, held by
// another process that has the queue open. Default: [DefaultLockTimeout].
func WithLockTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lockTimeout = d })
}
