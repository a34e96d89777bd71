// Package httpidem brings idempotency keys to HTTP: a net/http server
// middleware that de-duplicates requests carrying an Idempotency-Key
// header, and a client [Transport] that retries such requests safely.
//
// It follows the IETF HTTPAPI draft "The Idempotency-Key HTTP Header
// Field" and Stripe's documented behaviour. On the server, [New] wraps a
// handler so that a client retrying POST /payments with the same key gets
// the first response replayed (with Idempotent-Replayed: true) instead of
// a second charge; a concurrent duplicate gets 409, a key reused for a
// different request 422, and every error is an RFC 9457 problem. On the
// client, [Transport] retries a keyed request after network errors, 5xx,
// 429 and 409, with exponential backoff, full jitter and Retry-After;
// [NewKey] makes the one key of a user intent that every attempt reuses.
//
// The middleware runs on an [idempotency.Runner], so it works on any
// store: the in-memory one for a single process and tests, PostgreSQL or
// Redis for a fleet; or on another [idempotency.Executor], such as the
// PostgreSQL adapter's TxExecutor, which commits the key, the handler's
// writes and its response in one transaction. Every request is scoped:
// give [WithScope] a function of the request (tenant, authenticated
// actor), so that one client's key never reaches another's response:
//
//	runner, err := idempotency.New(store)
//	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
//		account, ok := accountOf(r) // from the verified credential
//		if !ok {
//			return nil, httpidem.RejectScope(http.StatusUnauthorized, "log in first")
//		}
//		return []string{account, r.Pattern}, nil
//	}))
//
// Beyond the draft: a 409 says how long the holder's lease still runs
// ([LeaseHeader]), which the [Transport] follows to outlive a crashed
// holder; stored responses and replays say until when the key is
// honoured ([DefaultExpiresHeader]), and the Transport stops retrying an
// expired key ([ErrKeyExpired]); large responses can be stored by
// reference and re-rendered on replay ([StoreReference]); the
// middleware's own answers can be rendered for clients that do not read
// problems ([WithErrorRenderer]); [CORS] lets browsers on other origins
// send keys and read the replay marker.
//
// Because the middleware is a plain func(http.Handler) http.Handler, it
// fits chi, gorilla/mux and echo (echo.WrapMiddleware) directly, and gin
// by wrapping the engine; the examples module shows each.
package httpidem
