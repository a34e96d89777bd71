package queue_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/queue"
	"github.com/exactlyonce/idempotency/store/memory"
)

// ledger is a test server's record of the effects its handler had.
type ledger struct {
	mu      sync.Mutex
	effects []effect
	seen    []string // the key of every request the server got, in order
}

type effect struct {
	key, order, body string
}

func (l *ledger) all() []effect {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]effect(nil), l.effects...)
}

func (l *ledger) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// idemServer serves handle behind the httpidem middleware on a memory
// store, counting the requests and, for a handle that returns true, the
// effect.
func idemServer(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, body string) bool) (string, *ledger) {
	t.Helper()
	store, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(runner, httpidem.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if handle(w, r, string(b)) {
			l.mu.Lock()
			l.effects = append(l.effects, effect{key: r.Header.Get("Idempotency-Key"), order: r.Header.Get("X-Order"), body: string(b)})
			l.mu.Unlock()
		}
	})
	counted := idem(inner)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.seen = append(l.seen, r.Header.Get("Idempotency-Key"))
		l.mu.Unlock()
		counted.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, l
}

// created answers 201 with the body echoed: an effect.
func created(w http.ResponseWriter, r *http.Request, body string) bool {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, body)
	return true
}

// rawServer serves handle without idempotency.
func rawServer(t testing.TB, handle http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(handle)
	t.Cleanup(srv.Close)
	return srv.URL
}

func openQueue(t *testing.T, opts ...queue.Option) *queue.Queue {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "q.queue"), opts...)
}

func openAt(t *testing.T, file string, opts ...queue.Option) *queue.Queue {
	t.Helper()
	opts = append([]queue.Option{queue.WithBackoff(5*time.Millisecond, 20*time.Millisecond)}, opts...)
	q, err := queue.Open(file, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func post(t testing.TB, url, body string, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

func enqueue(t testing.TB, q *queue.Queue, req *http.Request, opts ...queue.EnqueueOption) string {
	t.Helper()
	key, err := q.Enqueue(req, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// runUntil runs q until cond holds (checked every millisecond), failing
// the test after 20s.
func runUntil(t *testing.T, q *queue.Queue, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- q.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-errc
			t.Fatal("the condition did not hold within 20s")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
}

// ends collects what a queue's handler is told.
type ends struct {
	mu    sync.Mutex
	items []queue.Item
}

func (e *ends) handler(ctx context.Context, it *queue.Item) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.items = append(e.items, *it)
	return nil
}

func (e *ends) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.items)
}

func (e *ends) all() []queue.Item {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]queue.Item(nil), e.items...)
}

func problem(w http.ResponseWriter, status int, typ string, header ...string) {
	for i := 0; i+1 < len(header); i += 2 {
		w.Header().Set(header[i], header[i+1])
	}
	w.Header().Set("Content-Type", httpidem.ProblemContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(httpidem.Problem{Type: typ, Status: status})
}
