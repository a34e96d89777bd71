package mcpidem

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// Defaults of the server middleware's options.
const (
	// DefaultKeyMeta is the entry of a tools/call request's _meta that
	// carries the idempotency key: the HTTP header's name, lower-cased as
	// gRPC metadata keys are (and as the Universal Commerce Protocol's
	// MCP binding spells it).
	DefaultKeyMeta = "idempotency-key"
	// DefaultReplayMeta is the entry of a replayed CallToolResult's _meta
	// set to true: the HTTP header's name, lower-cased.
	DefaultReplayMeta = "idempotent-replayed"
	// DefaultMaxResponseSize is the largest stored result, in bytes
	// (256 KiB): the CallToolResult's JSON plus two bytes of framing. Mind
	// the runner's [idempotency.WithMaxResultSize].
	DefaultMaxResponseSize = 256 << 10
	// DefaultMaxRetryAfter caps the retry delay told a client while another
	// call with the key runs: the holder's remaining lease bounds a crash,
	// not the usual run, which is much shorter. It is the HTTP and gRPC
	// middleware's default too.
	DefaultMaxRetryAfter = time.Second
)

// KeyArgumentMeta is the entry of a tool's _meta (mcp.Tool.Meta) by which
// the tool declares that one of its arguments carries the idempotency
// key: its value is the argument's name, which the tool's input schema
// should declare as a string. A model that plans a side effect can then
// make the key itself (one per intent, the same when it re-plans), and
// clients that cannot set a request's _meta can still send one:
//
//	mcp.AddTool(server, &mcp.Tool{
//		Name: "charge",
//		Meta: mcp.Meta{mcpidem.KeyArgumentMeta: "idempotency_key"},
//	}, charge)
//
// The entry is sent to clients with the tool's definition (tools/list).
const KeyArgumentMeta = "idempotency-key-argument"

// An Option configures the server middleware made by [ServerMiddleware].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// FingerprintFunc computes the fingerprint of a call from the tool's name
// and its arguments as they came over the wire (nil when the call has
// none).
type FingerprintFunc func(tool string, args json.RawMessage) (idempotency.Fingerprint, error)

// ScopeFunc returns the scope of a call: the authenticated user (see
// [TokenScope], which takes it from the verified bearer token), the
// tenant, the tool, anything that must keep one client's key from
// reaching another's record. The parts are encoded into the storage key
// without ambiguity; each must be non-empty, valid UTF-8 without control
// characters.
//
// A non-nil error rejects the call: the tool does not run and nothing is
// claimed. A [*jsonrpc.Error] (also wrapped) is sent as it is; any other
// error gives [CodeScopeRejected] with a generic message (the error's
// text is not sent, as it may describe internals). No parts, or an empty
// part, is rejected the same way: a missing user must not fall back to a
// key space shared with other calls that lack one.
//
// [*jsonrpc.Error]: https://pkg.go.dev/github.com/modelcontextprotocol/go-sdk/jsonrpc#Error
type ScopeFunc func(ctx context.Context, req *mcp.CallToolRequest) ([]string, error)

type config struct {
	keyMeta       string
	replayMeta    string
	tools         map[string]bool // nil: by annotations
	required      func(ctx context.Context, tool string) bool
	scope         ScopeFunc
	sharedKeys    bool
	validate      func(string) error
	fingerprint   FingerprintFunc
	maxResponse   int
	maxRetryAfter time.Duration
	badTool       bool // WithTools was given an empty name
}

func defaultConfig() config {
	return config{
		keyMeta:       DefaultKeyMeta,
		replayMeta:    DefaultReplayMeta,
		fingerprint:   DefaultFingerprint,
		maxResponse:   DefaultMaxResponseSize,
		maxRetryAfter: DefaultMaxRetryAfter,
	}
}

func (c *config) validateConfig() error {
	switch {
	case !validMetaKey(c.keyMeta):
		return invalidArg("WithKeyMeta: invalid _meta key %q", c.keyMeta)
	case !validMetaKey(c.replayMeta):
		return invalidArg("WithReplayMeta: invalid _meta key %q", c.replayMeta)
	case c.keyMeta == c.replayMeta:
		return invalidArg("WithKeyMeta and WithReplayMeta: both name %q", c.keyMeta)
	case edge.ScopeChoice(c.scope != nil, c.sharedKeys) != "":
		return invalidArg("%s", edge.ScopeChoice(c.scope != nil, c.sharedKeys))
	case c.badTool:
		return invalidArg("WithTools: an empty tool name")
	case c.tools != nil && len(c.tools) == 0:
		return invalidArg("WithTools: no tools")
	case c.fingerprint == nil:
		return invalidArg("WithFingerprint: nil function")
	case c.maxResponse <= 0:
		return invalidArg("WithMaxResponseSize: must be positive, got %d", c.maxResponse)
	case c.maxRetryAfter < idempotency.MinRetryAfter:
		return invalidArg("WithMaxRetryAfter: must be at least %v, got %v", idempotency.MinRetryAfter, c.maxRetryAfter)
	}
	return nil
}

// validMetaKey reports whether s is a _meta key as the MCP specification
// defines them: an optional prefix of dot-separated labels ending in '/'
// ("com.example/"), then a name that begins and ends with a letter or
// digit and has only letters, digits, '-', '_' and '.' between. A prefix
// with a label "modelcontextprotocol" or "mcp" ("io.modelcontextprotocol/",
// "dev.mcp/") is the protocol's own, and refused.
func validMetaKey(s string) bool {
	prefix, name := "", s
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			prefix, name = s[:i], s[i+1:]
			break
		}
	}
	if len(name) < len(s) && !validPrefix(prefix) {
		return false
	}
	if name == "" || !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// validPrefix checks a _meta key's prefix (without its '/'): labels of
// letters, digits and hyphens, each starting with a letter and ending
// with a letter or digit, none of them "modelcontextprotocol" or "mcp".
func validPrefix(p string) bool {
	if p == "" {
		return false
	}
	start := 0
	for i := 0; i <= len(p); i++ {
		if i < len(p) && p[i] != '.' {
			continue
		}
		label := p[start:i]
		start = i + 1
		if label == "" || label == "modelcontextprotocol" || label == "mcp" {
			return false
		}
		if !letter(label[0]) || !alnum(label[len(label)-1]) {
			return false
		}
		for j := 0; j < len(label); j++ {
			if c := label[j]; !alnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}

func letter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func alnum(c byte) bool  { return letter(c) || '0' <= c && c <= '9' }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: mcpidem: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
}

// WithKeyMeta sets the entry of a request's _meta that carries the
// idempotency key. Default: [DefaultKeyMeta] ("idempotency-key").
func WithKeyMeta(name string) Option {
	return optionFunc(func(c *config) { c.keyMeta = name })
}

// WithReplayMeta sets the entry of a replayed result's _meta set to true.
// Default: [DefaultReplayMeta] ("idempotent-replayed").
func WithReplayMeta(name string) Option {
	return optionFunc(func(c *config) { c.replayMeta = name })
}

// WithTools sets the tools whose calls are managed, by name, whatever
// their annotations say. Calls of other tools pass through untouched, key
// or not.
//
// Default: every tool, except those annotated readOnlyHint: true (no side
// effects) or idempotentHint: true (a repeated call has no further
// effect): the MCP counterpart of HTTP's GET and PUT, which the HTTP
// middleware does not manage either. Annotations are hints a tool's
// author gives; mind them on tools you did not write.
func WithTools(tools ...string) Option {
	return optionFunc(func(c *config) {
		c.tools = make(map[string]bool, len(tools))
		for _, t := range tools {
			if t == "" {
				c.badTool = true
			}
			c.tools[t] = true
		}
	})
}

// WithRequired sets which managed calls must carry a key: when required
// returns true for a call of the named tool without one, the call fails
// with [CodeKeyMissing]; when it returns false, the call passes through
// without idempotency. Default: every managed call requires a key. To opt
// tools out by name:
//
//	mcpidem.WithRequired(func(_ context.Context, tool string) bool {
//		return tool != "draft_reply" // a draft is cheap to make twice
//	})
func WithRequired(required func(ctx context.Context, tool string) bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// WithScope sets the function that scopes every managed call's key (see
// [ScopeFunc]; [TokenScope] scopes by the verified bearer token's user).
// [ServerMiddleware] requires it, or [WithSharedKeySpace].
func WithScope(scope ScopeFunc) Option {
	return optionFunc(func(c *config) { c.scope = scope })
}

// WithSharedKeySpace puts the keys of every client into one key space: a
// client that sends another client's key gets that client's stored
// result. It is right only when a single client, or trusted clients that
// make keys no one else can guess (random UUIDs), call the server, such
// as a server on stdio that belongs to one host. [ServerMiddleware]
// refuses a configuration with neither this nor [WithScope], so that
// sharing is always a choice made by name.
func WithSharedKeySpace() Option {
	return optionFunc(func(c *config) { c.sharedKeys = true })
}

// WithKeyValidator adds a check of the key, after the runner's own rules
// (non-empty, at most 255 bytes by default, valid UTF-8, no control
// characters). A non-nil error fails the call with [CodeKeyMalformed]
// and the error's message. Default: none.
func WithKeyValidator(validate func(key string) error) Option {
	return optionFunc(func(c *config) { c.validate = validate })
}

// WithFingerprint replaces the call fingerprint. A non-nil error fails
// the call with [CodeBadRequest] before anything is claimed. Default:
// [DefaultFingerprint].
func WithFingerprint(f FingerprintFunc) Option {
	return optionFunc(func(c *config) { c.fingerprint = f })
}

// WithMaxResponseSize sets the largest stored result, in bytes. A larger
// result is sent to its caller, and a marker is stored instead: every
// retry fails with [CodeResponseNotStored] (marked replayed), never a
// second run. Default: [DefaultMaxResponseSize].
func WithMaxResponseSize(n int) Option {
	return optionFunc(func(c *config) { c.maxResponse = n })
}

// WithMaxRetryAfter caps the retry delay (the data's retryAfterMs) of the
// [CodeInProgress] answer given while another call with the key runs;
// the delay is the time left on that call's lease, at least
// [idempotency.MinRetryAfter] and at most max (see
// [idempotency.RetryAfter], which the HTTP and gRPC middleware follow
// too). Default: [DefaultMaxRetryAfter].
func WithMaxRetryAfter(max time.Duration) Option {
	return optionFunc(func(c *config) { c.maxRetryAfter = max })
}
