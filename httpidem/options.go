package httpidem

import (
	"bytes"
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
	// DefaultExpiresHeader is the response header that says, as an
	// HTTP-date, until when the key of a stored response is honoured: on
	// the response when it is stored, and on every replay. It is not (yet)
	// a standard header: the IETF HTTPAPI draft leaves a key's lifetime to
	// the service's documentation. [WithExpiresHeader] renames it or turns
	// it off.
	DefaultExpiresHeader = "Idempotency-Key-Expires"
	// LeaseHeader is the header of a 409 that says, in whole seconds
	// rounded up, how long the lease of the request holding the key still
	// runs: when it has passed, the store lets a retry take over the key
	// of a holder that crashed. Retry-After says when to poll again (at
	// most [WithMaxRetryAfter]); this header says how long polling can
	// take at the most if the holder is gone, and the [Transport] follows
	// it ([WithMaxLeaseWait]). Not a standard header.
	LeaseHeader = "Idempotency-Lease-Remaining"
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
	render        ErrorRenderer
	renderSet     bool
	observer      idempotency.Observer
	expiresHeader string // canonical; "": not sent
	renderRef     ReferenceRenderer
	replayHook    func(r *http.Request, resp *ReplayedResponse)
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
		expiresHeader: DefaultExpiresHeader,
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
	case c.expiresHeader != "" && !validHeaderName(c.expiresHeader):
		return invalidArg("WithExpiresHeader: invalid header name %q", c.expiresHeader)
	case c.renderSet && c.render == nil:
		return invalidArg("WithErrorRenderer: nil renderer")
	case edge.IsNil(c.observer) && c.observer != nil:
		return invalidArg("WithObserver: nil observer (%T)", c.observer)
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

// WithErrorRenderer sets the function that writes the middleware's own
// answers (see [ErrorAnswer]): their body and headers, for clients that
// cannot read RFC 9457 problems or read another error shape (the
// examples module shows one for stripe-go). A nil renderer is refused.
// Default: [RenderProblem].
func WithErrorRenderer(render ErrorRenderer) Option {
	return optionFunc(func(c *config) { c.render, c.renderSet = render, true })
}

// WithObserver sets an observer (the runner's, such as otelidem's) to
// which the middleware reports the requests it refuses before calling
// the executor, which never hears of them: a key missing or malformed, a
// body too large or unreadable, a scope rejected. Each is an event of
// outcome [idempotency.OutcomeInvalidKey] whose Err matches
// [idempotency.ErrInvalidKey] and says which (a rejected scope wraps the
// scope function's error). Calls the executor makes are reported by its
// runner, not here. Default: none.
func WithObserver(o idempotency.Observer) Option {
	return optionFunc(func(c *config) { c.observer = o })
}

// WithExpiresHeader names the response header that says, as an HTTP-date,
// until when the key of a stored response is honoured (see
// [DefaultExpiresHeader]); "" sends none. The expiry is the executor's
// retention (an [*idempotency.Runner]'s, or any executor with a method
// Retention() time.Duration, such as the PostgreSQL adapter's
// TxExecutor) from the moment the handler returned, by this process's
// clock: the store counts it from its own clock at completion, a moment
// later, so the header is early by that moment and by the clocks'
// difference, never late while they agree. With an executor that does not
// tell its retention, no header is sent. A response streamed before it
// was stored (larger than [WithMaxResponseSize]) and an answer that was
// not stored carry none. Default: [DefaultExpiresHeader].
func WithExpiresHeader(name string) Option {
	return optionFunc(func(c *config) { c.expiresHeader = textproto.CanonicalMIMEHeaderKey(name) })
}

// A Reference is a response stored by reference ([StoreReference]), for
// a [ReferenceRenderer].
type Reference struct {
	// Ref is what the handler stored: the created resource's ID, say.
	Ref string
	// Status is the status of the response the handler sent.
	Status int
}

// A ReferenceRenderer writes the replay of a response stored by
// reference: usually the referenced resource as it is now, with the
// status of the first response. The middleware has set the replay header
// (Idempotent-Replayed: true) and the expiry header; the renderer sets
// the others and writes the status and body. The replay shows the current
// state, not the bytes the first client got.
//
// A reference that no longer resolves (the resource was deleted) is the
// service's to answer: write it (404, 410, or the first status with an
// empty body) and return nil. Never render another client's resource: the
// reference comes from this request's record, under its scope, so keep
// the renderer to that reference. A returned error, before anything was
// written, answers a 500 problem of type [ProblemReferenceFailed]; the
// handler is never run again for the key. A renderer that writes nothing
// and returns nil sends the first status with an empty body.
type ReferenceRenderer func(w http.ResponseWriter, r *http.Request, ref Reference) error

// WithReferenceRenderer lets handlers store a reference instead of their
// response's body ([StoreReference]), for responses of any size, and sets
// the renderer that turns it back into a response on every replay.
// Default: none ([StoreReference] reports false, and bodies are stored).
func WithReferenceRenderer(render ReferenceRenderer) Option {
	return optionFunc(func(c *config) { c.renderRef = render })
}

// A ReplayedResponse is a stored response about to be replayed, for the
// hook of [WithReplayHook].
type ReplayedResponse struct {
	// Status is the stored status. It is written as stored: changing it
	// here changes nothing.
	Status int
	// Header is the header of the response to be written: the stored
	// headers, the replay header and the expiry header. The hook may add,
	// change or remove headers (a request ID, a log correlation).
	Header http.Header
	// Reference is, for a response stored by reference, the reference (the
	// [ReferenceRenderer] writes the body after the hook); "" otherwise.
	Reference string
	body      []byte
}

// Body returns a reader of the stored body: the hook can read it (to log
// it, say), never change what is stored or written.
func (r *ReplayedResponse) Body() *bytes.Reader { return bytes.NewReader(r.body) }

// WithReplayHook sets a function called before every replayed response is
// written (not for the 410 of a response that was not stored), with the
// request of the retry: to add a header, or to log the retry with the
// original request's ID. It cannot change the stored status or body.
// Default: none.
func WithReplayHook(hook func(r *http.Request, resp *ReplayedResponse)) Option {
	return optionFunc(func(c *config) { c.replayHook = hook })
}
