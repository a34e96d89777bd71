package httpidem

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the [Transport]'s fields.
const (
	DefaultMaxAttempts = 5
	DefaultMaxElapsed  = 30 * time.Second
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 5 * time.Second
)

// Transport is an http.RoundTripper that retries the requests carrying an
// idempotency key, which the server de-duplicates, so a retry never
// repeats an effect: the server replays the first response instead.
//
// A request with a key is retried after a network error (including
// AttemptTimeout expiring), and after a response with status 5xx, 429 or
// 409 (the key in use by an earlier attempt still running); never after
// any other status, and never after a replayed response (one that carries
// the replay header, Idempotent-Replayed: true), whatever its status: it
// is the stored outcome of the first request, and every retry would get it
// again. Between attempts it waits a random time between zero
// and MinBackoff·2^(n-1), capped at MaxBackoff ("full jitter", so that a
// crowd of clients does not retry in lockstep), or the response's
// Retry-After if that is longer. It stops after MaxAttempts attempts, or
// when the next wait would end after MaxElapsed from the first attempt;
// it then returns the last response or error as it is.
//
// Every attempt sends the same key and, through Request.GetBody, the same
// body (http.NewRequest sets GetBody for the usual body types). A request
// with a body but no GetBody, or without a key, is sent once.
//
// MaxElapsed bounds when attempts start; bound an attempt itself with
// AttemptTimeout, and the whole call with the request's context or
// http.Client.Timeout. A canceled context stops the retries at once.
//
// The zero value is ready to use. Set the fields before the first request
// and do not change them afterwards.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper
	// KeyHeader names the key header. "" means [DefaultKeyHeader].
	KeyHeader string
	// ReplayHeader names the header by which the server marks a replayed
	// response. "" means [DefaultReplayHeader].
	ReplayHeader string
	// MaxAttempts bounds the attempts per request, the first included.
	// 0 means [DefaultMaxAttempts].
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of
	// the last one. 0 means [DefaultMaxElapsed].
	MaxElapsed time.Duration
	// AttemptTimeout bounds one attempt, until its response headers (the
	// body of the response returned stays readable). A client that gives
	// up on a slow attempt and retries gets the first attempt's response
	// replayed once it is stored. 0 means no bound.
	AttemptTimeout time.Duration
	// MinBackoff is the backoff before the first retry; it doubles after
	// every attempt until it reaches MaxBackoff, and stays there however
	// many attempts MaxAttempts allows. Each wait is drawn from
	// [0, backoff], so no wait exceeds MaxBackoff unless a Retry-After
	// asks for longer. 0 means [DefaultMinBackoff] and
	// [DefaultMaxBackoff].
	MinBackoff, MaxBackoff time.Duration

	// Sleep waits d or until ctx is done (returning its error). Nil means
	// a timer. Tests set it to record the waits instead of sleeping.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock of MaxElapsed and of Retry-After dates. Nil means
	// time.Now.
	Now func() time.Time
	// Jitter returns a random duration in [0, d]. Nil means uniform.
	Jitter func(d time.Duration) time.Duration
}

// RoundTrip sends req, retrying as [Transport] describes.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	name := DefaultKeyHeader
	if t.KeyHeader != "" {
		name = textproto.CanonicalMIMEHeaderKey(t.KeyHeader)
	}
	replayed := DefaultReplayHeader
	if t.ReplayHeader != "" {
		replayed = textproto.CanonicalMIMEHeaderKey(t.ReplayHeader)
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	if len(req.Header[name]) == 0 || !rewindable {
		return t.attempt(base, req)
	}

	maxAttempts := or(t.MaxAttempts, DefaultMaxAttempts)
	maxElapsed := or(t.MaxElapsed, DefaultMaxElapsed)
	minBackoff := or(t.MinBackoff, DefaultMinBackoff)
	maxBackoff := or(t.MaxBackoff, DefaultMaxBackoff)
	now := t.Now
	if now == nil {
		now = time.Now
	}
	ctx := req.Context()
	start := now()
	backoff := minBackoff
	for n := 1; ; n++ {
		r := req
		if n > 1 {
			r = req.Clone(ctx)
			if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				r.Body = body
			}
		}
		resp, err := t.attempt(base, r)
		if ctx.Err() != nil {
			// The caller gave up: no retry, and its error wins.
			if err == nil {
				resp.Body.Close()
			}
			return nil, ctx.Err()
		}
		if !retryable(resp, err, replayed) || n >= maxAttempts {
			return resp, err
		}
		wait := t.jitter(min(backoff, maxBackoff))
		// Double up to the cap and stay there: doubling without bound
		// would overflow after a few dozen attempts into a negative
		// backoff, and the retries would run in a tight loop.
		if backoff >= maxBackoff/2 {
			backoff = maxBackoff
		} else {
			backoff *= 2
		}
		if resp != nil {
			if ra, ok := edge.RetryAfter(resp.Header.Get("Retry-After"), now()); ok && ra > wait {
				wait = ra
			}
		}
		if now().Add(wait).Sub(start) > maxElapsed {
			return resp, err
		}
		if resp != nil {
			// Drain a little so the connection can be reused.
			io.CopyN(io.Discard, resp.Body, 64<<10)
			resp.Body.Close()
		}
		if err := t.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// attempt sends one attempt, bounded by AttemptTimeout.
func (t *Transport) attempt(base http.RoundTripper, r *http.Request) (*http.Response, error) {
	if t.AttemptTimeout <= 0 {
		return base.RoundTrip(r)
	}
	ctx, cancel := context.WithTimeout(r.Context(), t.AttemptTimeout)
	resp, err := base.RoundTrip(r.WithContext(ctx))
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

func retryable(resp *http.Response, err error, replayHeader string) bool {
	if err != nil {
		return true
	}
	if v := resp.Header[replayHeader]; len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "true") {
		return false
	}
	s := resp.StatusCode
	return s >= 500 || s == http.StatusTooManyRequests || s == http.StatusConflict
}

func (t *Transport) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if t.Jitter != nil {
		return t.Jitter(d)
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if t.Sleep != nil {
		return t.Sleep(ctx, d)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
