package httpidem

import (
	"context"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the [Transport]'s options, the same as grpcidem's client
// interceptor's.
const (
	// DefaultMaxAttempts bounds the attempts of a request, the first
	// included ([WithMaxAttempts]).
	DefaultMaxAttempts = edge.DefaultMaxAttempts
	// DefaultMaxElapsed bounds the time from the first attempt to the
	// start of the last ([WithMaxElapsed]).
	DefaultMaxElapsed = edge.DefaultMaxElapsed
	// DefaultMinBackoff is the backoff before the first retry
	// ([WithBackoff]).
	DefaultMinBackoff = edge.DefaultMinBackoff
	// DefaultMaxBackoff caps the doubling backoff ([WithBackoff]).
	DefaultMaxBackoff = edge.DefaultMaxBackoff
	// DefaultMaxLeaseWait bounds how long after its first attempt a
	// request keeps retrying a 409 that tells the time left on the
	// holder's lease ([WithMaxLeaseWait]).
	DefaultMaxLeaseWait = edge.DefaultMaxLeaseWait
)

// ErrKeyExpired is the error of a [Transport]'s RoundTrip that stopped
// retrying because the key's advertised expiry (the [DefaultExpiresHeader]
// of an earlier attempt's response) has passed or would pass before the
// next attempt: the server would no longer know the key, and a retry
// could run the request a second time.
var ErrKeyExpired = edge.ErrKeyExpired

// A ClientOption configures the [Transport] made by [NewTransport].
type ClientOption interface{ applyClient(*clientConfig) }

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

type clientConfig struct {
	base                    http.RoundTripper
	keyHeader, replayHeader string // canonical
	expiresHeader           string // canonical; "": ignored
	autoKey                 []string
	attemptTimeout          time.Duration
	backoff                 edge.Backoff
}

func defaultClientConfig() clientConfig {
	return clientConfig{
		base:          http.DefaultTransport,
		keyHeader:     DefaultKeyHeader,
		replayHeader:  DefaultReplayHeader,
		expiresHeader: DefaultExpiresHeader,
		autoKey:       DefaultMethods,
		backoff:       edge.DefaultBackoff(),
	}
}

// defaultClient is the configuration of a zero Transport.
var defaultClient = defaultClientConfig()

// WithBase sets the RoundTripper that sends each attempt.
// Default: http.DefaultTransport.
func WithBase(rt http.RoundTripper) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.base = rt })
}

// WithClientHeaders sets the names of the key header and of the replay
// header, which must be the server's ([WithKeyHeader],
// [WithReplayHeader]). Default: [DefaultKeyHeader], [DefaultReplayHeader].
func WithClientHeaders(key, replay string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		c.keyHeader, c.replayHeader = textproto.CanonicalMIMEHeaderKey(key), textproto.CanonicalMIMEHeaderKey(replay)
	})
}

// WithClientExpiresHeader names the response header from which the
// Transport reads until when the server honours the key (the server's
// [WithExpiresHeader]); "" ignores it. Default: [DefaultExpiresHeader].
func WithClientExpiresHeader(name string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.expiresHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// WithAutoKey sets the methods of the requests to which the Transport
// attaches a key of its own ([NewKey]) when they have none, so that they
// are retried safely: one key per RoundTrip, sent by every attempt of
// that call and never by another. WithAutoKey() attaches none. Default:
// [DefaultMethods] (POST and PATCH), as Stripe's SDKs do.
//
// A key made by the Transport covers the retries the Transport makes. It
// cannot cover a retry the caller makes by calling RoundTrip (or
// http.Client.Do) again for the same intent, nor a redirect that
// http.Client follows as a new request: those get a new key, so the
// server runs them again. A caller that retries by itself must make the
// intent's key ([NewKey], [SetKey]) and send it with every call, as
// before. A request with a body that cannot be rewound (no GetBody) gets
// a key but is sent once.
func WithAutoKey(methods ...string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.autoKey = append([]string(nil), methods...) })
}

// WithMaxAttempts bounds the attempts per request, the first included.
// Default: [DefaultMaxAttempts].
func WithMaxAttempts(n int) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MaxAttempts = n })
}

// WithMaxElapsed bounds the time from the first attempt to the start of
// the last one; the request's context deadline bounds it too.
// Default: [DefaultMaxElapsed].
func WithMaxElapsed(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MaxElapsed = d })
}

// WithAttemptTimeout bounds one attempt, until its response headers (the
// body of the response returned stays readable). An attempt that times
// out is retried; the retry gets the first attempt's response replayed
// once it is stored, or 409 while it runs. Default: no bound but the
// request's context.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.attemptTimeout = d })
}

// WithBackoff sets the backoff before the first retry (min) and its cap
// (max): it doubles after every attempt up to max and stays there, and
// each wait is drawn from [0, backoff] ("full jitter"), or is the
// response's Retry-After if that is longer. Default: [DefaultMinBackoff],
// [DefaultMaxBackoff].
func WithBackoff(min, max time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MinBackoff, c.backoff.MaxBackoff = min, max })
}

// WithMaxLeaseWait bounds how long after the first attempt the Transport
// keeps retrying a 409 whose [LeaseHeader] tells the time left on the
// lease of the request that holds the key. Such a 409 extends
// [WithMaxElapsed] to that lease's end (and a second), so that when the
// holder crashed, a retry arrives once its lease has ended and takes the
// key over, and it does not count against [WithMaxAttempts]; the waits
// are still the backoff's and Retry-After's. With every default, a
// request whose first attempt crashed the server survives the server's
// default 30 s lease. 0 turns this off: a 409 counts like a 503.
// Default: [DefaultMaxLeaseWait] (1 minute).
func WithMaxLeaseWait(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MaxLeaseWait = d })
}

// NewTransport returns a [Transport] configured by opts. It returns an
// error wrapping [idempotency.ErrInvalidArgument], naming the option, for
// an invalid one.
func NewTransport(opts ...ClientOption) (*Transport, error) {
	c := defaultClientConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalidArg("nil option")
		}
		o.applyClient(&c)
	}
	if why := c.backoff.Check(); why != "" {
		return nil, invalidArg("%s", why)
	}
	switch {
	case edge.IsNil(c.base):
		return nil, invalidArg("WithBase: nil RoundTripper")
	case !validHeaderName(c.keyHeader):
		return nil, invalidArg("WithClientHeaders: invalid key header name %q", c.keyHeader)
	case !validHeaderName(c.replayHeader):
		return nil, invalidArg("WithClientHeaders: invalid replay header name %q", c.replayHeader)
	case c.expiresHeader != "" && !validHeaderName(c.expiresHeader):
		return nil, invalidArg("WithClientExpiresHeader: invalid header name %q", c.expiresHeader)
	case c.attemptTimeout < 0:
		return nil, invalidArg("WithAttemptTimeout: must not be negative, got %v", c.attemptTimeout)
	}
	return &Transport{cfg: &c}, nil
}

// Transport is an http.RoundTripper that retries the requests carrying an
// idempotency key, which the server de-duplicates, so a retry never
// repeats an effect: the server replays the first response instead. Make
// one with [NewTransport]; the zero value uses every default.
//
// A request with a key is retried after a network error (including
// [WithAttemptTimeout] expiring), and after a response with status 5xx,
// 429 or 409 (the key in use by an earlier attempt still running); never
// after any other status, and never after a replayed response (one that
// carries the replay header, Idempotent-Replayed: true), whatever its
// status: it is the stored outcome of the first request, and every retry
// would get it again. Between attempts it waits a random time between
// zero and MinBackoff·2^(n-1), capped at MaxBackoff ("full jitter", so
// that a crowd of clients does not retry in lockstep), or the response's
// Retry-After if that is longer ([WithBackoff]). It stops after
// [WithMaxAttempts] attempts, or when the next wait would end after
// [WithMaxElapsed] from the first attempt or after the request context's
// deadline; it then returns the last response or error as it is. A 409
// that tells the time left on the holder's lease ([LeaseHeader]) extends
// that budget to the lease's end, within [WithMaxLeaseWait] (1 minute) of
// the first attempt, and does not count as an attempt: a holder that
// crashed is taken over by the retry after its lease (the server's
// default lease is 30 s).
//
// Every attempt sends the same key and, through Request.GetBody, the same
// body (http.NewRequest sets GetBody for the usual body types). A POST or
// PATCH without a key gets one made for the call ([WithAutoKey]). A
// request with a body but no GetBody, or without a key, is sent once.
//
// A response that tells until when the server honours the key
// ([DefaultExpiresHeader], an HTTP-date) stops the retries once that time
// has passed or would pass before the next attempt: the RoundTrip then
// returns an error matching [ErrKeyExpired] (the server would no longer
// know the key, and could run the request again). A malformed or absurd
// expiry is ignored; an expiry never makes the Transport retry longer.
//
// Bound an attempt itself with [WithAttemptTimeout], and the whole call
// with the request's context or http.Client.Timeout. A canceled context
// stops the retries at once.
//
// Only use it towards servers that de-duplicate the requests it retries
// (the [New] middleware): without it, a retried request can run twice.
type Transport struct {
	cfg *clientConfig // nil: the defaults
}

// RoundTrip sends req, retrying as [Transport] describes.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c := t.cfg
	if c == nil {
		c = &defaultClient
	}
	if len(req.Header[c.keyHeader]) == 0 && slices.Contains(c.autoKey, req.Method) {
		// A RoundTripper must not change the caller's request.
		req = req.Clone(req.Context())
		req.Header[c.keyHeader] = []string{NewKey()}
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	if len(req.Header[c.keyHeader]) == 0 || !rewindable {
		return c.attempt(req)
	}
	var (
		resp *http.Response
		err  error
	)
	ctx := req.Context()
	rerr := c.backoff.Retry(ctx, func(ctx context.Context, n int) edge.Answer {
		r := req
		if n > 1 {
			r = req.Clone(ctx)
			if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
				body, gerr := req.GetBody()
				if gerr != nil {
					resp, err = nil, gerr
					return edge.Answer{}
				}
				r.Body = body
			}
		}
		sent := c.now()
		resp, err = c.attempt(r)
		return c.answer(resp, err, sent)
	})
	if rerr != nil {
		// The caller gave up (its error wins), or the key expired.
		if resp != nil && err == nil {
			resp.Body.Close()
		}
		return nil, rerr
	}
	return resp, err
}

// answer tells the retry loop what an attempt's outcome means.
func (c *clientConfig) answer(resp *http.Response, err error, sent time.Time) edge.Answer {
	if err != nil {
		return edge.Answer{Retry: true}
	}
	a := edge.Answer{Retry: c.retryable(resp)}
	if c.expiresHeader != "" {
		a.Expires = expiresAt(resp.Header.Get(c.expiresHeader), sent)
	}
	if !a.Retry {
		return a
	}
	a.Hint, _ = edge.RetryAfter(resp.Header.Get("Retry-After"), c.now())
	if resp.StatusCode == http.StatusConflict {
		a.LeaseLeft = leaseLeft(resp.Header.Get(LeaseHeader))
	}
	a.Discard = func() {
		// Drain a little so the connection can be reused.
		io.CopyN(io.Discard, resp.Body, 64<<10)
		resp.Body.Close()
	}
	return a
}

// now is the clock of the retries: time.Now but in tests.
func (c *clientConfig) now() time.Time {
	if c.backoff.Now != nil {
		return c.backoff.Now()
	}
	return time.Now()
}

// attempt sends one attempt, bounded by the attempt timeout.
func (c *clientConfig) attempt(r *http.Request) (*http.Response, error) {
	if c.attemptTimeout <= 0 {
		return c.base.RoundTrip(r)
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.attemptTimeout)
	resp, err := c.base.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody releases an attempt's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// ShouldRetry reports whether the [Transport] would retry, with the same
// key, an attempt that ended with resp or err (with the default header
// names): after a network error, and after a 5xx, 429 or 409 that is not
// marked replayed. It is the rule to give the retry policy of another
// client, such as go-retryablehttp's CheckRetry (see the examples
// module's clients package).
func ShouldRetry(resp *http.Response, err error) bool {
	return err != nil || (resp != nil && defaultClient.retryable(resp))
}

func (c *clientConfig) retryable(resp *http.Response) bool {
	if v := resp.Header[c.replayHeader]; len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "true") {
		return false
	}
	s := resp.StatusCode
	return s >= 500 || s == http.StatusTooManyRequests || s == http.StatusConflict
}

// expiresAt parses an expiry header, an HTTP-date; zero for none, or for
// a value that is malformed or absurd: earlier than the attempt that got
// it was sent (the server has just answered for the key), or more than
// ten years ahead. An expiry only ever stops retries sooner.
func expiresAt(v string, sent time.Time) time.Time {
	if v == "" {
		return time.Time{}
	}
	t, err := http.ParseTime(v)
	if err != nil || t.Before(sent.Truncate(time.Second)) || t.After(sent.AddDate(10, 0, 0)) {
		return time.Time{}
	}
	return t
}

// leaseLeft parses a [LeaseHeader] value, delay-seconds; 0 for none, or
// for a value that is malformed or longer than a day.
func leaseLeft(v string) time.Duration {
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil || s < 0 || s > int64(24*time.Hour/time.Second) {
		return 0
	}
	return time.Duration(s) * time.Second
}
