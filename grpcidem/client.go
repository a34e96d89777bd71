package grpcidem

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the client interceptor's options, the same as httpidem's
// Transport's.
const (
	// DefaultMaxAttempts bounds the attempts of a call, the first
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
	// DefaultMaxLeaseWait bounds how long after its first attempt a call
	// keeps retrying an Aborted answer that tells the time left on the
	// holder's lease ([WithMaxLeaseWait]).
	DefaultMaxLeaseWait = edge.DefaultMaxLeaseWait
)

// NewKey returns a new idempotency key: a random (version 4) UUID. Make
// one per user intent (a click on "Pay", a job to submit) and send it with
// every attempt of that intent ([WithKey]), including the retries a user
// starts by hand after an error: a key made per attempt de-duplicates
// nothing. The client interceptor makes one per call when the caller gave
// none.
func NewKey() string { return edge.NewKey() }

// WithKey returns a copy of ctx whose outgoing metadata carries key as the
// idempotency key (under [DefaultKeyMetadata]), for a call through the
// client interceptor, which then keeps it for every attempt, or through
// any gRPC client.
func WithKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, DefaultKeyMetadata, key)
}

// A ClientOption configures the client interceptor made by
// [UnaryClientInterceptor].
type ClientOption interface{ applyClient(*clientConfig) }

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

type clientConfig struct {
	keyMD, replayMD string
	methods         map[string]bool // nil: every method
	attemptTimeout  time.Duration
	backoff         edge.Backoff
	badMethod       string
}

// WithMaxAttempts bounds the attempts per call, the first included.
// Default: [DefaultMaxAttempts].
func WithMaxAttempts(n int) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MaxAttempts = n })
}

// WithMaxElapsed bounds the time from the first attempt to the start of
// the last one; the call's deadline bounds it too.
// Default: [DefaultMaxElapsed].
func WithMaxElapsed(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MaxElapsed = d })
}

// WithAttemptTimeout bounds each attempt. An attempt that times out is
// retried (its DeadlineExceeded is not the call's); the retry gets the
// first attempt's reply replayed once it is stored, or Aborted while it
// runs. Default: no bound but the call's deadline.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.attemptTimeout = d })
}

// WithBackoff sets the backoff before the first retry (min) and its cap
// (max): it doubles after every attempt up to max, and each wait is drawn
// from [0, backoff] ("full jitter"), or is the server's RetryInfo delay if
// that is longer. Default: [DefaultMinBackoff], [DefaultMaxBackoff].
func WithBackoff(min, max time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MinBackoff, c.backoff.MaxBackoff = min, max })
}

// WithMaxLeaseWait bounds how long after the first attempt the
// interceptor keeps retrying an Aborted answer (reason [ReasonInProgress])
// that tells the time left on the lease of the call holding the key
// ([LeaseRemaining]). Such an answer extends [WithMaxElapsed] to that
// lease's end (and a second), so that when the holder crashed, a retry
// arrives once its lease has ended and takes the key over, and it does
// not count against [WithMaxAttempts]; the waits are still the backoff's
// and RetryInfo's. The call's deadline still bounds it. 0 turns this off.
// Default: [DefaultMaxLeaseWait] (1 minute).
func WithMaxLeaseWait(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MaxLeaseWait = d })
}

// WithClientMethods sets the methods whose calls get a key and are
// retried: full method names or whole services ("/package.Service/"), as
// for [WithMethods]. Calls of other methods pass through untouched.
// Default: every call through the interceptor: install it only on
// connections to services that de-duplicate (run [UnaryServerInterceptor]
// on the methods called), or name the methods here.
func WithClientMethods(methods ...string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		var sc config
		WithMethods(methods...).apply(&sc)
		c.methods, c.badMethod = sc.methods, sc.badMethod
	})
}

// WithClientMetadata sets the metadata keys of the idempotency key and of
// the replay mark, which must be the server's ([WithKeyMetadata],
// [WithReplayMetadata]). Default: [DefaultKeyMetadata],
// [DefaultReplayMetadata].
func WithClientMetadata(key, replay string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		c.keyMD, c.replayMD = strings.ToLower(key), strings.ToLower(replay)
	})
}

// UnaryClientInterceptor returns a gRPC unary client interceptor that
// gives every call an idempotency key and retries it safely: the server
// interceptor de-duplicates the attempts, so a retry never repeats an
// effect, it gets the first attempt's answer replayed.
//
// A call whose outgoing metadata carries a key ([WithKey]) keeps it;
// any other call gets a fresh one ([NewKey]), made once per call and sent
// with every attempt. A call is retried after a failure with code
// Unavailable (the connection broke, or the idempotency store is down),
// Aborted (an earlier attempt with the key is still running),
// ResourceExhausted, Internal, Unknown, or DeadlineExceeded when the
// attempt's timeout ([WithAttemptTimeout]), not the call's, expired;
// never after any other code, and never after an answer marked replayed
// (idempotent-replayed: true), whatever its code: it is the stored
// outcome of the first attempt, and every retry would get it again.
//
// Between attempts it waits a random time between zero and
// MinBackoff·2^(n-1), capped at MaxBackoff ("full jitter", so that a crowd
// of clients does not retry in lockstep), or the delay of the server's
// [errdetails.RetryInfo] if that is longer. It stops after MaxAttempts
// attempts, when the next wait would end after MaxElapsed from the first
// attempt, or after the call's deadline; it then returns the last error
// as it is. A canceled context stops the retries at once.
//
// Only use it towards servers that de-duplicate the calls it retries:
// without the server interceptor, a retried call can run twice.
// [WithClientMethods] restricts it to those methods.
//
// UnaryClientInterceptor returns an error wrapping
// [idempotency.ErrInvalidArgument] for an invalid option.
func UnaryClientInterceptor(opts ...ClientOption) (grpc.UnaryClientInterceptor, error) {
	c := clientConfig{
		keyMD:    DefaultKeyMetadata,
		replayMD: DefaultReplayMetadata,
		backoff:  edge.DefaultBackoff(),
	}
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
	case !validMetadataKey(c.keyMD):
		return nil, invalidArg("WithClientMetadata: invalid key metadata %q", c.keyMD)
	case !validMetadataKey(c.replayMD):
		return nil, invalidArg("WithClientMetadata: invalid replay metadata %q", c.replayMD)
	case c.badMethod != "":
		return nil, invalidArg("WithClientMethods: %q is not a full method name (\"/package.Service/Method\") nor a service (\"/package.Service/\")", c.badMethod)
	case c.methods != nil && len(c.methods) == 0:
		return nil, invalidArg("WithClientMethods: no methods")
	case c.attemptTimeout < 0:
		return nil, invalidArg("WithAttemptTimeout: must not be negative, got %v", c.attemptTimeout)
	}
	return c.intercept, nil
}

func (c *clientConfig) managed(method string) bool {
	if c.methods == nil || c.methods[method] {
		return true
	}
	i := strings.LastIndexByte(method, '/')
	return i > 0 && c.methods[method[:i+1]]
}

func (c *clientConfig) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !c.managed(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(c.keyMD)) == 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, c.keyMD, NewKey())
	}
	var header, trailer metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&header), grpc.Trailer(&trailer))
	var err error
	c.backoff.Retry(ctx, func(ctx context.Context, n int) edge.Answer {
		header, trailer = nil, nil
		err = c.attempt(ctx, method, req, reply, cc, invoker, opts)
		return c.answer(err, header, trailer)
	})
	// A canceled call or an expired key: the last error stands too.
	return err
}

// answer tells the retry loop what an attempt's outcome means.
func (c *clientConfig) answer(err error, header, trailer metadata.MD) edge.Answer {
	if err == nil || !c.retryable(err, header, trailer) {
		return edge.Answer{}
	}
	a := edge.Answer{Retry: true}
	a.Hint, _ = RetryDelay(err)
	if status.Code(err) == codes.Aborted {
		a.LeaseLeft, _ = LeaseRemaining(err)
	}
	return a
}

// attempt makes one attempt, bounded by the attempt timeout.
func (c *clientConfig) attempt(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	if c.attemptTimeout <= 0 {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	actx, cancel := context.WithTimeout(ctx, c.attemptTimeout)
	defer cancel()
	return invoker(actx, method, req, reply, cc, opts...)
}

func (c *clientConfig) retryable(err error, header, trailer metadata.MD) bool {
	for _, md := range []metadata.MD{header, trailer} {
		if v := md.Get(c.replayMD); len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "true") {
			return false
		}
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.Internal, codes.Unknown, codes.DeadlineExceeded:
		return true
	}
	return false
}
