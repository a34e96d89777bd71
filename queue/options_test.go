package queue_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/idempotency/queue"
)

// WithPrepare changes each attempt's request just before it is sent: a
// fresh credential per attempt, never written to the queue's file; an
// error of prepare fails that attempt only, and the item is retried.
func TestPrepare(t *testing.T) {
	var (
		mu    sync.Mutex
		auths []string
	)
	var status atomic.Int64
	status.Store(http.StatusServiceUnavailable)
	srv, l := idemServer(t, func(w http.ResponseWriter, r *http.Request, body string) bool {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		if s := int(status.Swap(http.StatusCreated)); s != http.StatusCreated {
			w.WriteHeader(s) // the first attempt: a transient failure
			return false
		}
		return created(w, r, body)
	})
	var prepared atomic.Int64
	var done ends
	q := openQueue(t, queue.WithOnDone(done.handler), queue.WithPrepare(func(req *http.Request) error {
		n := prepared.Add(1)
		if n == 2 {
			return errors.New("the token service is down")
		}
		req.Header.Set("Authorization", fmt.Sprintf("Bearer secret-token-%d", n))
		return nil
	}))
	enqueue(t, q, post(t, srv, `{"amount":100}`))
	runUntil(t, q, func() bool { return done.len() == 1 })
	mu.Lock()
	got := append([]string(nil), auths...)
	mu.Unlock()
	if len(got) != 2 || got[0] != "Bearer secret-token-1" || got[1] != "Bearer secret-token-3" {
		t.Errorf("the server saw credentials %q; want a fresh one per attempt sent (1, then 3: attempt 2 failed in prepare)", got)
	}
	if n := prepared.Load(); n != 3 {
		t.Errorf("prepare ran %d times, want 3", n)
	}
	if it := done.all()[0]; it.Response == nil || it.Response.Status != http.StatusCreated || len(l.all()) != 1 {
		t.Errorf("answer %+v, %d effects; want 201, 1 effect", it.Response, len(l.all()))
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(q.Path())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(file, []byte("secret-token")) {
		t.Errorf("a credential added by prepare is in the queue's file %s", q.Path())
	}
}

// WithReplayHeader reads the replay mark under the server's name for it;
// WithMaxResponseSize keeps that much of the body, marking the rest
// Truncated.
func TestReplayHeaderAndResponseSize(t *testing.T) {
	body := strings.Repeat("r", 100)
	srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	})
	for _, tc := range []struct {
		name     string
		opts     []queue.Option
		replayed bool
		kept     int
	}{
		{"defaults", nil, false, len(body)},
		{"renamed replay header", []queue.Option{queue.WithReplayHeader("x-replayed")}, true, len(body)},
		{"a smaller response limit", []queue.Option{queue.WithMaxResponseSize(10)}, false, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var done ends
			q := openQueue(t, append([]queue.Option{queue.WithOnDone(done.handler)}, tc.opts...)...)
			enqueue(t, q, post(t, srv, `{}`))
			runUntil(t, q, func() bool { return done.len() == 1 })
			r := done.all()[0].Response
			if r == nil || r.Replayed != tc.replayed || len(r.Body) != tc.kept || r.Truncated != (tc.kept < len(body)) {
				t.Fatalf("response %+v; want replayed %v, %d bytes kept", r, tc.replayed, tc.kept)
			}
		})
	}
	for name, opt := range map[string]queue.Option{
		"WithReplayHeader":    queue.WithReplayHeader("bad header"),
		"WithMaxResponseSize": queue.WithMaxResponseSize(-1),
	} {
		if _, err := queue.Open(t.TempDir()+"/q", opt); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s with a bad value: %v; want an error naming it", name, err)
		}
	}
}
