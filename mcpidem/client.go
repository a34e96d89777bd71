package mcpidem

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the client middleware's options, the same as the HTTP and
// gRPC clients'.
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
)

// codeRejected is the code of the SDK's "rejected by transport" error,
// which its HTTP transport wraps into the errors of a request that did
// not reach the server or got a transient HTTP status (429, 5xx) without
// an answer: a transport failure, not the server's answer.
const codeRejected = -32005

// NewKey returns a new idempotency key: a random (version 4) UUID. Make
// one per intent (a payment the agent decided to make, a message to send)
// and send it with every attempt of that intent ([WithKey]), including
// the retries made on a new session after one broke: a key made per
// attempt de-duplicates nothing. The client middleware makes one per
// CallTool when the caller gave none.
func NewKey() string { return edge.NewKey() }

type keyContext struct{}

// WithKey returns a copy of ctx that carries key as the idempotency key
// of the tool calls made with it through the client middleware, which
// sends it in the request's _meta and keeps it for every attempt. A key
// already in the call's params (Meta under [DefaultKeyMeta]) wins over
// it. Without the middleware, set the params' Meta entry instead:
//
//	params.Meta = mcp.Meta{mcpidem.DefaultKeyMeta: key}
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// A ClientOption configures the client middleware made by
// [ClientMiddleware].
type ClientOption interface{ applyClient(*clientConfig) }

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

type clientConfig struct {
	keyMeta        string
	tools          map[string]bool // nil: every tool
	badTool        bool
	attemptTimeout time.Duration
	backoff        edge.Backoff
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
// retried (its deadline is not the call's); the server goes on running
// the tool, and the retry gets its result replayed once it is stored, or
// CodeInProgress while it runs. Default: no bound but the call's
// deadline.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.attemptTimeout = d })
}

// WithBackoff sets the backoff before the first retry (min) and its cap
// (max): it doubles after every attempt up to max, and each wait is drawn
// from [0, backoff] ("full jitter"), or is the server's retryAfterMs if
// that is longer. Default: [DefaultMinBackoff], [DefaultMaxBackoff].
func WithBackoff(min, max time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.MinBackoff, c.backoff.MaxBackoff = min, max })
}

// WithClientTools sets the tools whose calls get a key and are retried,
// by name. Calls of other tools pass through untouched. Default: every
// tools/call through the middleware: install it only on sessions with
// servers that de-duplicate (run [ServerMiddleware] on the tools called),
// or name the tools here.
func WithClientTools(tools ...string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		var sc config
		WithTools(tools...).apply(&sc)
		c.tools, c.badTool = sc.tools, sc.badTool
	})
}

// WithClientKeyMeta sets the entry of a request's _meta that carries the
// idempotency key, which must be the server's ([WithKeyMeta]). Default:
// [DefaultKeyMeta]. (The client needs no replay mark: it never retries a
// result, and an error answer that is replayed says so in its data.)
func WithClientKeyMeta(name string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.keyMeta = name })
}

// ClientMiddleware returns an MCP client middleware (for
// mcp.Client.AddSendingMiddleware) that gives every tools/call an
// idempotency key and retries it safely: the server middleware
// de-duplicates the attempts, so a retry never repeats an effect, it gets
// the first attempt's result replayed.
//
// A call whose params carry a key in their _meta, or whose context does
// ([WithKey]), keeps it; any other call gets a fresh one ([NewKey]), made
// once per CallTool and sent with every attempt. The caller's params are
// not changed. A call is retried after a transport failure (the request
// did not reach the server, its connection broke before the answer, the
// HTTP transport got 429 or a 5xx without an answer, or the attempt's
// timeout, [WithAttemptTimeout], expired) and after the server
// middleware's answers that mean "retry with the same key":
// [CodeInProgress], [CodeStoreUnavailable] and [CodeInternal]. It is never
// retried after a result (a replayed one, a tool error, permanent or not:
// the tool's answer is the model's to read), after any other JSON-RPC
// error, after an answer marked replayed, or once the session's
// connection is closed (mcp.ErrConnectionClosed, mcp.ErrSessionMissing):
// a retry on a new session, with the same key ([WithKey]), is then the
// caller's.
//
// Between attempts it waits a random time between zero and
// MinBackoff·2^(n-1), capped at MaxBackoff ("full jitter", so that a crowd
// of agents does not retry in lockstep), or the server's retryAfterMs if
// that is longer. It stops after MaxAttempts attempts, when the next wait
// would end after MaxElapsed from the first attempt, or after the call's
// deadline; it then returns the last error as it is. A canceled context
// stops the retries at once.
//
// Only use it towards servers that de-duplicate the calls it retries:
// without the server middleware, a retried call can run twice.
// [WithClientTools] restricts it to those tools.
//
// ClientMiddleware returns an error wrapping
// [idempotency.ErrInvalidArgument] for an invalid option.
func ClientMiddleware(opts ...ClientOption) (mcp.Middleware, error) {
	c := &clientConfig{keyMeta: DefaultKeyMeta, backoff: edge.DefaultBackoff()}
	for _, o := range opts {
		if o == nil {
			return nil, invalidArg("nil option")
		}
		o.applyClient(c)
	}
	switch {
	case !validMetaKey(c.keyMeta):
		return nil, invalidArg("WithClientKeyMeta: invalid _meta key %q", c.keyMeta)
	case c.badTool:
		return nil, invalidArg("WithClientTools: an empty tool name")
	case c.tools != nil && len(c.tools) == 0:
		return nil, invalidArg("WithClientTools: no tools")
	case c.attemptTimeout < 0:
		return nil, invalidArg("WithAttemptTimeout: must not be negative, got %v", c.attemptTimeout)
	case c.backoff.Check() != "":
		return nil, invalidArg("%s, got %d attempts, %v elapsed, %v and %v backoff", c.backoff.Check(),
			c.backoff.MaxAttempts, c.backoff.MaxElapsed, c.backoff.MinBackoff, c.backoff.MaxBackoff)
	}
	return c.middleware, nil
}

func (c *clientConfig) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != methodCallTool {
			return next(ctx, method, req)
		}
		p, ok := req.GetParams().(*mcp.CallToolParams)
		if !ok || p == nil || (c.tools != nil && !c.tools[p.Name]) {
			return next(ctx, method, req)
		}
		keyed := c.withKey(ctx, req, p)
		if keyed == nil {
			return next(ctx, method, req)
		}
		req = keyed
		var res mcp.Result
		var err error
		// The last attempt's answer stands, also when the caller gave up.
		_ = c.backoff.Retry(ctx, func(ctx context.Context, _ int) edge.Answer {
			res, err = c.attempt(ctx, next, req)
			if err == nil {
				return edge.Answer{} // a result: never retried
			}
			hint, retry := c.retryable(err)
			return edge.Answer{Retry: retry, Hint: hint}
		})
		return res, err
	}
}

// withKey returns the request to send for every attempt of req, whose
// params are p: a copy whose _meta carries the key. It returns nil for a
// request of a type it does not know.
func (c *clientConfig) withKey(ctx context.Context, req mcp.Request, p *mcp.CallToolParams) mcp.Request {
	cp := *p
	cp.Meta = maps.Clone(p.Meta)
	if cp.Meta == nil {
		cp.Meta = mcp.Meta{}
	}
	if _, ok := cp.Meta[c.keyMeta]; !ok {
		key, _ := ctx.Value(keyContext{}).(string)
		if key == "" {
			key = NewKey()
		}
		cp.Meta[c.keyMeta] = key
	}
	// The SDK's CallTool sends a ClientRequest[Params]; the concrete type
	// is kept for middleware that asserts it.
	switch r := req.(type) {
	case *mcp.ClientRequest[mcp.Params]:
		return &mcp.ClientRequest[mcp.Params]{Session: r.Session, Params: &cp}
	case *mcp.ClientRequest[*mcp.CallToolParams]:
		return &mcp.ClientRequest[*mcp.CallToolParams]{Session: r.Session, Params: &cp}
	}
	return nil
}

// attempt makes one attempt, bounded by the attempt timeout.
func (c *clientConfig) attempt(ctx context.Context, next mcp.MethodHandler, req mcp.Request) (mcp.Result, error) {
	if c.attemptTimeout <= 0 {
		return next(ctx, methodCallTool, req)
	}
	actx, cancel := context.WithTimeout(ctx, c.attemptTimeout)
	defer cancel()
	return next(actx, methodCallTool, req)
}

// retryable reports whether a call that failed with err is retried, and
// the server's hint of when.
func (c *clientConfig) retryable(err error) (time.Duration, bool) {
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
		return 0, false // no attempt on this session can reach the server
	}
	if d, ok := DataOf(err); ok {
		switch {
		case d.Replayed:
			return 0, false
		case d.Reason == ReasonInProgress, d.Reason == ReasonStoreUnavailable, d.Reason == ReasonInternal:
			return time.Duration(d.RetryAfterMs) * time.Millisecond, true
		}
		return 0, false
	}
	// The server's own answer (a tool's protocol error, an unknown tool)
	// is final; a failure of the transport, or an attempt that timed out,
	// is not.
	return 0, !answered(err)
}

// answered reports whether err holds a JSON-RPC error the server sent,
// rather than only the transport's rejection of the request.
func answered(err error) bool {
	switch u := err.(type) {
	case *jsonrpc.Error:
		return u.Code != codeRejected
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if answered(e) {
				return true
			}
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return answered(e)
		}
	}
	return false
}
