package httpidem

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
)

// ErrServerError is the error the middleware's function returns to the
// runner when the handler answered with a 5xx status, so that the key is
// released and a retry runs the handler again. It is transient under the
// runner's default error policy; a custom policy
// ([idempotency.WithErrorPolicy]) must keep it transient, or 5xx
// responses would be stored and replayed.
var ErrServerError = errors.New("httpidem: handler answered with a server error")

// New returns a net/http middleware that makes the handlers it wraps
// idempotent, on runner's store. A managed request (POST or PATCH by
// default, see [WithMethods]) carrying an Idempotency-Key header runs the
// handler at most once per scope, key and request fingerprint within the
// runner's retention; every retry gets the stored response:
//
//	request                                  response
//	first request with a key                 handler runs; status, body and allowed headers stored
//	retry, same key, same request            stored response, Idempotent-Replayed: true, handler not run
//	same key while the first one runs        409 with Retry-After (or the runner waits: idempotency.WithWait)
//	same key, other body, method or path     422
//	missing key on a route that requires it  400
//	malformed key                            400
//	body larger than the limit               413, nothing claimed
//	store unreachable                        503, handler not run
//	retry of a response too large to store   410, handler not run
//
// Error responses are RFC 9457 application/problem+json (see [Problem]
// and the Problem* types). A response with status 500 or more is not
// stored: the key is released and a retry runs the handler again. A panic
// in the handler releases the key too, and is propagated. 1xx responses,
// Set-Cookie and hop-by-hop headers are never stored.
//
// The response is buffered and stored before any of it is sent, so once
// it is stored every retry within retention gets the same response. The
// handler's response is sent to its client even when it could not be
// stored, because the handler's effect has happened: when the store fails
// after the handler ran ([idempotency.StoreError] with Ran set), the
// record stays STARTED, a retry gets 409 until its lease ends, and a retry
// after that takes it over and runs the handler again; when the lease was
// lost while the handler ran, another request has already taken the record
// over and runs the handler again, and retries get that run's response,
// which may differ. In both cases the second run has a greater fence and
// the recovery points ([idempotency.Step]) recorded so far: guard the
// handler's effects with those and with downstream keys
// ([idempotency.DownstreamKey]) so that a second run does not repeat them.
// A response larger than the stored limit ([WithMaxResponseSize]) is
// streamed to its client instead, and only a marker is stored.
//
// The handler runs with the request's context wrapped by the runner:
// [idempotency.FromContext], [idempotency.DownstreamKey] and
// [idempotency.Step] work in it, and it is canceled with cause
// [idempotency.ErrLeaseLost] if the lease is lost. It is not canceled when
// the client goes away: a client that timed out retries, and its retry
// must find the work done, not half done and released. Lease, retention and
// waiting are the runner's options ([idempotency.WithLease], default 30s;
// [idempotency.WithRetention], default 24h; [idempotency.WithWait],
// default none).
//
// Give the runner a store timeout ([idempotency.WithStoreTimeout], say a
// second or two): because the store calls do not end when the client goes
// away, only the runner's timeout bounds them, and without it (or a
// timeout in the store's driver) a store that stops answering, such as a
// black-holed network, hangs every request instead of answering 503. With
// it, a Claim that times out on every attempt gives 503 and the handler
// does not run.
//
// New returns an error wrapping [idempotency.ErrInvalidArgument] for a nil
// runner or an invalid option.
func New(runner *idempotency.Runner, opts ...Option) (func(http.Handler) http.Handler, error) {
	if runner == nil {
		return nil, invalidArg("nil runner")
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
	m := &middleware{runner: runner, cfg: cfg}
	return func(next http.Handler) http.Handler {
		return &handler{m: m, next: next}
	}, nil
}

type middleware struct {
	runner *idempotency.Runner
	cfg    config
}

type handler struct {
	m    *middleware
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.m.serve(h.next, w, r)
}

func (m *middleware) managed(method string) bool {
	for _, x := range m.cfg.methods {
		if x == method {
			return true
		}
	}
	return false
}

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	c := &m.cfg
	if !m.managed(r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header[c.keyHeader]
	switch {
	case len(values) == 0:
		if c.required == nil || c.required(r) {
			writeProblem(w, http.StatusBadRequest, ProblemKeyMissing,
				"this request requires an "+c.keyHeader+" header", 0)
			return
		}
		next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		writeProblem(w, http.StatusBadRequest, ProblemKeyMalformed,
			"the "+c.keyHeader+" header must appear once", 0)
		return
	}
	key, ok := parseKey(values[0])
	if !ok {
		writeProblem(w, http.StatusBadRequest, ProblemKeyMalformed,
			"the "+c.keyHeader+" header must be a key or an RFC 8941 quoted string", 0)
		return
	}
	if c.validate != nil {
		if err := c.validate(key); err != nil {
			writeProblem(w, http.StatusBadRequest, ProblemKeyMalformed, err.Error(), 0)
			return
		}
	}

	body, status, err := readBody(r, c.maxBody)
	if err != nil {
		typ := ProblemBadRequest
		if status == http.StatusRequestEntityTooLarge {
			typ = ProblemBodyTooLarge
		}
		writeProblem(w, status, typ, err.Error(), 0)
		return
	}
	fp, err := c.fingerprint(r, body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBadRequest, err.Error(), 0)
		return
	}
	var scope []string
	if c.scope != nil {
		scope = c.scope(r)
	}

	var rec *recorder // made when the handler runs: replays need none
	// A client that gives up on a slow response will retry and should then
	// find the result: the handler is not canceled when its client goes
	// away (only when its lease is lost).
	res, err := idempotency.Do(context.WithoutCancel(r.Context()), m.runner,
		idempotency.Request{Scope: scope, Key: key, Fingerprint: fp},
		func(ctx context.Context) ([]byte, error) {
			rec = &recorder{w: w, header: make(http.Header), limit: c.maxResponse}
			rec.body = rec.inline[:0]
			r2 := r.WithContext(ctx)
			if body != nil {
				rec.in.Reset(body)
				r2.Body = &rec.in
			}
			next.ServeHTTP(rec, r2)
			rec.finish()
			if rec.status >= 500 {
				return nil, ErrServerError
			}
			return rec.encode(c.stored), nil
		})

	switch {
	case err == nil && res.Replayed:
		m.replay(w, res.Value)
	case rec != nil:
		// The handler ran: its response is the truth for this client, also
		// when it was a 5xx (released), or when the store failed after it
		// (StoreError.Ran) or the lease was lost under it.
		rec.flush()
	case errors.Is(err, idempotency.ErrInProgress):
		var ip *idempotency.InProgressError
		retry := time.Second
		if errors.As(err, &ip) {
			retry = min(max(ip.RetryAfter, time.Second), c.maxRetryAfter)
		}
		writeProblem(w, http.StatusConflict, ProblemInProgress,
			"a request with this key is being processed; retry later with the same key", retry)
	case errors.Is(err, idempotency.ErrMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused,
			"this key was used with a different request (method, path, query or body)", 0)
	case errors.Is(err, idempotency.ErrInvalidKey):
		writeProblem(w, http.StatusBadRequest, ProblemKeyMalformed, err.Error(), 0)
	case errors.Is(err, idempotency.ErrResultNotStored):
		m.notStored(w)
	case errors.Is(err, idempotency.ErrStore):
		writeProblem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable,
			"the request was not processed; retry with the same key", time.Second)
	default:
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, "", 0)
	}
}

func (m *middleware) replay(w http.ResponseWriter, b []byte) {
	s, err := decodeStored(b, w.Header(), m.cfg.stored)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, err.Error(), 0)
		return
	}
	if s.tooLarge {
		m.notStored(w)
		return
	}
	w.Header()[m.cfg.replayHeader] = trueValue
	writeBody(w, s.status, s.body)
}

var trueValue = []string{"true"}

func (m *middleware) notStored(w http.ResponseWriter) {
	w.Header()[m.cfg.replayHeader] = trueValue
	writeProblem(w, http.StatusGone, ProblemResponseNotStored,
		"the request with this key was processed, but its response was too large to store; it is not run again", 0)
}

// readBody reads r's body in full, up to limit bytes. The status says
// which error response fits.
func readBody(r *http.Request, limit int64) ([]byte, int, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil
	}
	if r.ContentLength > limit {
		return nil, http.StatusRequestEntityTooLarge, errBodyTooLarge(limit)
	}
	var buf []byte
	if r.ContentLength >= 0 {
		buf = make([]byte, 0, r.ContentLength+1) // +1: room to see EOF
	} else {
		buf = make([]byte, 0, min(limit+1, 4096))
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Body.Read(buf[len(buf):min(int64(cap(buf)), limit+1)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, http.StatusRequestEntityTooLarge, errBodyTooLarge(limit)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, http.StatusBadRequest, errors.New("could not read the request body: " + err.Error())
		}
	}
	r.Body.Close()
	return buf, 0, nil
}

func errBodyTooLarge(limit int64) error {
	return errors.New("the request body is larger than " + strconv.FormatInt(limit, 10) + " bytes")
}

// DefaultFingerprint is the default request fingerprint: a SHA-256 of the
// method, the path, the query with its parameters sorted, and the body.
// When the Content-Type is JSON (application/json or any +json type) and
// the body is JSON that RFC 8785 accepts, the body counts in canonical
// form: two bodies are the same request exactly when their RFC 8785 (JSON
// Canonicalization Scheme) forms are equal, so key order, whitespace,
// escaping and number spelling (1, 1.0, 1e0) do not matter. Any other
// body counts as raw bytes.
//
// The JSON form is computed by [idempotency.FingerprintJSON] (an RFC 8785
// library); a body that is not valid JSON counts as raw bytes, so the
// handler, not the middleware, decides how to reject it.
func DefaultFingerprint(r *http.Request, body []byte) (idempotency.Fingerprint, error) {
	if len(body) > 0 && isJSON(r.Header.Get("Content-Type")) {
		if fp, err := idempotency.FingerprintJSON(body); err == nil {
			return idempotency.FingerprintParts(r.Method, r.URL.Path, sortedQuery(r), "json", string(fp)), nil
		}
	}
	return RawFingerprint(r, body)
}

// RawFingerprint is a request fingerprint over the method, the path, the
// query with its parameters sorted and the body's exact bytes. It is
// cheaper than [DefaultFingerprint] (canonicalizing JSON costs a few
// microseconds and about thirty allocations on a small body) and right
// for clients that resend the same bytes, which retries do; pass it to
// [WithFingerprint].
func RawFingerprint(r *http.Request, body []byte) (idempotency.Fingerprint, error) {
	return idempotency.FingerprintParts(r.Method, r.URL.Path, sortedQuery(r), "raw", string(idempotency.FingerprintBytes(body))), nil
}

func sortedQuery(r *http.Request) string {
	query := r.URL.RawQuery
	if query != "" {
		if q, err := url.ParseQuery(query); err == nil {
			query = q.Encode() // sorted by key
		}
	}
	return query
}

// isJSON reports whether a Content-Type is application/json or a +json
// type of application/, parameters aside.
func isJSON(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	const app, suffix = "application/", "+json"
	if len(ct) <= len(app) || !strings.EqualFold(ct[:len(app)], app) {
		return false
	}
	sub := ct[len(app):]
	return strings.EqualFold(sub, "json") ||
		(len(sub) > len(suffix) && strings.EqualFold(sub[len(sub)-len(suffix):], suffix))
}
