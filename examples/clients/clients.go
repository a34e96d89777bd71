package clients

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

// stripeTypes are the Stripe error types of the middleware's final
// answers: a key reused for another request is Stripe's own
// idempotency_error; a request the key rules refuse is an
// invalid_request_error; a stored answer that cannot be read is an
// api_error.
var stripeTypes = map[idempotency.Outcome]string{
	idempotency.OutcomeMismatch:        "idempotency_error",
	idempotency.OutcomeInvalidKey:      "invalid_request_error",
	idempotency.OutcomeResultNotStored: "api_error",
	idempotency.OutcomeCorrupt:         "api_error",
}

// StripeErrors is an httpidem.ErrorRenderer for clients built on
// stripe-go: a final answer (422, 400, 410, 500) is a Stripe API error,
// {"error": {"type": ..., "code": ..., "message": ...}}, with
// Stripe-Should-Retry: false, which stripe-go parses (as a *stripe.Error)
// and does not retry. An answer that asks for a retry with the same key
// (409 in progress, 503 store unavailable: ErrorAnswer.RetryAfter > 0) is
// left a problem, which stripe-go cannot parse and so retries.
func StripeErrors(w http.ResponseWriter, r *http.Request, a httpidem.ErrorAnswer) {
	typ, ok := stripeTypes[a.Outcome]
	if a.RetryAfter > 0 || !ok {
		httpidem.RenderProblem(w, r, a)
		return
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]string{
		"type":    typ,
		"code":    "idempotency_" + a.Outcome.String(),
		"message": a.Problem.Title + ": " + a.Problem.Detail,
		"doc_url": a.Problem.Type,
	}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Stripe-Should-Retry", "false")
	w.WriteHeader(a.Problem.Status)
	w.Write(body)
}

// RetryAfterBackoff is a go-retryablehttp Backoff (its signature) that
// waits the response's Retry-After (whole seconds) whatever the status,
// 409 included, and otherwise a full-jitter exponential backoff between
// min and max.
func RetryAfterBackoff(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
	if resp != nil {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			return time.Duration(s) * time.Second
		}
	}
	d := lo << min(attempt, 30)
	if d <= 0 || d > hi {
		d = hi
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}
