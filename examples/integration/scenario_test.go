package integration

import (
	"fmt"
	"io"
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

// scenario runs the HTTP behaviours of httpidem on store: replay,
// mismatch, concurrency, scope, 5xx release, lost responses and the
// retrying transport.
func scenario(t *testing.T, store idempotency.Store) {
	runner, err := idempotency.New(store, idempotency.WithLease(2*time.Second), idempotency.WithRetention(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		return []string{r.Header.Get("X-User")}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	var effects atomic.Int64
	var failFirst sync.Map // key -> remaining failures
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if v, ok := failFirst.Load(key); ok && v.(*atomic.Int64).Add(-1) >= 0 {
			w.Header().Set("Retry-After", "2")
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		if d, err := time.ParseDuration(r.Header.Get("X-Delay")); err == nil {
			time.Sleep(d)
		}
		n := effects.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", n))
		http.SetCookie(w, &http.Cookie{Name: "s", Value: "secret"})
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d,"user":%q,"request":%s}`, n, r.Header.Get("X-User"), body)
	})
	srv := httptest.NewServer(idem(mux))
	defer srv.Close()

	prefix := fmt.Sprintf("it-%d-", time.Now().UnixNano())
	send := func(c *http.Client, user, key, body string, hdr ...string) (*http.Response, string, error) {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", user)
		req.Header.Set("Idempotency-Key", prefix+key)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		if c == nil {
			c = http.DefaultClient
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	must := func(resp *http.Response, body string, err error) (*http.Response, string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	count := func(t *testing.T, before int64, want int64) {
		t.Helper()
		if got := effects.Load() - before; got != want {
			t.Fatalf("effects %d, want %d", got, want)
		}
	}

	t.Run("duplicate replayed identically", func(t *testing.T) {
		before := effects.Load()
		r1, b1 := must(send(nil, "alice", "dup", `{"amount":1}`))
		r2, b2 := must(send(nil, "alice", "dup", `{ "amount" : 1.0 }`))
		if r1.StatusCode != 201 || r2.StatusCode != 201 || b1 != b2 ||
			r1.Header.Get("Location") != r2.Header.Get("Location") || r1.Header.Get("Content-Type") != r2.Header.Get("Content-Type") {
			t.Fatalf("first %d %q %v, replay %d %q %v", r1.StatusCode, b1, r1.Header, r2.StatusCode, b2, r2.Header)
		}
		if r2.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatal("no Idempotent-Replayed: true")
		}
		if r1.Header.Get("Set-Cookie") == "" || r2.Header.Get("Set-Cookie") != "" {
			t.Fatalf("Set-Cookie: first %q, replay %q; want it on the first only", r1.Header.Get("Set-Cookie"), r2.Header.Get("Set-Cookie"))
		}
		count(t, before, 1)
	})
	t.Run("different body gives 422", func(t *testing.T) {
		before := effects.Load()
		must(send(nil, "alice", "mismatch", `{"amount":1}`))
		r, _ := must(send(nil, "alice", "mismatch", `{"amount":2}`))
		if r.StatusCode != 422 || r.Header.Get("Content-Type") != httpidem.ProblemContentType {
			t.Fatalf("%d %s", r.StatusCode, r.Header.Get("Content-Type"))
		}
		count(t, before, 1)
	})
	t.Run("10 concurrent requests, one effect", func(t *testing.T) {
		before := effects.Load()
		var mu sync.Mutex
		statuses := map[int]int{}
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				r, _, err := send(nil, "alice", "concurrent", `{"amount":3}`, "X-Delay", "300ms")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				statuses[r.StatusCode]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if statuses[201] < 1 || statuses[201]+statuses[409] != 10 {
			t.Fatalf("statuses %v, want only 201 and 409", statuses)
		}
		count(t, before, 1)
	})
	t.Run("user B never gets user A's response", func(t *testing.T) {
		before := effects.Load()
		_, a := must(send(nil, "alice", "shared", `{"amount":4}`))
		rb, b := must(send(nil, "bob", "shared", `{"amount":4}`))
		if !strings.Contains(a, `"user":"alice"`) || !strings.Contains(b, `"user":"bob"`) || rb.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("alice %q, bob %q", a, b)
		}
		count(t, before, 2)
	})
	t.Run("5xx released, retry runs", func(t *testing.T) {
		before := effects.Load()
		n := &atomic.Int64{}
		n.Store(1)
		failFirst.Store(prefix+"5xx", n)
		r, _ := must(send(nil, "alice", "5xx", `{"amount":5}`))
		if r.StatusCode != 503 {
			t.Fatalf("first %d", r.StatusCode)
		}
		r, _ = must(send(nil, "alice", "5xx", `{"amount":5}`))
		if r.StatusCode != 201 || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry %d, want a fresh 201", r.StatusCode)
		}
		count(t, before, 1)
	})
	t.Run("lost response replayed", func(t *testing.T) {
		before := effects.Load()
		_, _, err := send(&http.Client{Timeout: 100 * time.Millisecond}, "alice", "lost", `{"amount":6}`, "X-Delay", "400ms")
		if err == nil {
			t.Fatal("the first attempt should time out")
		}
		tr, err := httpidem.NewTransport(httpidem.WithMaxAttempts(20), httpidem.WithBackoff(50*time.Millisecond, 200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		r, b := must(send(&http.Client{Transport: tr}, "alice", "lost", `{"amount":6}`))
		if r.StatusCode != 201 || r.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(b, `"amount":6`) {
			t.Fatalf("%d %q", r.StatusCode, b)
		}
		count(t, before, 1)
	})
	t.Run("transport: fails twice then succeeds", func(t *testing.T) {
		before := effects.Load()
		n := &atomic.Int64{}
		n.Store(2)
		failFirst.Store(prefix+"transport", n)
		// Every default; the attempts' start times give the waits (a wait
		// is never shorter than asked, so the check cannot flake).
		var mu sync.Mutex
		var starts []time.Time
		tr, err := httpidem.NewTransport(httpidem.WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			return http.DefaultTransport.RoundTrip(r)
		})))
		if err != nil {
			t.Fatal(err)
		}
		r, _ := must(send(&http.Client{Transport: tr}, "alice", "transport", `{"amount":7}`))
		var waits []time.Duration
		for i := 1; i < len(starts); i++ {
			waits = append(waits, starts[i].Sub(starts[i-1]))
		}
		if r.StatusCode != 201 || len(waits) != 2 || waits[0] < 2*time.Second || waits[1] < 2*time.Second {
			t.Fatalf("%d, waits %v; want 201 after two waits of at least Retry-After 2s", r.StatusCode, waits)
		}
		count(t, before, 1)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
