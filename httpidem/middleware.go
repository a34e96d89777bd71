package httpidem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/canon"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// ErrTransient is the error the middleware's function returns to the
// executor when the handler answered with a status that means "try
// again" (5xx, 408 Request Timeout, 429 Too Many Requests), so that the
// key is released and a retry runs the handler again. It is transient
// under the runner's default error policy; a custom policy
// ([idempotency.WithErrorPolicy]) must keep it transient, or such
// responses would be stored and replayed for the whole retention. It is
// the same error as grpcidem's ErrTransient.
var ErrTransient = edge.ErrTransient

// Stored reports whether the middleware stores a handler's response of
// this status, to replay it to every retry: 2xx, 3xx and 4xx responses
// are stored, except 408 and 429, which ask the client to try again;
// 1xx (sent at once, as interim responses) and 5xx are not, and their key
// is released so that a retry runs the handler again.
func Stored(status int) bool {
	return status >= 200 && status < 500 &&
		status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// New returns a net/http middleware that makes the handlers it wraps
// idempotent. It runs them through exec: an [*idempotency.Runner] (the
// mode of [idempotency.Do], on any store) or another
// [idempotency.Executor], such as the PostgreSQL adapter's TxExecutor, in
// which the key, the handler's writes and the stored response commit in
// one transaction. A managed request (POST or PATCH by
// default, see [WithMethods]) carrying an Idempotency-Key header runs the
// handler at most once per scope, key and request fingerprint within the
// runner's retention; every retry gets the stored response:
//
//	request                                  response
//	first request with a key                 handler runs; status, body and allowed headers stored
//	retry, same key, same request            stored response, Idempotent-Replayed: true, handler not run
//	same key while the first one runs        409 with Retry-After and Idempotency-Lease-Remaining (or the runner waits: idempotency.WithWait)
//	same key, other body, method or path     422
//	missing key on a route that requires it  400
//	malformed key                            400
//	scope function rejects the request       403 (or the status it chose), nothing claimed
//	body larger than the limit               413, nothing claimed
//	handler answers 5xx, 408 or 429          sent as it is, not stored: the key is released
//	handler panics                           500, the key is released, the panic goes on
//	store unreachable                        503, handler not run
//	retry of a response too large to store   410, handler not run
//
// Every managed request is scoped ([WithScope]); New refuses a middleware
// without a scope unless [WithSharedKeySpace] says so. Error responses are
// RFC 9457 application/problem+json (see [Problem] and the Problem*
// types), unless [WithErrorRenderer] renders them otherwise; a 409 tells
// the time left on the holder's lease ([LeaseHeader]), which the
// [Transport] follows to outlive a crashed holder. Which statuses are stored is [Stored]'s rule. A panic in the
// handler releases the key, answers 500 (unless the handler had started
// streaming a response too large to store), and is then propagated, so
// that the server logs it and an outer recovery middleware sees it.
// Set-Cookie and hop-by-hop headers are never stored. Trailers are sent
// on the fresh response, as the handler declared them, but neither stored
// nor replayed.
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
// streamed to its client instead, and only a marker is stored. As net/http
// requires, the handler must not use its ResponseWriter once it has
// returned: a write after that fails, and reaches no response.
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
// Because the store calls do not end when the client goes away, the
// runner's store timeout bounds them ([idempotency.WithStoreTimeout],
// [idempotency.DefaultStoreTimeout] per attempt by default): a store that
// stops answering, such as a black-holed network, gives 503 in a few
// seconds instead of hanging every request, and the handler does not run.
//
// With an executor other than a Runner, a store failure whose
// [idempotency.StoreError] has Ran false after the handler ran (a
// transaction that did not commit) discards the handler's response and
// answers 503: its effects were rolled back with the key, and the client's
// retry runs it again.
//
// New returns an error wrapping [idempotency.ErrInvalidArgument] for a nil
// executor, a missing scope or an invalid option.
func New(exec idempotency.Executor, opts ...Option) (func(http.Handler) http.Handler, error) {
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
	m := &middleware{exec: exec, cfg: cfg}
	if r, ok := exec.(interface{ Retention() time.Duration }); ok && cfg.expiresHeader != "" {
		m.retention = r.Retention()
	}
	return func(next http.Handler) http.Handler {
		return &handler{m: m, next: next}
	}, nil
}

type middleware struct {
	exec      idempotency.Executor
	cfg       config
	retention time.Duration // the executor's, when it tells it and the expiry header is on
	// expires is the last expiry header value made: the fresh responses
	// of one second, and the replays of one record, share it instead of
	// formatting a date each (values are never changed once sent).
	expires atomic.Pointer[expiresValue]
}

type expiresValue struct {
	unix int64
	v    []string
}

// expiresHeader returns the expiry header's value for unix seconds.
func (m *middleware) expiresHeader(unix int64) []string {
	if e := m.expires.Load(); e != nil && e.unix == unix {
		return e.v
	}
	e := &expiresValue{unix: unix, v: []string{httpDate(unix)}}
	m.expires.Store(e)
	return e.v
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
			m.refuse(w, r, http.StatusBadRequest, ProblemKeyMissing,
				"this request requires an "+c.keyHeader+" header", nil)
			return
		}
		next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		m.refuse(w, r, http.StatusBadRequest, ProblemKeyMalformed,
			"the "+c.keyHeader+" header must appear once", nil)
		return
	}
	key, ok := parseKey(values[0])
	if !ok {
		m.refuse(w, r, http.StatusBadRequest, ProblemKeyMalformed,
			"the "+c.keyHeader+" header must be a key or an RFC 8941 quoted string", nil)
		return
	}
	if c.validate != nil {
		if err := c.validate(key); err != nil {
			m.refuse(w, r, http.StatusBadRequest, ProblemKeyMalformed, err.Error(), err)
			return
		}
	}

	body, status, err := readBody(r, c.maxBody)
	if err != nil {
		typ := ProblemBadRequest
		if status == http.StatusRequestEntityTooLarge {
			typ = ProblemBodyTooLarge
		}
		m.refuse(w, r, status, typ, err.Error(), err)
		return
	}
	fp, err := c.fingerprint(r, body)
	if err != nil {
		m.refuse(w, r, http.StatusBadRequest, ProblemBadRequest, err.Error(), err)
		return
	}
	var scope []string
	if c.scope != nil {
		var ok bool
		if scope, ok = m.scopeOf(w, r); !ok {
			return
		}
	}

	// One allocation for what the handler's run needs, its first
	// recorder included; replays use none of it but the allocation.
	run := &handlerRun{m: m, next: next, w: w, r: r, body: body}
	panicked := true
	defer func() {
		if !panicked {
			return
		}
		p := recover()
		if p == nil {
			return // runtime.Goexit: let it go on
		}
		m.answerPanic(w, r, run.rec, p)
		panic(p)
	}()
	// A client that gives up on a slow response will retry and should then
	// find the result: the handler is not canceled when its client goes
	// away (only when its lease is lost).
	res, err := m.exec.Execute(context.WithoutCancel(r.Context()),
		idempotency.Request{Scope: scope, Key: key, Fingerprint: fp}, run.serve)
	panicked = false
	rec := run.rec
	// The buffers go back to the pool once the response is out, whatever
	// it was: the executor and the store keep no reference to them.
	defer run.release()

	route, outcome := edge.RouteOf(res, err)
	res.Outcome = outcome
	switch {
	case route == edge.Own && rec != nil:
		if rec.expires > 0 && res.Outcome == idempotency.OutcomeCompleted && !rec.direct {
			// Stored: say until when the key is honoured.
			rec.header[c.expiresHeader] = m.expiresHeader(rec.expires)
		}
		rec.flush()
	case route == edge.Replay:
		m.replay(w, r, res.Value)
	case route == edge.NotStored:
		m.notStored(w, r)
	default:
		a := edge.Lookup(answers[:], outcome)
		detail := edge.Detail(a.detail, err)
		var lease time.Duration
		if res.Outcome == idempotency.OutcomeInProgress && !res.Ran {
			lease = res.RetryAfter
		}
		m.answer(w, r, res.Outcome, a.status, a.typ, detail, idempotency.RetryAfter(res, c.maxRetryAfter), lease)
	}
}

// answers are the middleware's answers to the outcomes of a call whose
// handler did not run (see [idempotency.Outcome]); an empty detail means
// the error's text. OutcomeUnknown answers every outcome not listed (an
// executor's error the middleware cannot classify).
var answers = [...]struct {
	status int
	typ    string
	detail string
}{
	idempotency.OutcomeUnknown: {http.StatusInternalServerError, ProblemInternal,
		"the request failed and was not stored; retry with the same key"},
	// A replayed error: the record was not written by this middleware.
	idempotency.OutcomeReplay: {http.StatusInternalServerError, ProblemResultCorrupt,
		"the stored answer of this key is not a response; the request is not run again"},
	idempotency.OutcomeInProgress: {http.StatusConflict, ProblemInProgress,
		"a request with this key is being processed; retry later with the same key"},
	idempotency.OutcomeMismatch: {http.StatusUnprocessableEntity, ProblemKeyReused,
		"this key was used with a different request (method, path, query or body)"},
	idempotency.OutcomeInvalidKey: {http.StatusBadRequest, ProblemKeyMalformed, ""},
	idempotency.OutcomeCorrupt: {http.StatusInternalServerError, ProblemResultCorrupt,
		"the stored response of this key cannot be read; the request is not run again"},
	// Also when the handler ran but its effects were rolled back together
	// with the key (an executor's transaction that did not commit): its
	// response would tell of effects that did not happen.
	idempotency.OutcomeStoreError: {http.StatusServiceUnavailable, ProblemStoreUnavailable,
		"the request was not processed; retry with the same key"},
}

// handlerRun is a run of the handler through the executor.
type handlerRun struct {
	m     *middleware
	next  http.Handler
	w     http.ResponseWriter
	r     *http.Request
	body  []byte
	rec   *recorder // made when the handler runs: replays need none
	first recorder  // rec's storage for the first run
	runs  int
	buf   *buffers // the first run's, from bufPool; nil until it runs
}

// buffers are a run's own buffers: the response body as the handler
// writes it (Write copies into it) and its stored form. Neither is
// handed to the handler, so, unlike the recorder, which the handler holds,
// they are reused across requests.
type buffers struct{ body, stored []byte }

var bufPool = sync.Pool{New: func() any { return new(buffers) }}

// maxPooledBuffer bounds the capacity of a pooled buffer, so that one
// large response does not keep its memory in the pool.
const maxPooledBuffer = 64 << 10

// release cuts the first recorder off its pooled buffers, so that a
// handler that (against net/http's rules) writes after it returned can
// reach no other request's response, and returns them to the pool.
func (run *handlerRun) release() {
	b := run.buf
	if b == nil {
		return
	}
	run.buf = nil
	rec := &run.first
	if cap(rec.body) > 0 && cap(rec.body) <= maxPooledBuffer {
		b.body = rec.body[:0]
	}
	rec.body, rec.done = nil, true
	if cap(b.stored) > maxPooledBuffer {
		b.stored = nil
	}
	bufPool.Put(b)
}

// serve is the executor's fn: it runs the handler into a recorder and
// returns the response to store.
func (run *handlerRun) serve(ctx context.Context) ([]byte, error) {
	c := &run.m.cfg
	// A new recorder for every run: an executor may run fn again (a
	// transaction retried after a serialization failure).
	var stored []byte // the stored form's storage
	if run.runs++; run.runs == 1 {
		run.rec = &run.first
		run.buf = bufPool.Get().(*buffers)
	} else {
		run.rec = new(recorder)
	}
	rec := run.rec
	*rec = recorder{w: run.w, header: make(http.Header), limit: c.maxResponse, refOK: c.renderRef != nil}
	if run.runs == 1 {
		rec.body, stored = run.buf.body[:0], run.buf.stored[:0]
	}
	r2 := run.r.WithContext(ctx)
	if run.body != nil {
		rec.in.Reset(run.body)
		r2.Body = &rec.in
	}
	run.next.ServeHTTP(rec, r2)
	rec.finish()
	if !Stored(rec.status) {
		return nil, ErrTransient
	}
	if d := run.m.retention; d > 0 {
		// The store keeps the record for the retention from its clock at
		// completion, after this: by the same clock, never later.
		rec.expires = time.Now().Add(d).Unix()
	}
	stored = rec.encode(stored, c.stored)
	if run.runs == 1 {
		run.buf.stored = stored // for the next request, once this one is done
	}
	return stored, nil
}

// scopeOf returns r's scope, or answers the rejection and reports false.
func (m *middleware) scopeOf(w http.ResponseWriter, r *http.Request) ([]string, bool) {
	scope, err := m.cfg.scope(r)
	if err == nil {
		if why := edge.ScopeParts(scope); why != "" {
			err = RejectScope(http.StatusForbidden, "the request "+why)
		}
	}
	if err == nil {
		return scope, true
	}
	status, detail := http.StatusForbidden, "the request's scope (tenant, actor) could not be established"
	var se *ScopeError
	if errors.As(err, &se) {
		detail = se.Detail
		if se.Status >= 400 && se.Status <= 599 {
			status = se.Status
		}
	}
	m.refuse(w, r, status, ProblemScopeRejected, detail, err)
	return nil, false
}

// answerPanic answers 500 after the handler panicked with p, unless p is
// http.ErrAbortHandler (the handler meant to abort the response) or the
// response has begun; the executor has released the key already.
func (m *middleware) answerPanic(w http.ResponseWriter, r *http.Request, rec *recorder, p any) {
	if p != http.ErrAbortHandler && (rec == nil || !rec.flushed) {
		m.answer(w, r, idempotency.OutcomeReleased, http.StatusInternalServerError, ProblemInternal,
			"the request failed and was not stored; retry with the same key", 0, 0)
		// Out before the panic goes on: the server closes the connection
		// when it recovers the panic, and would drop a buffered response.
		http.NewResponseController(w).Flush()
	}
}

func (m *middleware) replay(w http.ResponseWriter, r *http.Request, b []byte) {
	c := &m.cfg
	h := w.Header()
	s, err := decodeStored(b, h, c.stored)
	if err != nil {
		a := answers[idempotency.OutcomeCorrupt]
		m.answer(w, r, idempotency.OutcomeCorrupt, a.status, a.typ, a.detail, 0, 0)
		return
	}
	if s.tooLarge {
		m.notStored(w, r)
		return
	}
	h[c.replayHeader] = trueValue
	if s.expires > 0 && c.expiresHeader != "" {
		h[c.expiresHeader] = m.expiresHeader(s.expires)
	}
	if c.replayHook != nil {
		rr := &ReplayedResponse{Status: s.status, Header: h}
		if s.reference {
			rr.Reference = string(s.body)
		} else {
			rr.body = s.body
		}
		c.replayHook(r, rr)
	}
	if s.reference {
		m.renderReference(w, r, s)
		return
	}
	writeBody(w, s.status, s.body)
}

// renderReference answers a replay of a response stored by reference
// through the renderer; a renderer that fails before it wrote anything
// gets a 500 problem, and the handler is never run again.
func (m *middleware) renderReference(w http.ResponseWriter, r *http.Request, s stored) {
	render := m.cfg.renderRef
	if render == nil {
		a := answers[idempotency.OutcomeCorrupt]
		m.answer(w, r, idempotency.OutcomeCorrupt, a.status, ProblemReferenceFailed,
			"the response of this key was stored by reference, and this middleware has no reference renderer; the request is not run again", 0, 0)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	err := render(sw, r, Reference{Ref: string(s.body), Status: s.status})
	if err != nil && !sw.wrote {
		h := w.Header()
		for k := range h {
			if k != m.cfg.replayHeader && k != m.cfg.expiresHeader {
				delete(h, k)
			}
		}
		m.answer(w, r, idempotency.OutcomeReplay, http.StatusInternalServerError, ProblemReferenceFailed,
			"the response of this key was stored by reference, and the reference could not be rendered; the request is not run again", 0, 0)
		return
	}
	if !sw.wrote {
		w.WriteHeader(s.status)
	}
}

// httpDate formats Unix seconds as an HTTP-date (RFC 9110 IMF-fixdate).
func httpDate(unix int64) string {
	var b [len(http.TimeFormat)]byte
	return string(time.Unix(unix, 0).UTC().AppendFormat(b[:0], http.TimeFormat))
}

var trueValue = []string{"true"}

func (m *middleware) notStored(w http.ResponseWriter, r *http.Request) {
	w.Header()[m.cfg.replayHeader] = trueValue
	m.answer(w, r, idempotency.OutcomeResultNotStored, http.StatusGone, ProblemResponseNotStored,
		"the request with this key was processed, but its response was not stored (too large, or written straight to the connection); it is not run again", 0, 0)
}

// refuse answers a request refused before the executor was called, and
// tells the observer, which the executor's runner never hears of it.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, status int, typ, detail string, err error) {
	if o := m.cfg.observer; o != nil {
		if err == nil {
			err = errors.New(detail)
		}
		o.Observe(r.Context(), idempotency.Event{Outcome: idempotency.OutcomeInvalidKey,
			Err: fmt.Errorf("%w: httpidem: %s: %w", idempotency.ErrInvalidKey, problemTitles[typ], err)})
	}
	m.answer(w, r, idempotency.OutcomeInvalidKey, status, typ, detail, 0, 0)
}

// answer sends an answer of the middleware's own through the renderer:
// retry > 0 adds a Retry-After header, lease > 0 the [LeaseHeader].
func (m *middleware) answer(w http.ResponseWriter, r *http.Request, o idempotency.Outcome, status int, typ, detail string, retry, lease time.Duration) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if retry > 0 {
		h.Set("Retry-After", seconds(retry))
	}
	if lease > 0 {
		h.Set(LeaseHeader, seconds(lease))
	}
	a := ErrorAnswer{Outcome: o, Problem: Problem{Type: typ, Title: problemTitles[typ], Status: status, Detail: detail},
		RetryAfter: retry, LeaseLeft: lease}
	if m.cfg.render == nil {
		RenderProblem(w, r, a)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	m.cfg.render(sw, r, a)
	if !sw.wrote {
		RenderProblem(w, r, a)
	}
}

// statusWriter tells whether a renderer wrote its answer.
type statusWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if code >= 200 {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

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
	if len(body) > 0 && isJSON(contentType(r.Header)) {
		// FingerprintParts(r.Method, r.URL.Path, sortedQuery(r), "json",
		// string(FingerprintJSON(body))), two allocations cheaper.
		if fp, ok := canon.JSONRequest(r.Method, r.URL.Path, sortedQuery(r), body); ok {
			return idempotency.Fingerprint(fp), nil
		}
	}
	return RawFingerprint(r, body)
}

// RawFingerprint is a request fingerprint over the method, the path, the
// query with its parameters sorted and the body's exact bytes. It is
// right for clients that resend the same bytes, which retries do; pass it
// to [WithFingerprint]. It saves little over [DefaultFingerprint] on a
// body already in RFC 8785 form (sorted keys, no whitespace), which that
// one only scans, but a few microseconds and about thirty allocations on
// a small JSON body in any other form, which it canonicalizes.
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

// contentType is h.Get("Content-Type") without canonicalizing a name
// that already is.
func contentType(h http.Header) string {
	if v := h["Content-Type"]; len(v) > 0 {
		return v[0]
	}
	return ""
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
