package mcpidem

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// The methods the middleware handles or makes.
const (
	methodCallTool  = "tools/call"
	methodListTools = "tools/list"
)

// ServerMiddleware returns an MCP server middleware (for
// mcp.Server.AddReceivingMiddleware) that makes the tools it manages
// idempotent. It runs them through exec: an [*idempotency.Runner] (on any
// store) or another [idempotency.Executor], such as the PostgreSQL
// adapter's TxExecutor, in which the key, the tool's writes and the stored
// result commit in one transaction. A managed tools/call carrying an
// idempotency key runs the tool at most once per scope, key and call
// fingerprint (the tool's name and the RFC 8785 form of its arguments)
// within the runner's retention; every retry gets the stored result:
//
//	call                                          answer
//	first call with a key                         the tool runs; its result is stored, unless it is a tool error not marked permanent
//	retry, same key, same call                    the stored CallToolResult, _meta "idempotent-replayed": true, tool not run
//	same key while the first call runs            CodeInProgress + retryAfterMs (or the runner waits: idempotency.WithWait)
//	same key, other tool or arguments             CodeKeyReused
//	missing key on a tool that requires one       CodeKeyMissing
//	malformed key                                 CodeKeyMalformed
//	arguments not RFC 8785 JSON                   CodeBadRequest, nothing claimed
//	scope function rejects the call               CodeScopeRejected (or its own *jsonrpc.Error), nothing claimed
//	tool error not marked permanent               sent as it is, not stored: the key is released
//	JSON-RPC error, result asking for input       sent as it is, not stored: the key is released
//	tool panics                                   the key is released, the panic goes on
//	store unreachable                             CodeStoreUnavailable + retryAfterMs, tool not run
//	retry of a result too large to store          CodeResponseNotStored, marked replayed, tool not run
//	stored result cannot be read                  CodeResultCorrupt, tool not run, never retried
//
// Every error it answers by itself is a JSON-RPC error with one of the
// Code* codes and an [ErrorData] (see [DataOf]).
//
// The key is the string in the request's _meta under [DefaultKeyMeta]
// ([WithKeyMeta]), or, for a tool that declares a key argument
// ([KeyArgumentMeta]) and is called with it, that argument, which then
// wins over the _meta entry: a model that makes the key of its intent
// does so in the arguments, and a client's middleware that adds a key per
// call in _meta must not override it.
//
// Which tools are managed is [WithTools]'s rule, by default every tool not
// annotated readOnlyHint or idempotentHint. To read a tool's definition
// (its annotations and _meta) the middleware lists the server's tools
// through the handler it wraps, once per tools/call: middleware installed
// after it (inside it) sees these tools/list calls. A call of a tool the
// server does not list passes through, and the server refuses it.
//
// A tool error (a result with isError) is transient unless the tool marks
// it permanent: a handler of mcp.AddTool that returns
// idempotency.Permanent(err), or a result made with
// result.SetError(idempotency.Permanent(err)). A permanent one ("the card
// was declined") is stored and replayed, so that a retry cannot succeed
// after the state changed underneath it; a transient one (a timeout of a
// downstream service, arguments that failed validation) releases the key,
// so that the retry runs the tool again.
//
// Every managed call is scoped ([WithScope]; [TokenScope] takes the user
// from the verified bearer token); ServerMiddleware refuses a
// configuration without a scope unless [WithSharedKeySpace] says so.
//
// The result is stored before it is sent, so once it is stored every
// retry within retention gets the same result. The tool's result is sent
// to its caller even when it could not be stored, because its effect has
// happened: when the store fails after the tool ran
// ([idempotency.StoreError] with Ran set), the record stays STARTED, a
// retry gets CodeInProgress until its lease ends, and a retry after that
// takes it over and runs the tool again; when the lease was lost while the
// tool ran, another call has already taken the record over. In both cases
// the second run has a greater fence and the recovery points
// ([idempotency.Step]) recorded so far: guard the tool's effects with
// those and with downstream keys ([idempotency.DownstreamKey]).
//
// The tool runs with the call's context wrapped by the runner:
// [idempotency.FromContext], [idempotency.DownstreamKey] and
// [idempotency.Step] work in it, and it is canceled with cause
// [idempotency.ErrLeaseLost] if the lease is lost. It is not canceled
// when the client cancels the call or goes away: a client that timed out
// retries, and its retry must find the work done, not half done and
// released. The runner's store timeout bounds the store calls
// ([idempotency.WithStoreTimeout]), so a store that stops answering gives
// CodeStoreUnavailable in a few seconds, and the tool does not run.
//
// With an executor other than a Runner, a store failure whose
// [idempotency.StoreError] has Ran false after the tool ran (a
// transaction that did not commit) discards the tool's result and gives
// CodeStoreUnavailable: its effects were rolled back with the key, and the
// client's retry runs it again.
//
// ServerMiddleware returns an error wrapping
// [idempotency.ErrInvalidArgument] for a nil executor, a missing scope or
// an invalid option.
func ServerMiddleware(exec idempotency.Executor, opts ...Option) (mcp.Middleware, error) {
	if edge.IsNil(exec) {
		return nil, invalidArg("nil executor")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalidArg("nil option")
		}
		o.apply(&cfg)
	}
	if err := cfg.validateConfig(); err != nil {
		return nil, err
	}
	s := &server{exec: exec, cfg: cfg}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != methodCallTool {
				return next(ctx, method, req)
			}
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return next(ctx, method, req)
			}
			return s.callTool(ctx, next, call)
		}
	}, nil
}

type server struct {
	exec idempotency.Executor
	cfg  config
}

func (s *server) callTool(ctx context.Context, next mcp.MethodHandler, req *mcp.CallToolRequest) (mcp.Result, error) {
	c := &s.cfg
	name := req.Params.Name
	if c.tools != nil && !c.tools[name] {
		return next(ctx, methodCallTool, req)
	}
	tool, err := listedTool(ctx, next, req)
	if err != nil {
		a := answers[idempotency.OutcomeUnknown]
		return nil, fail(a.code, a.reason, "the tool's definition could not be read: "+err.Error(), 0)
	}
	if tool == nil || (c.tools == nil && !managedByAnnotations(tool)) {
		return next(ctx, methodCallTool, req)
	}
	key, ok, err := c.keyOf(req, tool)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		if c.required == nil || c.required(ctx, name) {
			return nil, fail(CodeKeyMissing, ReasonKeyMissing,
				"this tool requires an idempotency key in the request's _meta ("+c.keyMeta+")"+keyArgumentHint(tool), 0)
		}
		return next(ctx, methodCallTool, req)
	}
	if c.validate != nil {
		if err := c.validate(key); err != nil {
			return nil, fail(CodeKeyMalformed, ReasonKeyMalformed, err.Error(), 0)
		}
	}
	fp, err := c.fingerprint(name, req.Params.Arguments)
	if err != nil {
		return nil, fail(CodeBadRequest, ReasonBadRequest, err.Error(), 0)
	}
	var scope []string
	if c.scope != nil {
		if scope, err = c.scopeOf(ctx, req); err != nil {
			return nil, err
		}
	}

	var (
		out  mcp.Result
		herr error
	)
	// A client that gives up on a slow call will retry and should then
	// find the result: the tool is not canceled when its caller goes away
	// (only when its lease is lost).
	res, err := s.exec.Execute(context.WithoutCancel(ctx),
		idempotency.Request{Scope: scope, Key: key, Fingerprint: fp},
		func(ctx context.Context) ([]byte, error) {
			// The answer of the last run: an executor may run fn again (a
			// transaction retried after a serialization failure).
			out, herr = next(ctx, methodCallTool, req)
			r, _ := out.(*mcp.CallToolResult)
			if herr != nil || !Stored(r) {
				return nil, ErrTransient
			}
			if b, ok := encodeResult(r, c.maxResponse); ok {
				return b, nil
			}
			return notStoredMarker, nil
		})
	route, outcome := edge.RouteOf(res, err)
	res.Outcome = outcome
	switch route {
	case edge.Own:
		return out, herr
	case edge.Replay:
		return s.replay(res.Value)
	case edge.NotStored:
		return nil, notStored()
	}
	a := edge.Lookup(answers[:], outcome)
	msg := edge.Detail(a.msg, err)
	return nil, fail(a.code, a.reason, msg, idempotency.RetryAfter(res, c.maxRetryAfter))
}

// answers are the middleware's answers to the outcomes of a call whose
// tool did not run (see [idempotency.Outcome]); an empty message means
// the error's text. OutcomeUnknown answers every outcome not listed (an
// executor's error the middleware cannot classify).
var answers = [...]struct {
	code   int64
	reason string
	msg    string
}{
	idempotency.OutcomeUnknown: {CodeInternal, ReasonInternal,
		"the call failed and was not stored; retry with the same idempotency key"},
	// A replayed error: the record was not written by this middleware.
	idempotency.OutcomeReplay: {CodeResultCorrupt, ReasonResultCorrupt,
		"the stored result of this idempotency key is not a tool result; the tool is not run again"},
	idempotency.OutcomeInProgress: {CodeInProgress, ReasonInProgress,
		"a call with this idempotency key is being processed; retry later with the same key"},
	idempotency.OutcomeMismatch: {CodeKeyReused, ReasonKeyReused,
		"this idempotency key was used with a different call (tool or arguments)"},
	idempotency.OutcomeInvalidKey: {CodeKeyMalformed, ReasonKeyMalformed, ""},
	idempotency.OutcomeCorrupt: {CodeResultCorrupt, ReasonResultCorrupt,
		"the stored result of this idempotency key cannot be read; the tool is not run again"},
	// Also when the tool ran but its effects were rolled back together
	// with the key (an executor's transaction that did not commit): its
	// result would tell of effects that did not happen.
	idempotency.OutcomeStoreError: {CodeStoreUnavailable, ReasonStoreUnavailable,
		"the call was not processed; retry with the same idempotency key"},
}

// Stored reports whether the server middleware stores a tool's result, to
// replay it to every retry: a result that is not a tool error, or a tool
// error the tool marked permanent (its error, which mcp.AddTool's
// handlers set and res.GetError returns on the server, matches
// [idempotency.ErrPermanent]). A result that asks the client for input
// (multi round-trip) is not stored either: the call that carries the
// input runs the tool under the same key.
func Stored(res *mcp.CallToolResult) bool {
	switch {
	case res == nil || res.InputRequests != nil || res.NeedsInput():
		return false
	case res.IsError:
		return errors.Is(res.GetError(), idempotency.ErrPermanent)
	}
	return true
}

// managedByAnnotations reports false for a tool annotated as having no
// side effects or as idempotent by itself, true for any other.
func managedByAnnotations(t *mcp.Tool) bool {
	a := t.Annotations
	return a == nil || !(a.ReadOnlyHint || a.IdempotentHint)
}

// maxToolPages bounds the pages of tools/list read to find a tool.
const maxToolPages = 1000

// listedTool returns the definition of the tool req calls as the server
// lists it, through next, or nil if it lists none of that name.
func listedTool(ctx context.Context, next mcp.MethodHandler, req *mcp.CallToolRequest) (*mcp.Tool, error) {
	params := &mcp.ListToolsParams{}
	for range maxToolPages {
		out, err := next(ctx, methodListTools, &mcp.ListToolsRequest{Session: req.Session, Params: params, Extra: req.Extra})
		if err != nil {
			return nil, err
		}
		list, ok := out.(*mcp.ListToolsResult)
		if !ok || list == nil {
			return nil, errors.New("tools/list returned no list")
		}
		for _, t := range list.Tools {
			if t != nil && t.Name == req.Params.Name {
				return t, nil
			}
		}
		if list.NextCursor == "" {
			return nil, nil
		}
		params = &mcp.ListToolsParams{Cursor: list.NextCursor}
	}
	return nil, errors.New("tools/list has too many pages")
}

// keyOf returns the call's key: the argument the tool declares, when the
// call has it, or the _meta entry. It reports false for a call with
// neither, and returns the answer for a malformed one.
func (c *config) keyOf(req *mcp.CallToolRequest, tool *mcp.Tool) (string, bool, error) {
	if v, ok := tool.Meta[KeyArgumentMeta]; ok {
		arg, ok := v.(string)
		if !ok || arg == "" {
			a := answers[idempotency.OutcomeUnknown]
			return "", false, fail(a.code, a.reason, "the tool declares its key argument ("+KeyArgumentMeta+") with no name", 0)
		}
		if len(req.Params.Arguments) > 0 {
			var args map[string]json.RawMessage
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return "", false, fail(CodeBadRequest, ReasonBadRequest, "the arguments are not a JSON object: "+err.Error(), 0)
			}
			if raw, ok := args[arg]; ok && string(raw) != "null" {
				var key string
				if err := json.Unmarshal(raw, &key); err != nil {
					return "", false, fail(CodeKeyMalformed, ReasonKeyMalformed, "the idempotency key argument "+arg+" must be a string", 0)
				}
				return key, true, nil
			}
		}
	}
	v, ok := req.Params.Meta[c.keyMeta]
	if !ok || v == nil {
		return "", false, nil
	}
	key, ok := v.(string)
	if !ok {
		return "", false, fail(CodeKeyMalformed, ReasonKeyMalformed, "the idempotency key (_meta "+c.keyMeta+") must be a string", 0)
	}
	return key, true, nil
}

// keyArgumentHint names the tool's key argument, if it declares one, for
// the message of a missing key.
func keyArgumentHint(t *mcp.Tool) string {
	if arg, ok := t.Meta[KeyArgumentMeta].(string); ok && arg != "" {
		return " or in its argument " + arg
	}
	return ""
}

// scopeOf returns the call's scope, or the error that rejects it.
func (c *config) scopeOf(ctx context.Context, req *mcp.CallToolRequest) ([]string, error) {
	scope, err := c.scope(ctx, req)
	if err == nil {
		if why := edge.ScopeParts(scope); why != "" {
			return nil, fail(CodeScopeRejected, ReasonScopeRejected, "the call "+why, 0)
		}
		return scope, nil
	}
	if we := (*jsonrpc.Error)(nil); errors.As(err, &we) {
		return nil, we
	}
	return nil, fail(CodeScopeRejected, ReasonScopeRejected, "the call's scope (user, tenant) could not be established", 0)
}

// replay answers with a stored result, marked replayed.
func (s *server) replay(b []byte) (mcp.Result, error) {
	res, notStoredMark, err := decodeResult(b)
	switch {
	case err != nil:
		a := answers[idempotency.OutcomeCorrupt]
		return nil, fail(a.code, a.reason, a.msg, 0)
	case notStoredMark:
		return nil, notStored()
	}
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[s.cfg.replayMeta] = true
	return res, nil
}

func notStored() error {
	return failData(CodeResponseNotStored,
		"the call with this idempotency key was processed, but its result was too large to store; it is not run again",
		ErrorData{Reason: ReasonResponseNotStored, Replayed: true})
}

// DefaultFingerprint is the default call fingerprint: a SHA-256 of the
// tool's name and the RFC 8785 (JSON Canonicalization Scheme) form of its
// arguments ([idempotency.FingerprintJSON]), so that two calls are the
// same exactly when their arguments are the same JSON: key order,
// whitespace, escaping and number spelling (1, 1.0, 1e0) do not matter.
// Absent arguments count as {}. It returns an error for arguments that
// RFC 8785 refuses.
func DefaultFingerprint(tool string, args json.RawMessage) (idempotency.Fingerprint, error) {
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	fp, err := idempotency.FingerprintJSON(args)
	if err != nil {
		return "", errors.New("the arguments cannot be fingerprinted: " + err.Error())
	}
	return idempotency.FingerprintParts(tool, "json", string(fp)), nil
}
