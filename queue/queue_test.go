package queue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/queue"
)

// Bad input gets a clear error at Enqueue and stores nothing.
func TestEnqueueRefusesBadInput(t *testing.T) {
	q := openQueue(t)
	stream := func() *http.Request {
		r, _ := http.NewRequest("POST", "http://example.test/x", io.NopCloser(strings.NewReader("{}")))
		return r
	}
	keyed := func() *http.Request {
		r := post(t, "http://example.test/x", "{}")
		r.Header.Set("Idempotency-Key", "mine")
		return r
	}
	raw := func(method, u string) *http.Request {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Request{Method: method, URL: pu, Header: http.Header{}}
	}
	big := func() *http.Request { return post(t, "http://example.test/x", strings.Repeat("x", 2<<20)) }
	for _, c := range []struct {
		name string
		req  *http.Request
		want string
	}{
		{"nil request", nil, "nil request"},
		{"no method", raw("", "http://example.test/x"), "no method"},
		{"GET needs no key", raw("GET", "http://example.test/x"), "method GET"},
		{"PUT not in WithMethods", raw("PUT", "http://example.test/x"), "method PUT"},
		{"ftp URL", raw("POST", "ftp://example.test/x"), "not http or https"},
		{"relative URL", raw("POST", "/x"), "not http or https"},
		{"no host", raw("POST", "http:///x"), "no host"},
		{"opaque", raw("POST", "http:example.test"), "no host"},
		{"bad port", &http.Request{Method: "POST", URL: &url.URL{Scheme: "http", Host: "example.test:8a", Path: "/x"}, Header: http.Header{}}, "port"},
		{"credentials in URL", raw("POST", "http://u:p@example.test/x"), "credentials"},
		{"no URL", &http.Request{Method: "POST", Header: http.Header{}}, "no URL"},
		{"a stream body", stream(), "cannot be read again"},
		{"its own key", keyed(), "already has a Idempotency-Key"},
		{"too large", big(), "limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := q.Enqueue(c.req)
			if !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) ||
				!strings.HasPrefix(strings.TrimPrefix(err.Error(), idempotency.ErrInvalidArgument.Error()+": "), "queue: ") {
				t.Errorf("Enqueue: %q, %v; want ErrInvalidArgument with %q, prefixed queue:", key, err, c.want)
			}
		})
	}
	if p, d, err := q.Len(); p != 0 || d != 0 || err != nil {
		t.Errorf("Len: %d pending, %d dead, %v; want nothing stored", p, d, err)
	}
}

// Options that make no sense are refused by name.
func TestOpenRefusesBadOptions(t *testing.T) {
	for _, c := range []struct {
		opt  queue.Option
		want string
	}{
		{nil, "nil option"},
		{queue.WithTransport(nil), "WithTransport"},
		{queue.WithKeyHeader("bad header"), "WithKeyHeader"},
		{queue.WithExpiresHeader(""), "WithExpiresHeader"},
		{queue.WithMethods(), "WithMethods"},
		{queue.WithMethods("GET"), "WithMethods: GET"},
		{queue.WithConcurrency(0), "WithConcurrency"},
		{queue.WithAttemptTimeout(0), "WithAttemptTimeout"},
		{queue.WithKeyLifetime(time.Second), "WithKeyLifetime"},
		{queue.WithBackoff(time.Second, time.Millisecond), "WithBackoff"},
		{queue.WithMaxBodySize(0), "WithMaxBodySize"},
	} {
		q, err := queue.Open(filepath.Join(t.TempDir(), "q"), c.opt)
		if !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%s): %v, want ErrInvalidArgument naming %s", c.want, err, c.want)
		}
		if q != nil {
			q.Close()
		}
	}
}

// The key is made at Enqueue, survives a restart, and every attempt
// sends it; the server runs the request once.
func TestKeySurvivesRestart(t *testing.T) {
	var calls atomic.Int64
	srv, l := idemServer(t, func(w http.ResponseWriter, r *http.Request, body string) bool {
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable) // before the effect: released
			return false
		}
		return created(w, r, body)
	})
	file := filepath.Join(t.TempDir(), "q.queue")
	q := openAt(t, file)
	key := enqueue(t, q, post(t, srv+"/x", `{"n":1}`, "X-Trace", "t1", "Connection", "close"))
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	var got ends
	q = openAt(t, file, queue.WithOnDone(got.handler))
	it, err := q.Inspect(key)
	if err != nil || it.Key != key || it.Method != "POST" || it.URL != srv+"/x" || string(it.Body) != `{"n":1}` ||
		it.Header.Get("X-Trace") != "t1" || it.Header.Get("Connection") != "" || it.State != queue.Pending {
		t.Fatalf("Inspect after a restart: %+v, %v", it, err)
	}
	runUntil(t, q, func() bool { return got.len() == 1 })
	reqs := l.requests()
	if len(reqs) != 3 || reqs[0] != key || reqs[1] != key || reqs[2] != key {
		t.Errorf("the server got keys %q, want %q three times", reqs, key)
	}
	if e := l.all(); len(e) != 1 {
		t.Errorf("%d effects, want 1", len(e))
	}
	end := got.all()[0]
	if end.State != queue.Done || end.Key != key || end.Response.Status != 201 || string(end.Response.Body) != `{"n":1}` ||
		end.Attempts != 3 || end.Response.Replayed {
		t.Errorf("the handler got %+v (response %+v)", end, end.Response)
	}
	if p, _, _ := q.Len(); p != 0 {
		t.Errorf("%d pending after the answer, want 0", p)
	}
}

// Items are sent in order per ordering key, never past an unfinished one,
// while a flaky server makes them retry; each has one effect.
func TestOrderUnderRetries(t *testing.T) {
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(1, 2))
	srv, l := idemServer(t, func(w http.ResponseWriter, r *http.Request, body string) bool {
		mu.Lock()
		x := rnd.IntN(10)
		mu.Unlock()
		switch x {
		case 0, 1, 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			return false
		case 3:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return false
		case 4:
			w.WriteHeader(http.StatusRequestTimeout)
			return false
		}
		return created(w, r, body)
	})
	var got ends
	q := openQueue(t, queue.WithOnDone(got.handler), queue.WithConcurrency(3))
	const orders, per = 4, 15
	var wg sync.WaitGroup
	for o := range orders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				enqueue(t, q, post(t, srv+"/x", fmt.Sprintf(`{"o":%d,"i":%d}`, o, i), "X-Order", fmt.Sprint(o)), queue.InOrder(fmt.Sprint(o)))
			}
		}()
	}
	runUntil(t, q, func() bool { return got.len() == orders*per })
	wg.Wait()
	last := map[string]int{}
	for _, e := range l.all() {
		var o, i int
		fmt.Sscanf(e.body, `{"o":%d,"i":%d}`, &o, &i)
		if n, ok := last[e.order]; ok && i != n+1 || !ok && i != 0 {
			t.Errorf("order %s: effect %d after %d", e.order, i, last[e.order])
		}
		last[e.order] = i
	}
	if n := len(l.all()); n != orders*per {
		t.Errorf("%d effects, want %d", n, orders*per)
	}
}

// What each answer means: done (the handler is told, the item removed),
// retried, or dead (kept with the answer).
func TestAnswers(t *testing.T) {
	for _, c := range []struct {
		name    string
		answers []func(w http.ResponseWriter)
		state   queue.State
		status  int
		reason  string
	}{
		{"201", []func(http.ResponseWriter){status(201)}, queue.Done, 201, ""},
		{"303", []func(http.ResponseWriter){status(303)}, queue.Done, 303, ""},
		{"a stored 400", []func(http.ResponseWriter){status(400)}, queue.Done, 400, ""},
		{"a business 409 without Retry-After", []func(http.ResponseWriter){status(409)}, queue.Done, 409, ""},
		{"503 then 201", []func(http.ResponseWriter){status(503), status(201)}, queue.Done, 201, ""},
		{"500 then 201", []func(http.ResponseWriter){status(500), status(201)}, queue.Done, 201, ""},
		{"408 then 201", []func(http.ResponseWriter){status(408), status(201)}, queue.Done, 201, ""},
		{"429 then 201", []func(http.ResponseWriter){status(429, "Retry-After", "0"), status(201)}, queue.Done, 201, ""},
		{"409 in progress then the replay", []func(http.ResponseWriter){
			func(w http.ResponseWriter) { problem(w, 409, httpidem.ProblemInProgress, "Retry-After", "0") },
			status(201, "Idempotent-Replayed", "true")}, queue.Done, 201, ""},
		{"409 with Retry-After then 201", []func(http.ResponseWriter){status(409, "Retry-After", "0"), status(201)}, queue.Done, 201, ""},
		{"a replayed 409", []func(http.ResponseWriter){status(409, "Idempotent-Replayed", "true", "Retry-After", "0")}, queue.Done, 409, ""},
		{"a replayed 429", []func(http.ResponseWriter){status(429, "Idempotent-Replayed", "true")}, queue.Done, 429, ""},
		{"422 key reused", []func(http.ResponseWriter){
			func(w http.ResponseWriter) { problem(w, 422, httpidem.ProblemKeyReused) }}, queue.Dead, 422, "key reused"},
		{"a handler's 422", []func(http.ResponseWriter){status(422)}, queue.Dead, 422, "422"},
		{"410 not stored", []func(http.ResponseWriter){
			func(w http.ResponseWriter) {
				problem(w, 410, httpidem.ProblemResponseNotStored, "Idempotent-Replayed", "true")
			}}, queue.Dead, 410, "answer is lost"},
		{"500 result corrupt", []func(http.ResponseWriter){
			func(w http.ResponseWriter) { problem(w, 500, httpidem.ProblemResultCorrupt) }}, queue.Dead, 500, "cannot read"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var n atomic.Int64
			srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
				i := int(n.Add(1)) - 1
				c.answers[min(i, len(c.answers)-1)](w)
			})
			var got ends
			q := openQueue(t, queue.WithOnDone(got.handler))
			key := enqueue(t, q, post(t, srv, "{}"))
			runUntil(t, q, func() bool { return got.len() == 1 })
			it := got.all()[0]
			if it.State != c.state || it.Response == nil || it.Response.Status != c.status || !strings.Contains(it.Reason, c.reason) ||
				it.Key != key || it.Attempts != len(c.answers) {
				t.Fatalf("the handler got %s, status %v, reason %q after %d attempts; want %s %d %q after %d",
					it.State, it.Response, it.Reason, it.Attempts, c.state, c.status, c.reason, len(c.answers))
			}
			if int(n.Load()) != len(c.answers) {
				t.Errorf("%d attempts, want %d", n.Load(), len(c.answers))
			}
			p, d, err := q.Len()
			wantDead := 0
			if c.state == queue.Dead {
				wantDead = 1
			}
			if p != 0 || d != wantDead || err != nil {
				t.Errorf("Len: %d pending, %d dead, %v; want 0, %d", p, d, err, wantDead)
			}
			if c.state == queue.Dead {
				dl, err := q.Inspect(key)
				if err != nil || dl.State != queue.Dead || dl.Response == nil || dl.Response.Status != c.status || dl.Reason != it.Reason {
					t.Errorf("the dead letter: %+v, %v", dl, err)
				}
			}
		})
	}
}

func status(code int, header ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
	}
}

// A handler's error keeps the item: it is sent again, the server replays
// its answer, and the handler is told again.
func TestHandlerErrorKeepsItem(t *testing.T) {
	srv, l := idemServer(t, created)
	var calls atomic.Int64
	var replayed atomic.Bool
	q := openQueue(t, queue.WithOnDone(func(ctx context.Context, it *queue.Item) error {
		if calls.Add(1) == 1 {
			return errors.New("the till's disk is busy")
		}
		replayed.Store(it.Response.Replayed)
		return nil
	}))
	enqueue(t, q, post(t, srv, `{"a":1}`))
	runUntil(t, q, func() bool { return calls.Load() == 2 })
	if len(l.all()) != 1 || !replayed.Load() || len(l.requests()) != 2 {
		t.Errorf("%d effects, %d requests, second answer replayed=%v; want 1, 2, true", len(l.all()), len(l.requests()), replayed.Load())
	}
}
