package httpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

func TestNewRequiresAScope(t *testing.T) {
	r := newRunner(t, nil)
	_, err := httpidem.New(r)
	if !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithSharedKeySpace") {
		t.Fatalf("New without a scope: %v; want ErrInvalidArgument naming WithScope and WithSharedKeySpace", err)
	}
	_, err = httpidem.New(r, httpidem.WithScope(oneTenant), httpidem.WithSharedKeySpace())
	if !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("New with both: %v", err)
	}
	if _, err := httpidem.New(r, httpidem.WithSharedKeySpace()); err != nil {
		t.Fatalf("New with a shared key space said by name: %v", err)
	}
}

// byUser scopes a request to its X-User header, and rejects requests
// without one the way a service without a logged-in user would.
func byUser(r *http.Request) ([]string, error) {
	switch u := r.Header.Get("X-User"); u {
	case "":
		return nil, httpidem.RejectScope(http.StatusUnauthorized, "log in first")
	case "broken":
		return nil, errors.New("tenant directory: connection refused to 10.0.0.7")
	case "empty-part":
		return []string{"", "POST /p"}, nil
	case "no-parts":
		return nil, nil
	default:
		return []string{u, "POST /p"}, nil
	}
}

// TestCrossTenantKeys: bob sends alice's key with the same body. He never
// gets alice's response, and his own request runs.
func TestCrossTenantKeys(t *testing.T) {
	var runs atomic.Int64
	store := memStore(nil)
	h := wrapRaw(t, newRunner(t, store), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "receipt for "+r.Header.Get("X-User"))
	}), httpidem.WithScope(byUser))
	a := do(h, "POST", "/p", "alice-key", `{"amount":1}`, "X-User", "alice")
	for range 2 {
		b := do(h, "POST", "/p", "alice-key", `{"amount":1}`, "X-User", "bob")
		if b.Body.String() != "receipt for bob" || b.Code != 201 {
			t.Fatalf("bob got %d %q", b.Code, b.Body)
		}
	}
	if a.Body.String() != "receipt for alice" {
		t.Fatalf("alice got %q", a.Body)
	}
	b := do(h, "POST", "/p", "alice-key", `{"amount":1}`, "X-User", "bob")
	if runs.Load() != 2 || b.Header().Get("Idempotent-Replayed") != "true" || b.Body.String() != "receipt for bob" {
		t.Fatalf("runs %d, bob's retry %q %q: want one run each, bob's own replay", runs.Load(), b.Header().Get("Idempotent-Replayed"), b.Body)
	}
}

// TestSharedKeySpaceSaidByName: with a shared key space, the key alone
// addresses the record, as documented: the second client gets the first
// one's response.
func TestSharedKeySpaceSaidByName(t *testing.T) {
	var runs atomic.Int64
	h := wrapRaw(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "receipt for "+r.Header.Get("X-User"))
	}), httpidem.WithSharedKeySpace())
	do(h, "POST", "/p", "k", `{}`, "X-User", "alice")
	b := do(h, "POST", "/p", "k", `{}`, "X-User", "bob")
	if runs.Load() != 1 || b.Header().Get("Idempotent-Replayed") != "true" || b.Body.String() != "receipt for alice" {
		t.Fatalf("runs %d, second client got %q %q", runs.Load(), b.Header().Get("Idempotent-Replayed"), b.Body)
	}
}

// TestScopeRejection: a scope function that rejects a request, or returns
// an empty scope or part, gets a problem; the handler does not run and
// nothing is stored.
func TestScopeRejection(t *testing.T) {
	var runs atomic.Int64
	store := memStore(nil)
	h := wrapRaw(t, newRunner(t, store), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
	}), httpidem.WithScope(byUser))
	for _, c := range []struct {
		user   string
		status int
		detail string
	}{
		{"", 401, "log in first"},
		{"broken", 403, "could not be established"},
		{"empty-part", 403, "is empty"},
		{"no-parts", 403, "no scope"},
	} {
		w := do(h, "POST", "/p", "k", `{}`, "X-User", c.user)
		p := problemOf(t, w)
		if w.Code != c.status || p.Type != httpidem.ProblemScopeRejected || !strings.Contains(p.Detail, c.detail) {
			t.Errorf("user %q: %d %+v; want %d %s with %q", c.user, w.Code, p, c.status, httpidem.ProblemScopeRejected, c.detail)
		}
		if strings.Contains(p.Detail, "10.0.0.7") {
			t.Errorf("user %q: the scope function's error text reached the client: %q", c.user, p.Detail)
		}
	}
	if runs.Load() != 0 || store.Len() != 0 {
		t.Fatalf("handler ran %d times, %d records stored; want none", runs.Load(), store.Len())
	}
}

func problemOf(t *testing.T, w *httptest.ResponseRecorder) httpidem.Problem {
	t.Helper()
	var p httpidem.Problem
	if ct := w.Header().Get("Content-Type"); ct != httpidem.ProblemContentType {
		t.Fatalf("Content-Type %q, want %q (body %q)", ct, httpidem.ProblemContentType, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	return p
}

// quietServer is an httptest server that keeps net/http's panic logs out
// of the test output.
func quietServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	return srv
}

// TestPanicOnBareServer: with no recovery middleware around it, a handler
// that panics gives its client a 500 problem, not a dropped connection,
// and the key is released: the retry runs the handler.
func TestPanicOnBareServer(t *testing.T) {
	var runs atomic.Int64
	srv := quietServer(wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			io.WriteString(w, "half a response")
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})))
	defer srv.Close()
	resp, body := post(t, http.DefaultTransport, srv.URL+"/p", "k", `{}`)
	if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != httpidem.ProblemContentType || strings.Contains(body, "half") {
		t.Fatalf("after the panic: %d %q %q; want a 500 problem", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	resp, body = post(t, http.DefaultTransport, srv.URL+"/p", "k", `{}`)
	if resp.StatusCode != 201 || body != "charged" || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %q; want the handler run again", resp.StatusCode, body)
	}
}

// TestAbortHandlerPanicIsNotAnswered: http.ErrAbortHandler means "abort
// the response": the middleware releases the key and lets it go on
// without writing a 500.
func TestAbortHandlerPanicIsNotAnswered(t *testing.T) {
	srv := quietServer(wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	})))
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/p", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	if resp, err := http.DefaultTransport.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("got %d; want the connection aborted", resp.StatusCode)
	}
}

// TestTrailers: trailers declared by the handler reach the client as
// trailers on the fresh response (not as headers), and are not replayed.
func TestTrailers(t *testing.T) {
	srv := httptest.NewServer(wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum, X-Count")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "payload")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set("X-Count", "7")
		w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
		w.Header().Set("X-After-Header", "ignored") // too late to be a header
	})))
	defer srv.Close()
	resp, body := post(t, http.DefaultTransport, srv.URL+"/p", "k", `{}`)
	if resp.StatusCode != 201 || body != "payload" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Checksum") != "" || resp.Header.Get("X-After-Header") != "" {
		t.Fatalf("header %v: trailers or late headers sent as headers", resp.Header)
	}
	for name, want := range map[string]string{"X-Checksum": "abc123", "X-Count": "7", "X-Late": "undeclared"} {
		if got := resp.Trailer.Get(name); got != want {
			t.Errorf("trailer %s = %q, want %q (trailers %v)", name, got, want, resp.Trailer)
		}
	}
	resp, body = post(t, http.DefaultTransport, srv.URL+"/p", "k", `{}`)
	if resp.Header.Get("Idempotent-Replayed") != "true" || body != "payload" || len(resp.Trailer) != 0 || resp.Header.Get("Trailer") != "" {
		t.Fatalf("replay: %q %q trailers %v header %v; want the body without trailers", resp.Header.Get("Idempotent-Replayed"), body, resp.Trailer, resp.Header)
	}
}

// TestTryAgainLaterIsNotStored: 408 and 429 mean "try again later" (a rate
// limiter inside the middleware, say): they are sent but not stored, so
// the retry runs the handler instead of replaying the refusal for a day.
func TestTryAgainLaterIsNotStored(t *testing.T) {
	for _, status := range []int{http.StatusRequestTimeout, http.StatusTooManyRequests} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var runs atomic.Int64
			h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					w.Header().Set("Retry-After", "1")
					http.Error(w, "slow down", status)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			if w := do(h, "POST", "/p", "k", `{}`); w.Code != status || w.Header().Get("Retry-After") != "1" {
				t.Fatalf("first: %d, want the handler's %d", w.Code, status)
			}
			if w := do(h, "POST", "/p", "k", `{}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry: %d replayed=%q; want a fresh run", w.Code, w.Header().Get("Idempotent-Replayed"))
			}
		})
	}
	for status, want := range map[int]bool{200: true, 201: true, 302: true, 400: true, 402: true, 409: true, 422: true,
		103: false, 408: false, 429: false, 500: false, 503: false} {
		if httpidem.Stored(status) != want {
			t.Errorf("Stored(%d) = %v", status, !want)
		}
	}
}

// TestTransportDoesNotRetryReplayedResponses: a 409 or 429 that the server
// replayed is the stored outcome of the first request; retrying it only
// spends attempts.
func TestTransportDoesNotRetryReplayedResponses(t *testing.T) {
	for _, status := range []int{409, 429, 503} {
		var attempts atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			attempts.Add(1)
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(status)
		}))
		clock := newFakeTime()
		resp, _ := post(t, clock.transport(t), srv.URL, "k", "b")
		srv.Close()
		if resp.StatusCode != status || attempts.Load() != 1 || len(clock.Sleeps()) != 0 {
			t.Fatalf("replayed %d: %d after %d attempts; want no retry", status, resp.StatusCode, attempts.Load())
		}
	}
}

// rolledBack is an executor that runs fn, then reports that its effects
// were rolled back with the key (a transaction that failed to commit).
type rolledBack struct{ runs atomic.Int64 }

func (e *rolledBack) Execute(ctx context.Context, req idempotency.Request, fn func(context.Context) ([]byte, error)) (idempotency.Result[[]byte], error) {
	e.runs.Add(1)
	fn(ctx)
	return idempotency.Result[[]byte]{}, &idempotency.StoreError{Op: "commit", Err: errors.New("connection reset")}
}

// TestRolledBackHandlerGets503: when the executor says the handler's
// effects were rolled back (StoreError with Ran false), the client must
// not get the handler's success: it gets 503 and retries.
func TestRolledBackHandlerGets503(t *testing.T) {
	exec := &rolledBack{}
	h := wrapRaw(t, exec, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}), httpidem.WithScope(oneTenant))
	w := do(h, "POST", "/p", "k", `{}`)
	if p := problemOf(t, w); w.Code != 503 || p.Type != httpidem.ProblemStoreUnavailable || exec.runs.Load() != 1 {
		t.Fatalf("%d %+v; want 503 store unavailable, not the rolled-back 201", w.Code, p)
	}
}
