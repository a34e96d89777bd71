package httpidem

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the middleware's options.
const (
	// DefaultKeyHeader is the request header that carries the key, as the
	// IETF HTTPAPI draft names it.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultReplayHeader is set to "true" on every replayed response.
	DefaultReplayHeader = "Idempotent-Replayed"
	// DefaultMaxBodySize is the largest request body read, in bytes
	// (1 MiB); a larger one gets 413.
	DefaultMaxBodySize = 1 << 20
	// DefaultMaxResponseSize is the largest response body stored, in bytes
	// (256 KiB). Mind the runner's [idempotency.WithMaxResultSize]: a
	// stored response takes its body plus its headers and a few bytes
	// (about 4/3 of that with a codec of your own that encodes bytes as
	// JSON does).
	DefaultMaxResponseSize = 256 << 10
	// DefaultMaxRetryAfter caps the Retry-After of a 409: the holder's
	// remaining lease bounds a crash, not the usual run, which is much
	// shorter.
	DefaultMaxRetryAfter = time.Second
)

// DefaultMethods are the methods whose requests the middleware manages by
// default: the ones that are not idempotent by definition (RFC 9110).
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultStoredHeaders are the response headers stored and replayed by
// default. Set-Cookie and hop-by-hop headers are never stored, whatever
// the list says.
var DefaultStoredHeaders = []string{
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
	"Content-Location", "Content-Type", "ETag", "Expires", "Last-Modified",
	"Link", "Location", "Vary",
}

// neverStored are the headers that no option can store: cookies belong to
// one response, hop-by-hop headers to one connection (RFC 9110 §7.6.1),
// and the framing headers are recomputed on every write.
var neverStored = map[string]bool{
	"Set-Cookie":          true,
	"Set-Cookie2":         true,
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	"Content-Length":      true,
	"Date":                true,
}

// An Option configures the middleware made by [New].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// FingerprintFunc computes the fingerprint of a request from the request
// and its body, read in full. It must not read r.Body.
type FingerprintFunc func(r *http.Request, body []byte) (idempotency.Fingerprint, error)

type config struct {
	keyHeader     string // canonical
	replayHeader  string // canonical
	methods       []string
	required      func(*http.Request) bool
	scope         ScopeFunc
	sharedKeys    bool
	validate      func(string) error
	fingerprint   FingerprintFunc
	maxBody       int64
	maxResponse   int
	stored        map[string]string // canonical name -> itself, to share the string
	maxRetryAfter time.Duration
}

func defaultConfig() config {
	c := config{
		keyHeader:     DefaultKeyHeader,
		replayHeader:  DefaultReplayHeader,
		methods:       DefaultMethods,
		fingerprint:   DefaultFingerprint,
		maxBody:       DefaultMaxBodySize,
		maxResponse:   DefaultMaxResponseSize,
		maxRetryAfter: DefaultMaxRetryAfter,
	}
	c.stored = headerSet(DefaultStoredHeaders)
	return c
}

func headerSet(names []string) map[string]string {
	m := make(map[string]string, len(names))
	for _, n := range names {
		n = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(n))
		if !neverStored[n] {
			m[n] = n
		}
	}
	return m
}

func (c *config) validateConfig() error {
	switch {
	case c.keyHeader == "" || !validHeaderName(c.keyHeader):
		return invalidArg("invalid key header name %q", c.keyHeader)
	case c.replayHeader == "" || !validHeaderName(c.replayHeader):
		return invalidArg("invalid replay header name %q", c.replayHeader)
	case edge.ScopeChoice(c.scope != nil, c.sharedKeys) != "":
		return invalidArg("%s", edge.ScopeChoice(c.scope != nil, c.sharedKeys))
	case len(c.methods) == 0:
		return invalidArg("no methods")
	case c.fingerprint == nil:
		return invalidArg("nil fingerprint function")
	case c.maxBody <= 0:
		return invalidArg("max body size must be positive, got %d", c.maxBody)
	case c.maxResponse <= 0:
		return invalidArg("max response size must be positive, got %d", c.maxResponse)
	case c.maxRetryAfter < time.Second:
		return invalidArg("max Retry-After must be at least 1s, got %v", c.maxRetryAfter)
	}
	for _, m := range c.methods {
		if m == "" || !validHeaderName(m) {
			return invalidArg("invalid method %q", m)
		}
	}
	return nil
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool { return edge.ValidToken(s) }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: httpidem: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
}

// WithKeyHeader sets the request header that carries the key.
// Default: [DefaultKeyHeader] ("Idempotency-Key").
func WithKeyHeader(name string) Option {
	return optionFunc(func(c *config) { c.keyHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// WithReplayHeader sets the response header set to "true" on a replayed
// response. Default: [DefaultReplayHeader] ("Idempotent-Replayed").
func WithReplayHeader(name string) Option {
	return optionFunc(func(c *config) { c.replayHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// WithMethods sets the methods whose requests are managed; requests with
// other methods pass through untouched, key or not.
// Default: [DefaultMethods] (POST and PATCH).
func WithMethods(methods ...string) Option {
	return optionFunc(func(c *config) { c.methods = append([]string(nil), methods...) })
}

// WithRequired sets which managed requests must carry a key: when
// required returns true for a request without one, it gets 400; when it
// returns false, the request passes through without idempotency.
// Default: every managed request requires a key.
func WithRequired(required func(r *http.Request) bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// ScopeFunc returns the scope of a request: the tenant, the authenticated
// actor, the operation, anything that must keep one client's key from
// reaching another's record. The parts are encoded into the storage key
// without ambiguity; each must be non-empty, valid UTF-8 without control
// characters.
//
// A non-nil error rejects the request: the handler does not run, nothing
// is claimed or stored, and the client gets a problem of type
// [ProblemScopeRejected], with the status and detail of a [ScopeError]
// (see [RejectScope]) or, for any other error, 403 and a generic detail
// (the error's text is not sent, as it may describe internals). No parts,
// or an empty part, is rejected the same way: a missing tenant must not
// fall back to a key space shared with other requests that lack one.
type ScopeFunc func(r *http.Request) ([]string, error)

// WithScope sets the function that scopes every managed request's key
// (see [ScopeFunc]). [New] requires it, or [WithSharedKeySpace].
func WithScope(scope ScopeFunc) Option {
	return optionFunc(func(c *config) { c.scope = scope })
}

// WithSharedKeySpace puts the keys of every client into one key space: a
// client that sends another client's key gets that client's stored
// response. It is right only when a single client, or trusted clients
// that make keys no one else can guess (random UUIDs), call the service.
// [New] refuses a middleware with neither this nor [WithScope], so that
// sharing is always a choice made by name.
func WithSharedKeySpace() Option {
	return optionFunc(func(c *config) { c.sharedKeys = true })
}

// WithKeyValidator adds a check of the key, after its quotes are removed
// and after the runner's own rules (non-empty, at most 255 bytes by
// default, valid UTF-8, no control characters). A non-nil error gives
// 400 with the error's message as detail. Default: none.
func WithKeyValidator(validate func(key string) error) Option {
	return optionFunc(func(c *config) { c.validate = validate })
}

// WithFingerprint replaces the request fingerprint. A non-nil error gives
// 400. Default: [DefaultFingerprint].
func WithFingerprint(f FingerprintFunc) Option {
	return optionFunc(func(c *config) { c.fingerprint = f })
}

// WithMaxBodySize sets the largest request body read, in bytes; a larger
// one gets 413 and nothing is claimed. Default: [DefaultMaxBodySize].
func WithMaxBodySize(n int64) Option {
	return optionFunc(func(c *config) { c.maxBody = n })
}

// WithMaxResponseSize sets the largest response body stored, in bytes.
// A larger response of status below 500 is sent to its client as the
// handler writes it, and a marker is stored instead: every retry gets a
// 410 problem of type [ProblemResponseNotStored], never a second run.
// Default: [DefaultMaxResponseSize].
func WithMaxResponseSize(n int) Option {
	return optionFunc(func(c *config) { c.maxResponse = n })
}

// WithStoredHeaders replaces the list of response headers stored and
// replayed. Set-Cookie, hop-by-hop headers, Content-Length and Date are
// never stored, even when listed. Default: [DefaultStoredHeaders].
func WithStoredHeaders(names ...string) Option {
	return optionFunc(func(c *config) { c.stored = headerSet(names) })
}

// WithMaxRetryAfter caps the Retry-After of a 409 sent while another
// request with the key runs; the header says the time left on that
// request's lease, rounded up to whole seconds, at most max (and at least
// one second). Default: [DefaultMaxRetryAfter].
func WithMaxRetryAfter(max time.Duration) Option {
	return optionFunc(func(c *config) { c.maxRetryAfter = max })
}
