package httpidem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

// observed records the events an observer gets.
type observed struct {
	mu     sync.Mutex
	events []idempotency.Event
}

func (o *observed) Observe(_ context.Context, e idempotency.Event) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

func tenantHeader(r *http.Request) ([]string, error) {
	t := r.Header.Get("X-Tenant")
	if t == "" {
		return nil, httpidem.RejectScope(http.StatusUnauthorized, "log in first")
	}
	return []string{t}, nil
}

// WithErrorRenderer writes every answer of the middleware's own, with the
// outcome, status and problem, after the middleware set Retry-After and
// the lease header; a renderer that writes nothing gets the default
// problem. The requests refused before the executor (issue 25: scope
// rejections were not counted) reach WithObserver as OutcomeInvalidKey.
func TestErrorRendererAndObserver(t *testing.T) {
	var obs observed
	var mu sync.Mutex
	var rendered []httpidem.ErrorAnswer
	render := func(w http.ResponseWriter, r *http.Request, a httpidem.ErrorAnswer) {
		mu.Lock()
		rendered = append(rendered, a)
		mu.Unlock()
		if a.Outcome == idempotency.OutcomeMismatch {
			return // writes nothing: the default problem follows
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.Problem.Status)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": a.Outcome.String(), "message": a.Problem.Detail}})
	}
	release, started := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := wrapRaw(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}), httpidem.WithScope(tenantHeader), httpidem.WithErrorRenderer(render), httpidem.WithObserver(&obs))

	if w := do(h, "POST", "/p", "k", `{}`); w.Code != 401 || !strings.Contains(w.Body.String(), `"code":"invalid_key"`) {
		t.Fatalf("scope rejected: %d %s", w.Code, w.Body)
	}
	if w := do(h, "POST", "/p", "", `{}`, "X-Tenant", "a"); w.Code != 400 {
		t.Fatalf("key missing: %d %s", w.Code, w.Body)
	}
	if w := do(h, "POST", "/p", "k", `{"a":1}`, "X-Tenant", "a"); w.Code != 201 {
		t.Fatalf("fresh: %d", w.Code)
	}
	problem(t, do(h, "POST", "/p", "k", `{"a":2}`, "X-Tenant", "a"), 422, httpidem.ProblemKeyReused)
	done := make(chan struct{})
	go func() { defer close(done); do(h, "POST", "/slow", "s", `{}`, "X-Tenant", "a") }()
	<-started
	w := do(h, "POST", "/slow", "s", `{}`, "X-Tenant", "a")
	close(release)
	<-done
	if w.Code != 409 || w.Header().Get("Retry-After") != "1" || w.Header().Get(httpidem.LeaseHeader) == "" ||
		!strings.Contains(w.Body.String(), `"code":"in_progress"`) {
		t.Fatalf("in progress: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2", runs.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	want := []idempotency.Outcome{idempotency.OutcomeInvalidKey, idempotency.OutcomeInvalidKey, idempotency.OutcomeMismatch, idempotency.OutcomeInProgress}
	for i, a := range rendered {
		if i >= len(want) || a.Outcome != want[i] || a.Problem.Type == "" || a.Problem.Status < 400 {
			t.Fatalf("rendered %+v, want outcomes %v", rendered, want)
		}
	}
	if last := rendered[len(rendered)-1]; last.RetryAfter <= 0 || last.LeaseLeft <= 0 {
		t.Fatalf("409 answer %+v, want RetryAfter and LeaseLeft", last)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.events) != 2 {
		t.Fatalf("%d events, want the 2 refusals: %v", len(obs.events), obs.events)
	}
	var se *httpidem.ScopeError
	if e := obs.events[0]; e.Outcome != idempotency.OutcomeInvalidKey || !errors.Is(e.Err, idempotency.ErrInvalidKey) || !errors.As(e.Err, &se) {
		t.Fatalf("scope rejection event %+v, want OutcomeInvalidKey wrapping the ScopeError", e)
	}
	if _, err := httpidem.New(newRunner(t, nil), httpidem.WithSharedKeySpace(), httpidem.WithErrorRenderer(nil)); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithErrorRenderer") {
		t.Fatalf("nil renderer: %v", err)
	}
}

// A handler can hijack the connection through the middleware, with
// http.ResponseController or a type assertion: what it writes reaches the
// client, nothing of it is stored, and a retry gets 410 (processed, not
// stored), never a second run.
func TestHijackThroughTheMiddleware(t *testing.T) {
	for _, how := range []string{"ResponseController", "Hijacker"} {
		t.Run(how, func(t *testing.T) {
			var runs atomic.Int64
			h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				var conn net.Conn
				var rw *bufio.ReadWriter
				var err error
				if how == "Hijacker" {
					conn, rw, err = w.(http.Hijacker).Hijack()
				} else {
					conn, rw, err = http.NewResponseController(w).Hijack()
				}
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				defer conn.Close()
				rw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
				rw.Flush()
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			send := func() (*http.Response, string) {
				req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", "k")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}
			if resp, body := send(); resp.StatusCode != 202 || body != "hijacked" {
				t.Fatalf("first: %d %q, want the hijacked answer", resp.StatusCode, body)
			}
			// The hijacked answer reaches the client before the marker is
			// stored: a retry that quick gets 409 and tries again.
			resp, body := send()
			for i := 0; resp.StatusCode == 409 && i < 100; i++ {
				time.Sleep(10 * time.Millisecond)
				resp, body = send()
			}
			if resp.StatusCode != 410 || resp.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(body, "ProblemResponseNotStored") || runs.Load() != 1 {
				t.Fatalf("retry: %d %q after %d runs, want 410 after 1", resp.StatusCode, body, runs.Load())
			}
		})
	}
}
