package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/exactlyonce/idempotency"
)

// The problem types of the middleware's error responses (RFC 9457
// application/problem+json). Each URI leads to its own documentation.
const (
	problemBase = "https://pkg.go.dev/github.com/exactlyonce/idempotency/httpidem#"

	// ProblemKeyMissing (400): the route requires an idempotency key and
	// the request has none. Send one, made once per user intent.
	ProblemKeyMissing = problemBase + "ProblemKeyMissing"
	// ProblemKeyMalformed (400): the key header is repeated, is an
	// unterminated or invalid RFC 8941 string, or the key breaks the
	// length, character or validator rules.
	ProblemKeyMalformed = problemBase + "ProblemKeyMalformed"
	// ProblemBodyTooLarge (413): the request body is larger than the
	// middleware reads. Nothing was claimed.
	ProblemBodyTooLarge = problemBase + "ProblemBodyTooLarge"
	// ProblemBadRequest (400): the request body could not be read or
	// fingerprinted. Nothing was claimed.
	ProblemBadRequest = problemBase + "ProblemBadRequest"
	// ProblemInProgress (409): a request with the same key is being
	// processed. Retry after the Retry-After header's delay, with the
	// same key: the retry gets its response.
	ProblemInProgress = problemBase + "ProblemInProgress"
	// ProblemKeyReused (422): the key was used before with a different
	// request (method, path, query or body). The first response is never
	// given for another request; use a new key for a new intent.
	ProblemKeyReused = problemBase + "ProblemKeyReused"
	// ProblemResponseNotStored (410): the request with this key was
	// processed (its effect happened), but its response was too large to
	// store, so it cannot be replayed, and the request is not run again.
	ProblemResponseNotStored = problemBase + "ProblemResponseNotStored"
	// ProblemStoreUnavailable (503): the idempotency store could not be
	// reached, so the request was not processed. Retry with the same key.
	ProblemStoreUnavailable = problemBase + "ProblemStoreUnavailable"
	// ProblemScopeRejected (403 unless the scope function chose another
	// status with [RejectScope]): the request's scope (tenant, actor) could
	// not be established, so its key cannot be used. Nothing was claimed
	// and the handler did not run.
	ProblemScopeRejected = problemBase + "ProblemScopeRejected"
	// ProblemResultCorrupt (500): the stored response of this key cannot
	// be read (written by another version or codec, or damaged). The
	// request is not run again: an operator must inspect the record.
	ProblemResultCorrupt = problemBase + "ProblemResultCorrupt"
	// ProblemReferenceFailed (500): the response of this key was stored
	// by reference ([StoreReference]) and the reference could not be
	// rendered ([WithReferenceRenderer]). The request is not run again.
	ProblemReferenceFailed = problemBase + "ProblemReferenceFailed"
	// ProblemInternal (500): the handler panicked (the key was released,
	// so a retry runs it again), or the request failed in a way the
	// middleware cannot classify.
	ProblemInternal = problemBase + "ProblemInternal"
)

// Problem is an RFC 9457 problem details object, the body of every error
// response the middleware writes.
type Problem struct {
	// Type is a URI identifying the kind of problem: one of the Problem*
	// constants, whose documentation says what happened and what to do.
	// Clients should branch on it, not on Title or Detail.
	Type string `json:"type"`
	// Title is a short human-readable summary of the problem type; it is
	// the same for every occurrence of the type.
	Title string `json:"title"`
	// Status is the HTTP status code of the response, repeated in the
	// body for clients that only keep the body.
	Status int `json:"status"`
	// Detail explains this occurrence of the problem for a human, such as
	// which key rule was broken. It may be empty and is not meant to be
	// parsed.
	Detail string `json:"detail,omitempty"`
}

// ProblemContentType is the media type of problem responses.
const ProblemContentType = "application/problem+json"

var problemTitles = map[string]string{
	ProblemKeyMissing:        "Idempotency key required",
	ProblemKeyMalformed:      "Malformed idempotency key",
	ProblemBodyTooLarge:      "Request body too large",
	ProblemBadRequest:        "Unreadable request",
	ProblemInProgress:        "A request with this idempotency key is in progress",
	ProblemKeyReused:         "Idempotency key reused with a different request",
	ProblemResponseNotStored: "Response of the original request not stored",
	ProblemStoreUnavailable:  "Idempotency store unavailable",
	ProblemScopeRejected:     "Request scope rejected",
	ProblemResultCorrupt:     "Stored response unreadable",
	ProblemReferenceFailed:   "Stored reference not rendered",
	ProblemInternal:          "Internal error",
}

// An ErrorAnswer is an answer the middleware gives by itself, the
// handler not having run (or having panicked): what an [ErrorRenderer]
// renders.
type ErrorAnswer struct {
	// Outcome is the call's outcome (see [idempotency.Outcome]):
	// OutcomeInProgress for a 409, OutcomeMismatch for a 422, and so on.
	// An answer given before the executor was called (a key missing or
	// malformed, a body too large or unreadable, a scope rejected) is
	// OutcomeInvalidKey, and its Problem.Type says which; a handler that
	// panicked is OutcomeReleased.
	Outcome idempotency.Outcome
	// Problem is the RFC 9457 problem the middleware would send; its
	// Status is the response's status.
	Problem Problem
	// RetryAfter is how long the client should wait before it retries
	// with the same key, 0 when a retry with it cannot succeed. The
	// response's Retry-After header already says it, in whole seconds.
	RetryAfter time.Duration
	// LeaseLeft is, for OutcomeInProgress, the time left on the lease of
	// the request that holds the key, as the store judged it: when it has
	// passed, a holder that crashed can be taken over. The [LeaseHeader]
	// already says it, in whole seconds.
	LeaseLeft time.Duration
}

// An ErrorRenderer writes an [ErrorAnswer]: its status, its body and any
// header (for a client that cannot parse RFC 9457 problems, see the
// examples module's clients). The middleware has already set the
// headers Cache-Control: no-store, Retry-After and [LeaseHeader] when they
// apply, and the replay header on a 410; the renderer may change them.
// It must write the status (a renderer that writes nothing gets the
// default problem written after it). It runs only when the handler did
// not run for this request, so it can never cause a second run.
type ErrorRenderer func(w http.ResponseWriter, r *http.Request, a ErrorAnswer)

// RenderProblem is the default [ErrorRenderer]: a.Problem as
// application/problem+json with the problem's status.
func RenderProblem(w http.ResponseWriter, r *http.Request, a ErrorAnswer) {
	body, _ := json.Marshal(a.Problem)
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(a.Problem.Status)
	w.Write(body)
}

// seconds is d in whole seconds, rounded up, as Retry-After counts.
func seconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// ScopeError is the error a [ScopeFunc] returns to reject a request with
// a status and detail of its choosing. Make one with [RejectScope].
type ScopeError struct {
	// Status is the response's status: 400 to 599. Another value counts
	// as 403.
	Status int
	// Detail is sent to the client as the problem's detail.
	Detail string
}

// Error gives the status and the detail.
func (e *ScopeError) Error() string {
	return "httpidem: scope rejected (" + strconv.Itoa(e.Status) + "): " + e.Detail
}

// RejectScope returns the error with which a [ScopeFunc] rejects a
// request: the client gets status (say 401 for a missing credential, 403
// for an actor that may not use the route, 503 when the tenant directory
// is down) and a problem of type [ProblemScopeRejected] with detail.
func RejectScope(status int, detail string) error {
	return &ScopeError{Status: status, Detail: detail}
}
