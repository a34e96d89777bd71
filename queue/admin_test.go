package queue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/queue"
)

// The operator's view: list, inspect, retry now and drop, by key.
func TestOperatorView(t *testing.T) {
	var reject atomic.Bool
	reject.Store(true)
	srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-N") == "0" && reject.Load() {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	var got ends
	q := openQueue(t, queue.WithOnDone(got.handler))
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = enqueue(t, q, post(t, srv, fmt.Sprintf(`{"n":%d}`, i), "X-N", fmt.Sprint(i)), queue.InOrder(fmt.Sprint(i%2)))
	}
	items, err := q.List(queue.Pending, 0, 0)
	if err != nil || len(items) != 4 {
		t.Fatalf("List: %d items, %v", len(items), err)
	}
	for i, it := range items {
		if it.Key != keys[i] || it.ID != uint64(i+1) || it.Order != fmt.Sprint(i%2) || it.Body != nil || it.Method != "POST" {
			t.Errorf("item %d: %+v", i, it)
		}
	}
	page, err := q.List(queue.Pending, 2, 1)
	if err != nil || len(page) != 1 || page[0].Key != keys[2] {
		t.Errorf("List after 2, limit 1: %+v, %v", page, err)
	}
	// Drop one before it is sent.
	if err := q.Drop(keys[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Inspect(keys[3]); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("Inspect of a dropped item: %v, want ErrNotFound", err)
	}
	runUntil(t, q, func() bool { return got.len() == 3 })
	dead, err := q.List(queue.Dead, 0, 0)
	if err != nil || len(dead) != 1 || dead[0].Key != keys[0] || dead[0].Response.Status != 422 {
		t.Fatalf("dead letters: %+v, %v", dead, err)
	}
	// Retry the dead one now that the server takes it: the same key.
	reject.Store(false)
	if err := q.Retry(keys[0]); err != nil {
		t.Fatal(err)
	}
	it, err := q.Inspect(keys[0])
	if err != nil || it.State != queue.Pending || it.Key != keys[0] {
		t.Fatalf("after Retry: %+v, %v", it, err)
	}
	runUntil(t, q, func() bool { return got.len() == 4 })
	last := got.all()[3]
	if last.Key != keys[0] || last.State != queue.Done || last.Response.Status != 201 {
		t.Errorf("the retried item ended %s %v with key %s", last.State, last.Response, last.Key)
	}
	if p, d, err := q.Len(); p != 0 || d != 0 || err != nil {
		t.Errorf("Len: %d, %d, %v; want 0, 0", p, d, err)
	}
	for _, f := range []func(string) error{q.Drop, q.Retry} {
		if err := f("no-such-key"); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("an unknown key: %v, want ErrNotFound", err)
		}
	}
}

// Retry now cuts a pending item's backoff short.
func TestRetryNow(t *testing.T) {
	var n atomic.Int64
	srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "3600") // an hour
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	var got ends
	q := openQueue(t, queue.WithOnDone(got.handler))
	key := enqueue(t, q, post(t, srv, "{}"))
	runUntil(t, q, func() bool {
		it, err := q.Inspect(key)
		return err == nil && it.LastError != ""
	})
	it, err := q.Inspect(key)
	if err != nil || time.Until(it.Next) < 59*time.Minute || it.Attempts != 1 || it.LastError == "" {
		t.Fatalf("after a 503 with Retry-After 3600: %+v, %v", it, err)
	}
	if err := q.Retry(key); err != nil {
		t.Fatal(err)
	}
	runUntil(t, q, func() bool { return got.len() == 1 })
}

// Only one process has a queue open; a second Open says so, promptly.
func TestOpenLocked(t *testing.T) {
	file := filepath.Join(t.TempDir(), "q")
	openAt(t, file)
	start := time.Now()
	_, err := queue.Open(file, queue.WithLockTimeout(50*time.Millisecond))
	if !errors.Is(err, queue.ErrLocked) || time.Since(start) > 5*time.Second {
		t.Errorf("a second Open: %v after %v, want ErrLocked", err, time.Since(start))
	}
}

// Concurrent Enqueues share flushes, and each goroutine's items keep their
// order.
func TestConcurrentEnqueue(t *testing.T) {
	srv, l := idemServer(t, created)
	var got ends
	q := openQueue(t, queue.WithOnDone(got.handler), queue.WithConcurrency(4))
	const g, per = 8, 25
	var wg sync.WaitGroup
	keys := make([][]string, g)
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range per {
				keys[i] = append(keys[i], enqueue(t, q, post(t, srv, fmt.Sprintf(`{"g":%d,"j":%d}`, i, j), "X-Order", fmt.Sprint(i)), queue.InOrder(fmt.Sprint(i))))
			}
		}()
	}
	wg.Wait()
	runUntil(t, q, func() bool { return got.len() == g*per })
	seen := map[string]int{}
	for _, e := range l.all() {
		seen[e.key]++
	}
	byOrder := map[string][]string{}
	for _, e := range l.all() {
		byOrder[e.order] = append(byOrder[e.order], e.key)
	}
	for i := range g {
		if fmt.Sprint(byOrder[fmt.Sprint(i)]) != fmt.Sprint(keys[i]) {
			t.Errorf("goroutine %d: effects in the order %v, enqueued %v", i, byOrder[fmt.Sprint(i)], keys[i])
		}
		for _, k := range keys[i] {
			if seen[k] != 1 {
				t.Errorf("key %s: %d effects", k, seen[k])
			}
		}
	}
}

// Close stops a running Run, which returns ErrClosed; a closed queue
// stores nothing and says so.
func TestClose(t *testing.T) {
	srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	q, err := queue.Open(filepath.Join(t.TempDir(), "q"))
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, q, post(t, srv, "{}"))
	errc := make(chan error, 1)
	go func() { errc <- q.Run(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, queue.ErrClosed) {
			t.Errorf("Run after Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if _, err := q.Enqueue(post(t, srv, "{}")); !errors.Is(err, queue.ErrNotStored) || !errors.Is(err, queue.ErrClosed) {
		t.Errorf("Enqueue after Close: %v, want ErrNotStored and ErrClosed", err)
	}
	if err := q.Run(context.Background()); !errors.Is(err, queue.ErrClosed) {
		t.Errorf("Run of a closed queue: %v", err)
	}
	if _, _, err := q.Len(); !errors.Is(err, queue.ErrClosed) {
		t.Errorf("Len of a closed queue: %v", err)
	}
}
