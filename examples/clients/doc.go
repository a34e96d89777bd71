// Package clients shows, with tests, how common HTTP clients are
// configured against the httpidem middleware so that they retry what is
// safe to retry and nothing else:
//
//   - stripe-go (v82) cannot parse RFC 9457 problems: a problem it cannot
//     parse is a generic error, which it retries, 422 included (twice by
//     default, with its own backoff, ignoring Retry-After). The middleware's
//     WithErrorRenderer can answer in the shape of Stripe's API errors
//     ({"error": {"type", "code", "message"}}), which stripe-go parses and
//     does not retry; [StripeErrors] renders the final answers so and
//     leaves the answers that ask for a retry (409, 503) as problems, which
//     stripe-go retries. Better still, give stripe-go an http.Client on
//     httpidem's Transport with MaxNetworkRetries 0: the Transport then does
//     the retries, with Retry-After and the holder's lease.
//   - go-retryablehttp never retries a 409 and honours Retry-After only on
//     429 and 503: give its CheckRetry httpidem.ShouldRetry (which also
//     stops at a replayed answer) and a Backoff that reads Retry-After on
//     409 too ([RetryAfterBackoff]).
//   - httpidem's own Transport needs nothing (httpidem.NewTransport()).
package clients
