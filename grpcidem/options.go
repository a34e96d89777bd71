package grpcidem

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the server interceptor's options.
const (
	// DefaultKeyMetadata is the request metadata key that carries the
	// idempotency key: the HTTP header's name, lower-cased as gRPC
	// metadata keys are.
	DefaultKeyMetadata = "idempotency-key"
	// DefaultReplayMetadata is the response metadata key set to "true" on
	// every replayed response (in the header, and also in the trailer of
	// a replayed error).
	DefaultReplayMetadata = "idempotent-replayed"
	// DefaultMaxResponseSize is the largest stored response, in bytes
	// (256 KiB): the marshalled reply or status plus a few bytes of
	// framing. Mind the runner's [idempotency.WithMaxResultSize].
	DefaultMaxResponseSize = 256 << 10
	// DefaultMaxRetryAfter caps the retry delay sent with an Aborted
	// answer while another call with the key runs: the holder's remaining
	// lease bounds a crash, not the usual run, which is much shorter. It
	// is the HTTP middleware's default too.
	DefaultMaxRetryAfter = time.Second
)

// An Option configures the server interceptor made by
// [UnaryServerInterceptor].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// FingerprintFunc computes the fingerprint of a call from its full method
// name ("/package.Service/Method") and its request message.
type FingerprintFunc func(fullMethod string, req any) (idempotency.Fingerprint, error)

// ScopeFunc returns the scope of a call: the tenant, the authenticated
// peer (see google.golang.org/grpc/peer and credentials.AuthInfo), the
// method, anything that must keep one client's key from reaching
// another's record. It gets the call's context (incoming metadata, peer)
// and its full method name. The parts are encoded into the storage key
// without ambiguity; each must be non-empty, valid UTF-8 without control
// characters.
//
// A non-nil error rejects the call: the handler does not run and nothing
// is claimed. An error carrying a gRPC status (status.Error(codes.Unauthenticated,
// "log in first"), also wrapped) is sent with its code, message and
// details, unless its code is OK or Unknown; any other error gives
// PermissionDenied with a generic message (the error's text is not sent,
// as it may describe internals). Either way the error carries an
// [errdetails.ErrorInfo] of reason [ReasonScopeRejected] (added to the
// scope function's status unless it has one of [ErrorDomain]). No parts,
// or an empty part, is rejected the same way: a missing tenant must not
// fall back to a key space shared with other calls that lack one.
type ScopeFunc func(ctx context.Context, fullMethod string) ([]string, error)

type config struct {
	keyMD         string
	replayMD      string
	methods       map[string]bool // nil: by idempotency_level
	required      func(ctx context.Context, fullMethod string) bool
	scope         ScopeFunc
	sharedKeys    bool
	validate      func(string) error
	fingerprint   FingerprintFunc
	maxResponse   int
	maxRetryAfter time.Duration
	badMethod     string // the first invalid name given to WithMethods
	render        ErrorRenderer
	renderSet     bool
	observer      idempotency.Observer
}

func defaultConfig() config {
	return config{
		keyMD:         DefaultKeyMetadata,
		replayMD:      DefaultReplayMetadata,
		fingerprint:   DefaultFingerprint,
		maxResponse:   DefaultMaxResponseSize,
		maxRetryAfter: DefaultMaxRetryAfter,
	}
}

func (c *config) validateConfig() error {
	switch {
	case !validMetadataKey(c.keyMD):
		return invalidArg("WithKeyMetadata: invalid metadata key %q", c.keyMD)
	case !validMetadataKey(c.replayMD):
		return invalidArg("WithReplayMetadata: invalid metadata key %q", c.replayMD)
	case edge.ScopeChoice(c.scope != nil, c.sharedKeys) != "":
		return invalidArg("%s", edge.ScopeChoice(c.scope != nil, c.sharedKeys))
	case c.badMethod != "":
		return invalidArg("WithMethods: %q is not a full method name (\"/package.Service/Method\") nor a service (\"/package.Service/\")", c.badMethod)
	case c.methods != nil && len(c.methods) == 0:
		return invalidArg("WithMethods: no methods")
	case c.fingerprint == nil:
		return invalidArg("WithFingerprint: nil function")
	case c.maxResponse <= 0:
		return invalidArg("WithMaxResponseSize: must be positive, got %d", c.maxResponse)
	case c.maxRetryAfter < idempotency.MinRetryAfter:
		return invalidArg("WithMaxRetryAfter: must be at least %v, got %v", idempotency.MinRetryAfter, c.maxRetryAfter)
	case c.renderSet && c.render == nil:
		return invalidArg("WithErrorRenderer: nil renderer")
	case edge.IsNil(c.observer) && c.observer != nil:
		return invalidArg("WithObserver: nil observer (%T)", c.observer)
	}
	return nil
}

// validMetadataKey reports whether s can name an ASCII metadata entry:
// lower-case letters, digits, '-', '_' and '.', not reserved by gRPC
// ("grpc-") and not binary ("-bin").
func validMetadataKey(s string) bool {
	if s == "" || strings.HasPrefix(s, "grpc-") || strings.HasSuffix(s, "-bin") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: grpcidem: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
}

// WithKeyMetadata sets the request metadata key that carries the
// idempotency key. Upper-case letters are lowered, as gRPC does.
// Default: [DefaultKeyMetadata] ("idempotency-key").
func WithKeyMetadata(name string) Option {
	return optionFunc(func(c *config) { c.keyMD = strings.ToLower(name) })
}

// WithReplayMetadata sets the response metadata key set to "true" on a
// replayed response. Default: [DefaultReplayMetadata]
// ("idempotent-replayed").
func WithReplayMetadata(name string) Option {
	return optionFunc(func(c *config) { c.replayMD = strings.ToLower(name) })
}

// WithMethods sets the methods whose calls are managed: full method names
// ("/payments.v1.Payments/Pay"), or whole services ("/payments.v1.Payments/").
// Calls of other methods pass through untouched, key or not.
//
// Default: every method, except those whose descriptor, found in the
// global registry of the generated code (protoregistry.GlobalFiles),
// declares option idempotency_level = NO_SIDE_EFFECTS or IDEMPOTENT: the
// gRPC counterpart of HTTP's GET and PUT, which the HTTP middleware does
// not manage either.
func WithMethods(methods ...string) Option {
	return optionFunc(func(c *config) {
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			i := strings.LastIndexByte(m, '/')
			if len(m) < 3 || m[0] != '/' || i <= 1 || strings.IndexByte(m[1:i], '/') >= 0 {
				if c.badMethod == "" {
					c.badMethod = m
				}
				continue
			}
			c.methods[m] = true
		}
	})
}

// WithRequired sets which managed calls must carry a key: when required
// returns true for a call without one, it fails with InvalidArgument
// (reason [ReasonKeyMissing]); when it returns false, the call passes
// through without idempotency. Default: every managed call requires a key.
func WithRequired(required func(ctx context.Context, fullMethod string) bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// WithScope sets the function that scopes every managed call's key (see
// [ScopeFunc]; [PeerScope] scopes by the mutual-TLS client certificate).
// [UnaryServerInterceptor] requires it, or [WithSharedKeySpace].
func WithScope(scope ScopeFunc) Option {
	return optionFunc(func(c *config) { c.scope = scope })
}

// WithSharedKeySpace puts the keys of every client into one key space: a
// client that sends another client's key gets that client's stored
// response. It is right only when a single client, or trusted clients
// that make keys no one else can guess (random UUIDs), call the service.
// [UnaryServerInterceptor] refuses a configuration with neither this nor
// [WithScope], so that sharing is always a choice made by name.
func WithSharedKeySpace() Option {
	return optionFunc(func(c *config) { c.sharedKeys = true })
}

// WithKeyValidator adds a check of the key, after the runner's own rules
// (non-empty, at most 255 bytes by default, valid UTF-8, no control
// characters). A non-nil error fails the call with InvalidArgument
// (reason [ReasonKeyMalformed]) and the error's message. Default: none.
func WithKeyValidator(validate func(key string) error) Option {
	return optionFunc(func(c *config) { c.validate = validate })
}

// WithFingerprint replaces the request fingerprint. A non-nil error fails
// the call with InvalidArgument (reason [ReasonBadRequest]) before
// anything is claimed. Default: [DefaultFingerprint].
func WithFingerprint(f FingerprintFunc) Option {
	return optionFunc(func(c *config) { c.fingerprint = f })
}

// WithMaxResponseSize sets the largest stored response, in bytes. A
// larger reply is sent to its caller, and a marker is stored instead:
// every retry fails with FailedPrecondition (reason
// [ReasonResponseNotStored]), never a second run.
// Default: [DefaultMaxResponseSize].
func WithMaxResponseSize(n int) Option {
	return optionFunc(func(c *config) { c.maxResponse = n })
}

// WithMaxRetryAfter caps the retry delay ([errdetails.RetryInfo]) of the
// Aborted answer given while another call with the key runs; the delay
// is the time left on that call's lease, at least
// [idempotency.MinRetryAfter] and at most max (see
// [idempotency.RetryAfter], which the HTTP middleware's Retry-After follows
// too). Default: [DefaultMaxRetryAfter].
func WithMaxRetryAfter(max time.Duration) Option {
	return optionFunc(func(c *config) { c.maxRetryAfter = max })
}

// An ErrorAnswer is an error the server interceptor answers by itself,
// the handler not having run: what an [ErrorRenderer] renders.
type ErrorAnswer struct {
	// Outcome is the call's outcome (see [idempotency.Outcome]):
	// OutcomeInProgress for Aborted, OutcomeMismatch for
	// FailedPrecondition, and so on. An answer given before the executor
	// was called (a key missing or malformed, a request that cannot be
	// fingerprinted, a scope rejected) is OutcomeInvalidKey, and Reason
	// says which.
	Outcome idempotency.Outcome
	// Status is the status the interceptor would send: the code, the
	// message and the details ([errdetails.ErrorInfo] with the reason,
	// [errdetails.RetryInfo] when a retry may succeed). For a scope
	// function's own status, it is that status with the ErrorInfo added.
	Status *status.Status
	// Reason is the ErrorInfo's reason, one of the Reason* constants.
	Reason string
	// RetryAfter is the RetryInfo's delay, 0 when a retry with the key
	// cannot succeed.
	RetryAfter time.Duration
	// LeaseLeft is, for OutcomeInProgress, the time left on the lease of
	// the call that holds the key (see [LeaseRemaining]).
	LeaseLeft time.Duration
}

// An ErrorRenderer returns the error sent for an [ErrorAnswer]: another
// status, other details, or a.Status.Err() after setting trailer metadata
// with grpc.SetTrailer. A nil error means a.Status.Err(). It runs only
// when the handler did not run for this call.
type ErrorRenderer func(ctx context.Context, a ErrorAnswer) error

// WithErrorRenderer sets the function that makes the interceptor's own
// errors (see [ErrorAnswer]), for clients that expect another shape. A nil
// renderer is refused. Default: the status as it is (a.Status.Err()).
func WithErrorRenderer(render ErrorRenderer) Option {
	return optionFunc(func(c *config) { c.render, c.renderSet = render, true })
}

// WithObserver sets an observer (the runner's, such as otelidem's) to
// which the interceptor reports the calls it refuses before calling the
// executor, which never hears of them: a key missing or malformed, a
// request that cannot be fingerprinted, a scope rejected (also with the
// scope function's own status). Each is an event of outcome
// [idempotency.OutcomeInvalidKey] whose Err matches
// [idempotency.ErrInvalidKey] and names the reason. Calls the executor
// makes are reported by its runner, not here. Default: none.
func WithObserver(o idempotency.Observer) Option {
	return optionFunc(func(c *config) { c.observer = o })
}
