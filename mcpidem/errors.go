package mcpidem

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// The JSON-RPC error codes of the server middleware's own answers, one per
// reason. They lie outside the range that JSON-RPC reserves for itself
// (-32768 to -32000), where the MCP specification and its SDKs put their
// own codes, in the space JSON-RPC leaves to applications. The values are
// part of the wire protocol: never renumber them.
const (
	// CodeKeyMissing: the tool requires an idempotency key and the call has
	// none. Send one in the request's _meta (or in the argument the tool
	// declares), made once per intent. HTTP 400, gRPC InvalidArgument.
	CodeKeyMissing = -33001
	// CodeKeyMalformed: the key is not a string, two differ, or it breaks
	// the length, character or validator rules. HTTP 400, gRPC
	// InvalidArgument.
	CodeKeyMalformed = -33002
	// CodeBadRequest: the arguments could not be fingerprinted (not JSON
	// that RFC 8785 accepts). Nothing was claimed. HTTP 400, gRPC
	// InvalidArgument.
	CodeBadRequest = -33003
	// CodeScopeRejected: the call's scope (the user, the tenant) could not
	// be established, so its key cannot be used. Nothing was claimed and
	// the tool did not run. HTTP 403, gRPC PermissionDenied.
	CodeScopeRejected = -33004
	// CodeInProgress: a call with the same key is being processed. Retry
	// after the data's retryAfterMs, with the same key: the retry gets its
	// result. HTTP 409, gRPC Aborted.
	CodeInProgress = -33005
	// CodeKeyReused: the key was used before with a different call (tool
	// or arguments). The first result is never given for another call;
	// use a new key for a new intent. HTTP 422, gRPC FailedPrecondition.
	CodeKeyReused = -33006
	// CodeStoreUnavailable: the idempotency store could not be reached, so
	// the call was not processed. Retry after the data's retryAfterMs,
	// with the same key. HTTP 503, gRPC Unavailable.
	CodeStoreUnavailable = -33007
	// CodeResponseNotStored: the call with this key was processed (its
	// effect happened), but its result was too large to store, so it
	// cannot be replayed, and the tool is not run again. Marked replayed.
	// HTTP 410, gRPC FailedPrecondition.
	CodeResponseNotStored = -33008
	// CodeResultCorrupt: the stored result of this key cannot be read
	// (written by another version or codec, or damaged). The tool is not
	// run again, and a retry cannot help: an operator must inspect the
	// record. HTTP 500, gRPC DataLoss.
	CodeResultCorrupt = -33009
	// CodeInternal: the call failed in a way the middleware cannot
	// classify; it was not stored. HTTP 500, gRPC Internal.
	CodeInternal = -33010
)

// ErrorDomain is the domain of every error the server middleware answers
// by itself (see [ErrorData]), the same as grpcidem's.
const ErrorDomain = "idempotency.exactlyonce.github.com"

// The reasons of the middleware's own errors, one per code: the words of
// grpcidem's ErrorInfo reasons and of httpidem's problem types.
const (
	ReasonKeyMissing        = "IDEMPOTENCY_KEY_MISSING"
	ReasonKeyMalformed      = "IDEMPOTENCY_KEY_MALFORMED"
	ReasonBadRequest        = "IDEMPOTENCY_BAD_REQUEST"
	ReasonScopeRejected     = "IDEMPOTENCY_SCOPE_REJECTED"
	ReasonInProgress        = "IDEMPOTENCY_IN_PROGRESS"
	ReasonKeyReused         = "IDEMPOTENCY_KEY_REUSED"
	ReasonStoreUnavailable  = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonResponseNotStored = "IDEMPOTENCY_RESPONSE_NOT_STORED"
	ReasonResultCorrupt     = "IDEMPOTENCY_RESULT_CORRUPT"
	ReasonInternal          = "IDEMPOTENCY_INTERNAL"
)

// ErrorData is the data of every JSON-RPC error the server middleware
// answers by itself, as it is sent:
//
//	{"code": -33005, "message": "a call with this idempotency key is being processed; retry later with the same key",
//	 "data": {"domain": "idempotency.exactlyonce.github.com", "reason": "IDEMPOTENCY_IN_PROGRESS", "retryAfterMs": 250}}
//
// Clients should branch on the code or the reason, not on the message.
type ErrorData struct {
	// Domain is [ErrorDomain].
	Domain string `json:"domain"`
	// Reason is one of the Reason* constants.
	Reason string `json:"reason"`
	// RetryAfterMs, when positive, is how long to wait before retrying
	// with the same key, in milliseconds (see [idempotency.RetryAfter]):
	// set on [CodeInProgress] and [CodeStoreUnavailable] only.
	RetryAfterMs int64 `json:"retryAfterMs,omitempty"`
	// Replayed marks an answer that is the stored outcome of an earlier
	// call with the key ([CodeResponseNotStored]): every retry gets it
	// again, so no client retries it.
	Replayed bool `json:"replayed,omitempty"`
}

// ErrTransient is the error the middleware's function returns to the
// executor when the tool's answer means "try again" (a tool error not
// marked permanent, a JSON-RPC error, a result that asks for input), so
// that the key is released and a retry runs the tool again. It is
// transient under the runner's default error policy; a custom policy
// ([idempotency.WithErrorPolicy]) must keep it transient, or such answers
// would be stored and replayed for the whole retention. It is the same
// error as httpidem's and grpcidem's ErrTransient.
var ErrTransient = edge.ErrTransient

// fail makes the middleware's own error: the code and message, and the
// data with the reason and, when retry > 0, the delay.
func fail(code int64, reason, msg string, retry time.Duration) error {
	return failData(code, msg, ErrorData{Reason: reason, RetryAfterMs: retryMs(retry)})
}

// retryMs is d in whole milliseconds, rounded up, so that a positive
// delay stays positive.
func retryMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func failData(code int64, msg string, d ErrorData) error {
	d.Domain = ErrorDomain
	data, _ := json.Marshal(d) // of strings, numbers and bools: cannot fail
	return &jsonrpc.Error{Code: code, Message: msg, Data: data}
}

// DataOf returns the data of an error the server middleware answered by
// itself, as a client's CallTool returns it (wrapped), and whether err is
// one.
func DataOf(err error) (ErrorData, bool) {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || len(we.Data) == 0 {
		return ErrorData{}, false
	}
	var d ErrorData
	if json.Unmarshal(we.Data, &d) != nil || d.Domain != ErrorDomain {
		return ErrorData{}, false
	}
	return d, true
}

// ReasonOf returns the reason of an error the server middleware answered
// by itself (one of the Reason* constants), or "" for any other error,
// such as the tool's own.
func ReasonOf(err error) string {
	d, _ := DataOf(err)
	return d.Reason
}

// RetryDelay returns the delay the server middleware asked for in err's
// data (retryAfterMs), and whether it asked for one.
func RetryDelay(err error) (time.Duration, bool) {
	d, ok := DataOf(err)
	if !ok || d.RetryAfterMs <= 0 {
		return 0, false
	}
	return time.Duration(d.RetryAfterMs) * time.Millisecond, true
}
