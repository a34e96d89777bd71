package httpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

func newRunner(t testing.TB, store idempotency.Store, opts ...idempotency.Option) *idempotency.Runner {
	t.Helper()
	if store == nil {
		store = memStore(nil)
	}
	r, err := idempotency.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wrap makes the middleware on r around h, scoped to one tenant.
func wrap(t testing.TB, r *idempotency.Runner, h http.Handler, opts ...httpidem.Option) http.Handler {
	t.Helper()
	return wrapRaw(t, r, h, append([]httpidem.Option{httpidem.WithScope(oneTenant)}, opts...)...)
}

func oneTenant(*http.Request) ([]string, error) { return []string{"tenant-1"}, nil }

// wrapRaw is wrap without the scope: the options must give one.
func wrapRaw(t testing.TB, exec idempotency.Executor, h http.Handler, opts ...httpidem.Option) http.Handler {
	t.Helper()
	mw, err := httpidem.New(exec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw(h)
}

// payments is a handler with a countable effect: every run that gets to
// the end "charges" once.
type payments struct {
	runs atomic.Int64
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := p.runs.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(n, 10))
	w.Header().Set("ETag", `"v1"`)
	w.Header().Set("X-Not-Listed", "x")
	http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret-" + strconv.FormatInt(n, 10)})
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"payment":%d,"request":%s}`, n, body)
}

// do sends a request straight to h and returns the recorded response.
func do(h http.Handler, method, target, key, body string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if body == "" {
		req = httptest.NewRequest(method, target, nil)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// problem checks an RFC 9457 response and returns it.
func problem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) httpidem.Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != httpidem.ProblemContentType {
		t.Fatalf("Content-Type %q, want %q", ct, httpidem.ProblemContentType)
	}
	var p httpidem.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" {
		t.Fatalf("problem %+v, want type %s status %d and a title", p, typ, status)
	}
	return p
}

func TestReplay(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p)
	first := do(h, "POST", "/payments", "k1", `{"amount":100}`)
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	if first.Header().Get("Set-Cookie") == "" || first.Header().Get("X-Not-Listed") != "x" {
		t.Fatalf("the first response must carry every header the handler set: %v", first.Header())
	}
	if first.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("a fresh response must not say it is replayed")
	}
	for range 3 {
		again := do(h, "POST", "/payments", "k1", `{"amount":100}`)
		if again.Code != first.Code || again.Body.String() != first.Body.String() {
			t.Fatalf("replay %d %q, want %d %q", again.Code, again.Body, first.Code, first.Body)
		}
		for _, name := range []string{"Content-Type", "Location", "ETag", "Content-Length"} {
			if !reflect.DeepEqual(again.Header()[name], first.Header()[name]) {
				t.Fatalf("header %s: replay %q, first %q", name, again.Header()[name], first.Header()[name])
			}
		}
		if got := again.Header().Get("Idempotent-Replayed"); got != "true" {
			t.Fatalf("Idempotent-Replayed = %q, want true", got)
		}
		if c := again.Header().Values("Set-Cookie"); len(c) != 0 {
			t.Fatalf("Set-Cookie replayed: %q", c)
		}
		if v := again.Header().Get("X-Not-Listed"); v != "" {
			t.Fatalf("a header off the allowlist was replayed: %q", v)
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// The recorder's buffers are reused by later requests: a handler that
// keeps its ResponseWriter and writes after it returned (which net/http
// forbids) gets an error, and its bytes reach neither its own response,
// nor a later one, nor what is replayed.
func TestWriteAfterReturn(t *testing.T) {
	var kept http.ResponseWriter
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "first" {
			kept = w
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, r.Header.Get("Idempotency-Key"))
	}))
	first := do(h, "POST", "/payments", "first", `{}`)
	late := kept
	if n, err := late.Write([]byte("LATE")); err == nil || n != 0 {
		t.Fatalf("write after return: %d, %v; want an error", n, err)
	}
	if n, err := io.WriteString(late, "LATE"); err == nil || n != 0 {
		t.Fatalf("WriteString after return: %d, %v; want an error", n, err)
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			key := "k-" + strconv.Itoa(i)
			if w := do(h, "POST", "/payments", key, `{}`); w.Code != http.StatusCreated || w.Body.String() != key {
				t.Errorf("%s: %d %q", key, w.Code, w.Body)
			}
			late.Write([]byte("LATE"))
		})
	}
	wg.Wait()
	again := do(h, "POST", "/payments", "first", `{}`)
	if first.Body.String() != "first" || again.Body.String() != "first" {
		t.Fatalf("first %q, replayed %q; want %q", first.Body, again.Body, "first")
	}
}

func TestMismatch(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p, httpidem.WithMethods("POST", "PATCH"))
	if w := do(h, "POST", "/payments?a=1&b=2", "k", `{"amount":100,"currency":"EUR"}`); w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	for _, tc := range []struct {
		name, method, target, body string
	}{
		{"other body", "POST", "/payments?a=1&b=2", `{"amount":101,"currency":"EUR"}`},
		{"other path", "POST", "/refunds?a=1&b=2", `{"amount":100,"currency":"EUR"}`},
		{"other method", "PATCH", "/payments?a=1&b=2", `{"amount":100,"currency":"EUR"}`},
		{"other query", "POST", "/payments?a=1&b=3", `{"amount":100,"currency":"EUR"}`},
		{"no body", "POST", "/payments?a=1&b=2", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problem(t, do(h, tc.method, tc.target, "k", tc.body), http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		})
	}
	// Semantically equal JSON and a reordered query are the same request.
	w := do(h, "POST", "/payments?b=2&a=1", "k", "{ \"currency\" : \"EUR\", \"amount\" : 1.00e2 }")
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("canonical JSON / sorted query: %d %s, want a replayed 201", w.Code, w.Body)
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestMismatchRawBody(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p)
	send := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/upload", strings.NewReader(body))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("Idempotency-Key", "raw")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := send(`{"a":1}`); w.Code != 201 {
		t.Fatal(w.Code)
	}
	// Not JSON by its Content-Type: the bytes count, whitespace included.
	problem(t, send(`{"a": 1}`), 422, httpidem.ProblemKeyReused)
	if w := send(`{"a":1}`); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same bytes: %d, want a replay", w.Code)
	}
}

func TestMissingKey(t *testing.T) {
	p := &payments{}
	r := newRunner(t, nil)
	h := wrap(t, r, p)
	pr := problem(t, do(h, "POST", "/payments", "", `{}`), 400, httpidem.ProblemKeyMissing)
	if !strings.Contains(pr.Detail, "Idempotency-Key") {
		t.Fatalf("detail %q should name the header", pr.Detail)
	}
	// Methods that are not managed pass through, key or not.
	if w := do(h, "GET", "/payments", "", ""); w.Code != 201 {
		t.Fatalf("GET: %d", w.Code)
	}
	// A route that does not require a key passes through without one...
	opt := wrap(t, r, p, httpidem.WithRequired(func(r *http.Request) bool { return r.URL.Path == "/payments" }))
	problem(t, do(opt, "POST", "/payments", "", `{}`), 400, httpidem.ProblemKeyMissing)
	before := p.runs.Load()
	do(opt, "POST", "/search", "", `{}`)
	do(opt, "POST", "/search", "", `{}`)
	if got := p.runs.Load() - before; got != 2 {
		t.Fatalf("unkeyed optional route ran %d times, want 2", got)
	}
	// ...and with one, it is de-duplicated.
	do(opt, "POST", "/search", "s", `{}`)
	do(opt, "POST", "/search", "s", `{}`)
	if got := p.runs.Load() - before; got != 3 {
		t.Fatalf("keyed optional route ran %d more times, want 1", got-2)
	}
	if p.runs.Load() != 4 {
		t.Fatalf("runs %d", p.runs.Load())
	}
}

func TestMalformedKey(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p,
		httpidem.WithKeyValidator(func(k string) error {
			if strings.HasPrefix(k, "bad") {
				return errors.New("keys must not start with bad")
			}
			return nil
		}))
	for name, hdr := range map[string][]string{
		"empty":            {""},
		"blank":            {"   "},
		"twice":            {"a", "b"},
		"unterminated":     {`"abc`},
		"bad escape":       {`"a\x"`},
		"after the quote":  {`"abc";p=1`},
		"control in quote": {"\"a\tb\""},
		"control bare":     {"a\x01b"},
		"too long":         {strings.Repeat("k", 256)},
		"invalid UTF-8":    {"k\xff"},
		"validator":        {"bad-key"},
	} {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest("POST", "/payments", strings.NewReader(`{}`))
			req.Header["Idempotency-Key"] = hdr
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			problem(t, w, 400, httpidem.ProblemKeyMalformed)
		})
	}
	if n := p.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times on malformed keys", n)
	}
}

func TestQuotedKeys(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p)
	for _, tc := range []struct{ first, again string }{
		{`abc`, `"abc"`},                     // RFC 8941 string and bare key are the same key
		{`"8e03978e-40d5"`, `8e03978e-40d5`}, // the draft's example form
		{` spaced `, `"spaced"`},             // optional whitespace is trimmed
		{`"a\"b\\c"`, `a"b\c`},               // escapes are decoded
	} {
		before := p.runs.Load()
		if w := do(h, "POST", "/p", tc.first, `{}`); w.Code != 201 {
			t.Fatalf("%s: %d %s", tc.first, w.Code, w.Body)
		}
		if w := do(h, "POST", "/p", tc.again, `{}`); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s then %s: %d, want a replay", tc.first, tc.again, w.Code)
		}
		if p.runs.Load() != before+1 {
			t.Fatalf("%s: handler ran %d times", tc.first, p.runs.Load()-before)
		}
	}
}

func TestConcurrentInProgress(t *testing.T) {
	const n = 10
	var effects atomic.Int64
	var conflicts atomic.Int64
	release := make(chan struct{})
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effects.Add(1)
		// Hold the lease until every duplicate has been answered, so each
		// of them really overlaps this run.
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "same")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				statuses <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusConflict {
				if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
					t.Errorf("409 with Retry-After %q, want whole seconds >= 1", resp.Header.Get("Retry-After"))
				}
				if conflicts.Add(1) == n-1 {
					close(release)
				}
			}
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[201] != 1 || count[409] != n-1 || len(count) != 2 {
		t.Fatalf("statuses %v, want one 201 and %d 409", count, n-1)
	}
	if e := effects.Load(); e != 1 {
		t.Fatalf("effects %d, want 1", e)
	}
}

func TestWaitInsteadOf409(t *testing.T) {
	var effects atomic.Int64
	started := make(chan struct{})
	h := wrap(t, newRunner(t, nil, idempotency.WithWait(5*time.Second)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effects.Add(1)
		close(started)
		time.Sleep(100 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- do(h, "POST", "/p", "w", `{}`) }()
	<-started
	dup := do(h, "POST", "/p", "w", `{}`)
	if dup.Code != 201 || dup.Body.String() != "done" || dup.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("waiting duplicate: %d %q replayed=%q", dup.Code, dup.Body, dup.Header().Get("Idempotent-Replayed"))
	}
	if w := <-first; w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	if effects.Load() != 1 {
		t.Fatalf("effects %d", effects.Load())
	}
}

// failingStore is a store that cannot be reached: every call fails.
type failingStore struct{ calls atomic.Int64 }

var errUnreachable = errors.New("dial tcp 127.0.0.1:1: connection refused")

func (s *failingStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.calls.Add(1)
	return idempotency.ClaimResult{}, errUnreachable
}
func (s *failingStore) Renew(context.Context, string, idempotency.Token, time.Duration) error {
	return errUnreachable
}
func (s *failingStore) Checkpoint(context.Context, string, idempotency.Token, string, []byte) error {
	return errUnreachable
}
func (s *failingStore) Complete(context.Context, string, idempotency.Token, []byte, time.Duration) error {
	return errUnreachable
}
func (s *failingStore) Release(context.Context, string, idempotency.Token) error {
	return errUnreachable
}

func TestStoreDown(t *testing.T) {
	p := &payments{}
	fs := &failingStore{}
	h := wrap(t, newRunner(t, fs, idempotency.WithStoreRetries(2, time.Millisecond)), p)
	w := do(h, "POST", "/payments", "k", `{}`)
	problem(t, w, http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if p.runs.Load() != 0 {
		t.Fatal("the handler ran although the store was down")
	}
	if fs.calls.Load() != 2 {
		t.Fatalf("claims %d, want 2 (the runner's retries)", fs.calls.Load())
	}
}

// hangingStore is a black-holed store: Claim never answers, it only
// returns when its context is done, as a driver without timeouts does
// when the network drops packets.
type hangingStore struct {
	*memory.Store
	claims atomic.Int64
}

func (s *hangingStore) Claim(ctx context.Context, _ idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.claims.Add(1)
	<-ctx.Done()
	return idempotency.ClaimResult{}, ctx.Err()
}

// The request's own context is never canceled here, and the middleware
// detaches the store calls from it anyway: only the runner's store
// timeout can end them, and then the client gets 503, not a hang.
func TestStoreHangsTimesOut(t *testing.T) {
	p := &payments{}
	hs := &hangingStore{Store: memStore(nil)}
	h := wrap(t, newRunner(t, hs,
		idempotency.WithStoreTimeout(50*time.Millisecond),
		idempotency.WithStoreRetries(2, time.Millisecond)), p)
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- do(h, "POST", "/payments", "k", `{}`) }()
	var w *httptest.ResponseRecorder
	select {
	case w = <-done:
	case <-time.After(30 * time.Second): // a hang, not a measurement
		t.Fatal("the request still hangs on the black-holed store")
	}
	problem(t, w, http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if p.runs.Load() != 0 {
		t.Fatal("the handler ran although the store never answered")
	}
	if n := hs.claims.Load(); n != 2 {
		t.Fatalf("claims %d, want 2: each attempt timed out, then the runner gave up", n)
	}
}

// completeFails is the memory store whose Complete fails: the handler
// has run, but its result cannot be recorded.
type completeFails struct{ *memory.Store }

func (completeFails) Complete(context.Context, string, idempotency.Token, []byte, time.Duration) error {
	return errUnreachable
}

func TestStoreDownAfterRun(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, completeFails{memStore(nil)}, idempotency.WithStoreRetries(1, 0)), p)
	// The effect happened: the client must learn so, not get a 503 that
	// invites a retry with a new key.
	w := do(h, "POST", "/payments", "k", `{}`)
	if w.Code != 201 || p.runs.Load() != 1 {
		t.Fatalf("%d runs=%d, want the handler's 201", w.Code, p.runs.Load())
	}
	// The record stays STARTED until its lease ends: a retry meanwhile
	// gets 409, never a second run.
	w = do(h, "POST", "/payments", "k", `{}`)
	problem(t, w, 409, httpidem.ProblemInProgress)
	if p.runs.Load() != 1 {
		t.Fatal("ran twice")
	}
	// Retry-After says when to poll (capped at 1s); the lease header how
	// long the holder's lease (the default 30s) still runs, so that a
	// client can wait for its takeover.
	lease, err := strconv.Atoi(w.Header().Get(httpidem.LeaseHeader))
	if ra := w.Header().Get("Retry-After"); ra != "1" || err != nil || lease < 25 || lease > 30 {
		t.Fatalf("409 with Retry-After %q and %s %q, want 1 and the lease left, 25-30", ra,
			httpidem.LeaseHeader, w.Header().Get(httpidem.LeaseHeader))
	}
}

func TestBodyLimit(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p, httpidem.WithMaxBodySize(16))
	problem(t, do(h, "POST", "/p", "k", strings.Repeat("x", 17)), http.StatusRequestEntityTooLarge, httpidem.ProblemBodyTooLarge)
	// Unknown length (chunked): the limit holds while reading.
	req := httptest.NewRequest("POST", "/p", io.MultiReader(strings.NewReader(strings.Repeat("y", 10)), strings.NewReader(strings.Repeat("y", 10))))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	problem(t, w, http.StatusRequestEntityTooLarge, httpidem.ProblemBodyTooLarge)
	if p.runs.Load() != 0 {
		t.Fatal("the handler ran on a body above the limit")
	}
	// Nothing was claimed: the same key with a body at the limit runs.
	if w := do(h, "POST", "/p", "k", `"0123456789abcd"`); w.Code != 201 {
		t.Fatalf("at the limit: %d %s", w.Code, w.Body)
	}
}

func TestResponseLimit(t *testing.T) {
	var runs atomic.Int64
	big := strings.Repeat("z", 10_000)
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		for i := 0; i < len(big); i += 1000 {
			io.WriteString(w, big[i:i+1000])
		}
	}), httpidem.WithMaxResponseSize(4096))
	first := do(h, "POST", "/export", "k", `{}`)
	if first.Code != 200 || first.Body.String() != big {
		t.Fatalf("first client must get the whole response: %d, %d bytes", first.Code, first.Body.Len())
	}
	for range 2 {
		w := do(h, "POST", "/export", "k", `{}`)
		pr := problem(t, w, http.StatusGone, httpidem.ProblemResponseNotStored)
		if pr.Detail == "" || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("problem %+v, replayed %q", pr, w.Header().Get("Idempotent-Replayed"))
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

// The runner's own result limit (smaller than the middleware's) leads to
// the same documented problem, never a second run.
func TestRunnerResultLimit(t *testing.T) {
	var runs atomic.Int64
	h := wrap(t, newRunner(t, nil, idempotency.WithMaxResultSize(100)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, strings.Repeat("a", 500))
	}))
	if w := do(h, "POST", "/x", "k", `{}`); w.Code != 200 || w.Body.Len() != 500 {
		t.Fatalf("first: %d %d", w.Code, w.Body.Len())
	}
	problem(t, do(h, "POST", "/x", "k", `{}`), http.StatusGone, httpidem.ProblemResponseNotStored)
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

func TestNeverStoredHeaders(t *testing.T) {
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Set-Cookie", "a=b")
		h.Set("Connection", "close")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Upgrade", "h2c")
		h.Set("Trailer", "X-T")
		h.Set("X-Kept", "yes")
		h.Set("Content-Type", "text/plain")
		io.WriteString(w, "ok")
	}), httpidem.WithStoredHeaders("Set-Cookie", "Connection", "Keep-Alive", "Upgrade", "Trailer", "X-Kept", "content-type"))
	do(h, "POST", "/x", "k", `{}`)
	w := do(h, "POST", "/x", "k", `{}`)
	if w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("not replayed")
	}
	for _, name := range []string{"Set-Cookie", "Connection", "Keep-Alive", "Upgrade", "Trailer"} {
		if v := w.Header().Values(name); len(v) > 0 {
			t.Errorf("%s replayed: %q", name, v)
		}
	}
	if w.Header().Get("X-Kept") != "yes" || w.Header().Get("Content-Type") != "text/plain" {
		t.Errorf("allowlisted headers missing: %v", w.Header())
	}
}

func TestServerErrorReleases(t *testing.T) {
	var runs atomic.Int64
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			http.Error(w, "gateway down", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	if w := do(h, "POST", "/p", "k", `{}`); w.Code != 502 || !strings.Contains(w.Body.String(), "gateway down") {
		t.Fatalf("first: %d %q, want the handler's 502", w.Code, w.Body)
	}
	w := do(h, "POST", "/p", "k", `{}`)
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after 5xx: %d replayed=%q, want a fresh 201", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	w = do(h, "POST", "/p", "k", `{}`)
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("third: %d, want the 201 replayed", w.Code)
	}
	if runs.Load() != 2 {
		t.Fatalf("runs %d, want 2", runs.Load())
	}
}

func TestClientErrorStored(t *testing.T) {
	var runs atomic.Int64
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		http.Error(w, "insufficient funds", http.StatusPaymentRequired)
	}))
	do(h, "POST", "/p", "k", `{}`)
	w := do(h, "POST", "/p", "k", `{}`)
	if w.Code != 402 || w.Header().Get("Idempotent-Replayed") != "true" || !strings.Contains(w.Body.String(), "insufficient") {
		t.Fatalf("4xx: %d %q, want the 402 replayed", w.Code, w.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

func TestPanicReleases(t *testing.T) {
	var runs atomic.Int64
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			io.WriteString(w, "half a response")
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", v)
			}
		}()
		w := do(h, "POST", "/p", "k", `{}`)
		t.Fatalf("no panic: %d", w.Code)
	}()
	if w := do(h, "POST", "/p", "k", `{}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after panic: %d, want a fresh 201", w.Code)
	}
	if runs.Load() != 2 {
		t.Fatalf("runs %d", runs.Load())
	}
}

func TestScopeIsolatesUsers(t *testing.T) {
	h := wrapRaw(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "receipt for "+r.Header.Get("X-User"))
	}), httpidem.WithScope(func(r *http.Request) ([]string, error) { return []string{r.Header.Get("X-User")}, nil }))
	a := do(h, "POST", "/p", "shared", `{"amount":1}`, "X-User", "alice")
	b := do(h, "POST", "/p", "shared", `{"amount":1}`, "X-User", "bob")
	if a.Body.String() != "receipt for alice" || b.Body.String() != "receipt for bob" {
		t.Fatalf("alice got %q, bob got %q", a.Body, b.Body)
	}
	if b.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("bob's request was answered from alice's record")
	}
	// Each replays their own; a different body under bob's key is refused
	// for bob only.
	if w := do(h, "POST", "/p", "shared", `{"amount":1}`, "X-User", "bob"); w.Body.String() != "receipt for bob" {
		t.Fatalf("bob's replay: %q", w.Body)
	}
	problem(t, do(h, "POST", "/p", "shared", `{"amount":2}`, "X-User", "bob"), 422, httpidem.ProblemKeyReused)
}

func TestLostResponseReplayed(t *testing.T) {
	var runs atomic.Int64
	done := make(chan struct{})
	srv := httptest.NewServer(wrap(t, newRunner(t, nil, idempotency.WithWait(5*time.Second)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		select {
		case <-time.After(300 * time.Millisecond): // longer than the client waits
		case <-r.Context().Done():
			// Were the handler canceled with its client, the effect would
			// be half done and the key released.
			http.Error(w, "canceled", http.StatusServiceUnavailable)
			close(done)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d", n)
		if n == 1 {
			defer close(done)
		}
	})))
	defer srv.Close()
	send := func(timeout time.Duration) (*http.Response, string, error) {
		c := &http.Client{Timeout: timeout}
		req, _ := http.NewRequest("POST", srv.URL+"/p", strings.NewReader(`{"amount":7}`))
		req.Header.Set("Idempotency-Key", "lost")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	if _, _, err := send(50 * time.Millisecond); err == nil {
		t.Fatal("the first attempt should time out")
	}
	<-done
	resp, body, err := send(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || body != "payment 1" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q replayed=%q, want the lost response replayed", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

func TestHandlerSeesLease(t *testing.T) {
	var info idempotency.Info
	var dk string
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ok bool
		info, ok = idempotency.FromContext(r.Context())
		if !ok {
			t.Error("no lease in the handler's context")
		}
		dk, _ = idempotency.DownstreamKey(r.Context(), "charge")
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	w := do(h, "POST", "/p", "key-1", `{"x":1}`)
	if w.Body.String() != `{"x":1}` {
		t.Fatalf("the handler must read the whole body: %q", w.Body)
	}
	if info.Key != "key-1" || info.Fence < 1 || !strings.HasPrefix(dk, "charge:") {
		t.Fatalf("info %+v, downstream key %q", info, dk)
	}
}

func TestOptions(t *testing.T) {
	r := newRunner(t, nil)
	if _, err := httpidem.New(nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("nil runner: %v", err)
	}
	if _, err := httpidem.New((*idempotency.Runner)(nil), httpidem.WithSharedKeySpace()); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("typed nil runner: %v", err)
	}
	for name, o := range map[string]httpidem.Option{
		"nil option":      nil,
		"key header":      httpidem.WithKeyHeader("bad header"),
		"replay header":   httpidem.WithReplayHeader(""),
		"methods":         httpidem.WithMethods(),
		"method":          httpidem.WithMethods("PO ST"),
		"fingerprint":     httpidem.WithFingerprint(nil),
		"body size":       httpidem.WithMaxBodySize(0),
		"response size":   httpidem.WithMaxResponseSize(-1),
		"max retry-after": httpidem.WithMaxRetryAfter(time.Millisecond),
	} {
		if _, err := httpidem.New(r, httpidem.WithSharedKeySpace(), o); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestCustomHeadersAndFingerprint(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p,
		httpidem.WithMethods("PUT"),
		httpidem.WithKeyHeader("x-request-key"),
		httpidem.WithReplayHeader("X-Replayed"),
		httpidem.WithFingerprint(func(r *http.Request, body []byte) (idempotency.Fingerprint, error) {
			if r.Header.Get("X-Fail") != "" {
				return "", errors.New("cannot fingerprint")
			}
			return idempotency.FingerprintParts(r.URL.Path), nil // the body does not count
		}))
	send := func(body string, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("PUT", "/doc", strings.NewReader(body))
		req.Header.Set("X-Request-Key", "k")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	send("one")
	w := send("two")
	if w.Header().Get("X-Replayed") != "true" || !strings.Contains(w.Body.String(), "one") {
		t.Fatalf("custom fingerprint ignores the body: %d %q", w.Code, w.Body)
	}
	problem(t, send("x", "X-Fail", "1"), 400, httpidem.ProblemBadRequest)
	if p.runs.Load() != 1 {
		t.Fatalf("runs %d", p.runs.Load())
	}
	// POST is not managed any more.
	if w := do(h, "POST", "/doc", "", ""); w.Code != 201 {
		t.Fatalf("POST: %d", w.Code)
	}
}

func TestEmptyAndNoContentResponses(t *testing.T) {
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/none" {
			w.WriteHeader(http.StatusNoContent)
		}
		// "/implicit" writes nothing: 200 with an empty body.
	}))
	for path, status := range map[string]int{"/none": 204, "/implicit": 200} {
		do(h, "POST", path, path, `{}`)
		w := do(h, "POST", path, path, `{}`)
		if w.Code != status || w.Body.Len() != 0 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: %d %q, want %d replayed", path, w.Code, w.Body, status)
		}
	}
}

// A handler's Flush (http.Flusher or http.ResponseController) sends
// nothing while its response is buffered, since the response must be
// stored before the client sees any of it; once the response outgrows
// WithMaxResponseSize and streams, Flush reaches the client.
func TestFlush(t *testing.T) {
	handler := func(chunk string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, chunk)
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("Flush through the middleware: %v", err)
			}
			w.(http.Flusher).Flush()
			io.WriteString(w, chunk)
		})
	}
	h := wrap(t, newRunner(t, nil), handler("ab"), httpidem.WithMaxResponseSize(1024))
	first := do(h, "POST", "/p", "k", `{}`)
	if first.Code != 200 || first.Body.String() != "abab" || first.Flushed {
		t.Fatalf("buffered: %d %q, flushed %v; want 200 \"abab\", not flushed before it was stored", first.Code, first.Body.String(), first.Flushed)
	}
	if again := do(h, "POST", "/p", "k", `{}`); again.Body.String() != "abab" || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %q, replayed %q", again.Body.String(), again.Header().Get("Idempotent-Replayed"))
	}
	big := strings.Repeat("z", 64)
	streamed := do(wrap(t, newRunner(t, nil), handler(big), httpidem.WithMaxResponseSize(32)), "POST", "/p", "k", `{}`)
	if streamed.Code != 200 || streamed.Body.String() != big+big || !streamed.Flushed {
		t.Fatalf("streamed: %d, %d bytes, flushed %v; want 200, %d bytes, flushed", streamed.Code, streamed.Body.Len(), streamed.Flushed, 2*len(big))
	}
}
