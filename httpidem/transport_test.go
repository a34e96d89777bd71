package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

// fakeTime is a clock that only moves when the transport sleeps, so
// waits are measured exactly, without wall-clock assertions.
type fakeTime struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	real   time.Duration                     // also sleep for real, at most this long
	jitter func(time.Duration) time.Duration // nil: uniform
}

func newFakeTime() *fakeTime { return &fakeTime{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) Sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.sleeps = append(f.sleeps, d)
	f.now = f.now.Add(d)
	real := min(d, f.real)
	f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if real > 0 {
		time.Sleep(real)
	}
	return ctx.Err()
}

func (f *fakeTime) Sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}

// transport is a Transport on f's clock, with opts.
func (f *fakeTime) transport(t testing.TB, opts ...httpidem.ClientOption) *httpidem.Transport {
	return newTransport(t, append([]httpidem.ClientOption{httpidem.WithClientClock(f.Now, f.Sleep, f.jitter)}, opts...)...)
}

func newTransport(t testing.TB, opts ...httpidem.ClientOption) *httpidem.Transport {
	t.Helper()
	tr, err := httpidem.NewTransport(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func post(t *testing.T, rt http.RoundTripper, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		httpidem.SetKey(req, key)
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// statusServer answers attempt n (from 1) with statuses[n-1], and the
// last status from then on, recording keys and bodies.
type statusServer struct {
	statuses   []int
	retryAfter string
	attempts   atomic.Int64
	mu         sync.Mutex
	keys       []string
	bodies     []string
}

func (s *statusServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(s.attempts.Add(1))
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	s.bodies = append(s.bodies, string(b))
	s.mu.Unlock()
	status := s.statuses[min(n, len(s.statuses))-1]
	if status >= 400 && s.retryAfter != "" {
		w.Header().Set("Retry-After", s.retryAfter)
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "attempt %d", n)
}

// The server fails twice (503 with Retry-After), then succeeds: one
// effect, the same key and body on every attempt, and each wait at least
// the Retry-After.
func TestTransportFailsTwiceThenSucceeds(t *testing.T) {
	var effects, runs atomic.Int64
	keys := make(chan string, 10)
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) != `{"amount":42}` {
			t.Errorf("attempt body %q: not rewound", body)
		}
		keys <- r.Header.Get("Idempotency-Key")
		if runs.Add(1) <= 2 {
			w.Header().Set("Retry-After", "3")
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		effects.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	clock := newFakeTime()
	clock.jitter = func(d time.Duration) time.Duration { return d / 2 }
	tr := clock.transport(t)
	key := httpidem.NewKey()
	resp, body := post(t, tr, srv.URL+"/payments", key, `{"amount":42}`)
	if resp.StatusCode != 201 || body != "charged" {
		t.Fatalf("final %d %q", resp.StatusCode, body)
	}
	if effects.Load() != 1 || runs.Load() != 3 {
		t.Fatalf("effects %d, runs %d; want 1 and 3", effects.Load(), runs.Load())
	}
	close(keys)
	for k := range keys {
		if k != key {
			t.Fatalf("attempt key %q, want %q every time", k, key)
		}
	}
	sleeps := clock.Sleeps()
	if len(sleeps) != 2 {
		t.Fatalf("waits %v, want 2", sleeps)
	}
	for _, d := range sleeps {
		if d < 3*time.Second {
			t.Fatalf("waits %v: Retry-After 3s not respected", sleeps)
		}
	}
	// A retry with the same key is replayed by the server, not run again.
	resp, body = post(t, tr, srv.URL+"/payments", key, `{"amount":42}`)
	if resp.Header.Get("Idempotent-Replayed") != "true" || body != "charged" || effects.Load() != 1 {
		t.Fatalf("replay: %q %q effects %d", resp.Header.Get("Idempotent-Replayed"), body, effects.Load())
	}
}

func TestTransportRetriesRetryableStatuses(t *testing.T) {
	for _, status := range []int{500, 502, 503, 504, 429, 409} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			s := &statusServer{statuses: []int{status, status, 200}}
			srv := httptest.NewServer(s)
			defer srv.Close()
			clock := newFakeTime()
			resp, body := post(t, clock.transport(t), srv.URL, "k", "b")
			if resp.StatusCode != 200 || body != "attempt 3" || s.attempts.Load() != 3 {
				t.Fatalf("%d %q after %d attempts", resp.StatusCode, body, s.attempts.Load())
			}
			for i, b := range s.bodies {
				if b != "b" || s.keys[i] != "k" {
					t.Fatalf("attempt %d: key %q body %q", i+1, s.keys[i], b)
				}
			}
		})
	}
}

func TestTransportNeverRetriesOther4xx(t *testing.T) {
	for _, status := range []int{400, 401, 403, 404, 410, 413, 422} {
		s := &statusServer{statuses: []int{status, 200}}
		srv := httptest.NewServer(s)
		clock := newFakeTime()
		resp, _ := post(t, clock.transport(t), srv.URL, "k", "b")
		srv.Close()
		if resp.StatusCode != status || s.attempts.Load() != 1 || len(clock.Sleeps()) != 0 {
			t.Fatalf("%d: got %d after %d attempts, want no retry", status, resp.StatusCode, s.attempts.Load())
		}
	}
}

func TestTransportNetworkError(t *testing.T) {
	var attempts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) <= 2 {
			// The connection dies before any response.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	clock := newFakeTime()
	resp, body := post(t, clock.transport(t), srv.URL, "k", `{}`)
	if resp.StatusCode != 200 || body != "ok" || attempts.Load() != 3 {
		t.Fatalf("%d %q after %d attempts", resp.StatusCode, body, attempts.Load())
	}
}

func TestTransportBoundedAttempts(t *testing.T) {
	s := &statusServer{statuses: []int{503}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	clock := newFakeTime()
	tr := clock.transport(t, httpidem.WithMaxAttempts(4))
	resp, body := post(t, tr, srv.URL, "k", "b")
	if resp.StatusCode != 503 || body != "attempt 4" || s.attempts.Load() != 4 || len(clock.Sleeps()) != 3 {
		t.Fatalf("%d %q after %d attempts, %d waits; want the 4th 503 and 3 waits",
			resp.StatusCode, body, s.attempts.Load(), len(clock.Sleeps()))
	}
}

func TestTransportBackoffAndElapsed(t *testing.T) {
	s := &statusServer{statuses: []int{500}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	clock := newFakeTime()
	clock.jitter = func(d time.Duration) time.Duration { return d } // the top of each range
	tr := clock.transport(t, httpidem.WithMaxAttempts(100), httpidem.WithMaxElapsed(2*time.Second),
		httpidem.WithBackoff(100*time.Millisecond, 400*time.Millisecond))
	resp, _ := post(t, tr, srv.URL, "k", "b")
	// 100+200+400+400+400+400 = 1.9s; one more 400ms would pass 2s.
	want := []time.Duration{100, 200, 400, 400, 400, 400}
	got := clock.Sleeps()
	if resp.StatusCode != 500 || len(got) != len(want) || s.attempts.Load() != int64(len(want)+1) {
		t.Fatalf("waits %v after %d attempts, want %v ms", got, s.attempts.Load(), want)
	}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
}

func TestTransportFullJitter(t *testing.T) {
	s := &statusServer{statuses: []int{500}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	clock := newFakeTime()
	tr := clock.transport(t, httpidem.WithMaxAttempts(40), httpidem.WithMaxElapsed(time.Hour),
		httpidem.WithBackoff(time.Second, time.Second))
	post(t, tr, srv.URL, "k", "b")
	sleeps := clock.Sleeps()
	distinct := map[time.Duration]bool{}
	for _, d := range sleeps {
		if d < 0 || d > time.Second {
			t.Fatalf("wait %v outside [0, 1s]", d)
		}
		distinct[d] = true
	}
	if len(sleeps) != 39 || len(distinct) < 30 {
		t.Fatalf("%d waits, %d distinct: not jittered", len(sleeps), len(distinct))
	}
}

// Many attempts: the backoff doubles up to MaxBackoff and stays there.
// Doubling without a cap overflowed after about 36 attempts into a
// negative backoff, and the retries ran with no wait at all.
func TestTransportBackoffCappedOverManyAttempts(t *testing.T) {
	s := &statusServer{statuses: []int{503}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	const attempts = 200
	for _, jitter := range []struct {
		name string
		f    func(time.Duration) time.Duration
	}{
		{"top of range", func(d time.Duration) time.Duration { return d }},
		{"uniform", nil},
	} {
		s.attempts.Store(0)
		clock := newFakeTime()
		clock.jitter = jitter.f
		const maxBackoff = 2 * time.Second
		tr := clock.transport(t, httpidem.WithMaxAttempts(attempts), httpidem.WithMaxElapsed(1000*time.Hour),
			httpidem.WithBackoff(100*time.Millisecond, maxBackoff))
		resp, _ := post(t, tr, srv.URL, "k", "b")
		sleeps := clock.Sleeps()
		if resp.StatusCode != 503 || s.attempts.Load() != attempts || len(sleeps) != attempts-1 {
			t.Fatalf("%s: %d after %d attempts and %d waits, want 503 after %d attempts",
				jitter.name, resp.StatusCode, s.attempts.Load(), len(sleeps), attempts)
		}
		var total time.Duration
		for i, d := range sleeps {
			if d < 0 || d > maxBackoff {
				t.Fatalf("%s: wait %d is %v, outside [0, %v]", jitter.name, i+1, d, maxBackoff)
			}
			// 100ms, 200ms, ..., 1.6s, then the cap: from the sixth wait
			// on, the top of the range is the cap itself.
			if jitter.f != nil && i >= 5 && d != maxBackoff {
				t.Fatalf("%s: wait %d is %v, want the cap %v", jitter.name, i+1, d, maxBackoff)
			}
			total += d
		}
		// Uniform waits in [0, 2s] over 199 retries average 1s: a loop
		// that stopped waiting would total far less.
		if jitter.f == nil && total < 100*time.Second {
			t.Fatalf("%s: %d waits total only %v", jitter.name, len(sleeps), total)
		}
	}
}

func TestTransportRetryAfterBeyondBudget(t *testing.T) {
	for _, ra := range []string{"120", time.Date(2026, 1, 1, 0, 2, 0, 0, time.UTC).Format(http.TimeFormat)} {
		s := &statusServer{statuses: []int{429, 200}, retryAfter: ra}
		srv := httptest.NewServer(s)
		clock := newFakeTime()
		tr := clock.transport(t, httpidem.WithMaxElapsed(time.Minute))
		resp, _ := post(t, tr, srv.URL, "k", "b")
		srv.Close()
		// Waiting two minutes would break the one-minute budget: the 429
		// is returned at once, for the caller to decide.
		if resp.StatusCode != 429 || s.attempts.Load() != 1 || len(clock.Sleeps()) != 0 {
			t.Fatalf("Retry-After %q: %d after %d attempts, waits %v", ra, resp.StatusCode, s.attempts.Load(), clock.Sleeps())
		}
	}
	// An HTTP-date Retry-After within the budget is waited for.
	s := &statusServer{statuses: []int{503, 200}, retryAfter: time.Date(2026, 1, 1, 0, 0, 7, 0, time.UTC).Format(http.TimeFormat)}
	srv := httptest.NewServer(s)
	defer srv.Close()
	clock := newFakeTime()
	resp, _ := post(t, clock.transport(t), srv.URL, "k", "b")
	if resp.StatusCode != 200 || len(clock.Sleeps()) != 1 || clock.Sleeps()[0] < 7*time.Second {
		t.Fatalf("date Retry-After: %d, waits %v", resp.StatusCode, clock.Sleeps())
	}
}

func TestTransportOnlyKeyedRewindableRequests(t *testing.T) {
	s := &statusServer{statuses: []int{503}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	clock := newFakeTime()
	tr := clock.transport(t, httpidem.WithAutoKey())
	// No key (and none made): the request may not be safe to repeat.
	if resp, _ := post(t, tr, srv.URL, "", "b"); resp.StatusCode != 503 || s.attempts.Load() != 1 {
		t.Fatalf("unkeyed: %d after %d attempts", resp.StatusCode, s.attempts.Load())
	}
	// A body that cannot be rewound.
	req, _ := http.NewRequest("POST", srv.URL, io.MultiReader(strings.NewReader("b")))
	req.GetBody = nil
	httpidem.SetKey(req, "k")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || s.attempts.Load() != 2 || len(clock.Sleeps()) != 0 {
		t.Fatalf("no GetBody: %d attempts", s.attempts.Load())
	}
}

func TestTransportContextCanceled(t *testing.T) {
	s := &statusServer{statuses: []int{503}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	tr := newTransport(t, httpidem.WithClientClock(nil, func(ctx context.Context, d time.Duration) error {
		cancel() // the caller gives up while the transport waits
		<-ctx.Done()
		return ctx.Err()
	}, nil))
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("b"))
	httpidem.SetKey(req, "k")
	_, err := (&http.Client{Transport: tr}).Do(req)
	if !errors.Is(err, context.Canceled) || s.attempts.Load() != 1 {
		t.Fatalf("err %v after %d attempts, want context.Canceled after 1", err, s.attempts.Load())
	}
}

// A client that gives up on a slow attempt retries; the server runs the
// payment once and the retry gets its response.
func TestTransportAttemptTimeout(t *testing.T) {
	var runs atomic.Int64
	srv := httptest.NewServer(wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d", n)
	})))
	defer srv.Close()
	clock := newFakeTime()
	clock.real = 50 * time.Millisecond // the 409s' Retry-After is 1s: wait less for real
	tr := clock.transport(t, httpidem.WithAttemptTimeout(100*time.Millisecond),
		httpidem.WithMaxAttempts(50), httpidem.WithMaxElapsed(time.Hour))
	resp, body := post(t, tr, srv.URL, "k", `{"amount":1}`)
	if resp.StatusCode != 201 || body != "payment 1" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%d %q replayed=%q", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	if runs.Load() != 1 || len(clock.Sleeps()) < 2 {
		t.Fatalf("runs %d, waits %d", runs.Load(), len(clock.Sleeps()))
	}
}

// Ten clients send one intent at once through the transport: one effect,
// and every client ends with the same 201.
func TestTransportConcurrentDuplicates(t *testing.T) {
	var effects atomic.Int64
	srv := httptest.NewServer(wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := effects.Add(1)
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d", n)
	})))
	defer srv.Close()
	clock := newFakeTime()
	clock.real = 20 * time.Millisecond
	tr := clock.transport(t, httpidem.WithMaxAttempts(100), httpidem.WithMaxElapsed(time.Hour))
	key := httpidem.NewKey()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			resp, body := post(t, tr, srv.URL, key, `{"amount":3}`)
			if resp.StatusCode != 201 || body != "payment 1" {
				t.Errorf("%d %q", resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	if effects.Load() != 1 {
		t.Fatalf("effects %d", effects.Load())
	}
}

func TestNewKey(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		k := httpidem.NewKey()
		if !re.MatchString(k) || seen[k] {
			t.Fatalf("key %q: not a fresh v4 UUID", k)
		}
		if _, err := idempotency.StorageKey(nil, k); err != nil {
			t.Fatal(err)
		}
		seen[k] = true
	}
}

// NewTransport refuses an invalid option by name, as grpcidem's
// UnaryClientInterceptor does with the same option names.
func TestNewTransportRefusesInvalidOptions(t *testing.T) {
	cases := []struct {
		name string
		opts []httpidem.ClientOption
		want string
	}{
		{"zero attempts", []httpidem.ClientOption{httpidem.WithMaxAttempts(0)}, "WithMaxAttempts"},
		{"zero elapsed", []httpidem.ClientOption{httpidem.WithMaxElapsed(0)}, "WithMaxElapsed"},
		{"negative attempt timeout", []httpidem.ClientOption{httpidem.WithAttemptTimeout(-1)}, "WithAttemptTimeout"},
		{"max below min backoff", []httpidem.ClientOption{httpidem.WithBackoff(time.Second, time.Millisecond)}, "WithBackoff"},
		{"zero backoff", []httpidem.ClientOption{httpidem.WithBackoff(0, time.Second)}, "WithBackoff"},
		{"nil base", []httpidem.ClientOption{httpidem.WithBase(nil)}, "WithBase"},
		{"typed nil base", []httpidem.ClientOption{httpidem.WithBase((*http.Transport)(nil))}, "WithBase"},
		{"bad key header", []httpidem.ClientOption{httpidem.WithClientHeaders("Idempotency Key", "Idempotent-Replayed")}, "WithClientHeaders"},
		{"empty replay header", []httpidem.ClientOption{httpidem.WithClientHeaders("Idempotency-Key", "")}, "WithClientHeaders"},
		{"nil option", []httpidem.ClientOption{nil}, "nil option"},
	}
	for _, tc := range cases {
		tr, err := httpidem.NewTransport(tc.opts...)
		if tr != nil || !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %q", tc.name, err, tc.want)
		}
	}
	// The zero Transport is the defaults: it retries a 503 up to
	// DefaultMaxAttempts times.
	s := &statusServer{statuses: []int{503, 503, 200}, retryAfter: "0"}
	srv := httptest.NewServer(s)
	defer srv.Close()
	if resp, _ := post(t, &httpidem.Transport{}, srv.URL, "k", "b"); resp.StatusCode != 200 || s.attempts.Load() != 3 {
		t.Errorf("zero Transport: %d after %d attempts, want 200 after 3", resp.StatusCode, s.attempts.Load())
	}
}

// A key header set by WithClientHeaders is the one the Transport looks
// for and retries.
func TestTransportClientHeaders(t *testing.T) {
	var attempts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Key") != "k" {
			t.Errorf("key header %q", r.Header.Get("X-Key"))
		}
		if attempts.Add(1) == 1 {
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.Header().Set("X-Replayed", "true")
		w.WriteHeader(http.StatusConflict) // replayed: never retried
	}))
	defer srv.Close()
	clock := newFakeTime()
	tr := clock.transport(t, httpidem.WithClientHeaders("x-key", "x-replayed"))
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("b"))
	req.Header.Set("X-Key", "k")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 409 || attempts.Load() != 2 {
		t.Fatalf("%d after %d attempts, want the replayed 409 after 2", resp.StatusCode, attempts.Load())
	}
}

// leaseServer answers 409 with Retry-After: 1 and the lease header while
// the fake clock is before free (a crashed holder's lease, not renewed),
// then 201. lease is what the header says: left until free by default.
type leaseServer struct {
	clock        *fakeTime
	free         time.Time
	lease        string // "" for the time left until free
	noRetryAfter bool
	attempts     atomic.Int64
}

func (s *leaseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.attempts.Add(1)
	now := s.clock.Now()
	if now.Before(s.free) {
		if !s.noRetryAfter {
			w.Header().Set("Retry-After", "1")
		}
		lease := s.lease
		if lease == "" {
			lease = strconv.Itoa(int((s.free.Sub(now) + time.Second - 1) / time.Second))
		}
		w.Header().Set(httpidem.LeaseHeader, lease)
		w.WriteHeader(http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// A 409 that tells the holder's lease keeps a Transport with every
// default retrying until that lease has ended (a crashed holder is taken
// over then), beyond MaxAttempts and MaxElapsed, but never beyond
// MaxLeaseWait; without the header, or with WithMaxLeaseWait(0), the
// defaults give up after 5 attempts.
func TestTransportFollowsTheHoldersLease(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lease    string // the header; "" the true time left
		leaseFor time.Duration
		opts     []httpidem.ClientOption
		want     int
	}{
		{"default lease 30s", "", 30 * time.Second, nil, 201},
		{"lease past MaxElapsed", "", 50 * time.Second, nil, 201},
		{"no lease wait", "", 30 * time.Second, []httpidem.ClientOption{httpidem.WithMaxLeaseWait(0)}, 409},
		{"longer than MaxLeaseWait", "", 90 * time.Second, nil, 409},
		{"a live holder renewing", "30", time.Hour, nil, 409},
		{"malformed header", "soon", 30 * time.Second, nil, 409},
		{"absurd header", "99999999", 30 * time.Second, nil, 409},
		{"no Retry-After, a holder renewing", "30", time.Hour, nil, 409},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeTime()
			s := &leaseServer{clock: clock, free: clock.Now().Add(tc.leaseFor), lease: tc.lease,
				noRetryAfter: strings.HasPrefix(tc.name, "no Retry-After")}
			srv := httptest.NewServer(s)
			defer srv.Close()
			resp, _ := post(t, clock.transport(t, tc.opts...), srv.URL, "k", "b")
			elapsed := clock.Now().Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			if resp.StatusCode != tc.want {
				t.Fatalf("%d after %d attempts and %v, want %d", resp.StatusCode, s.attempts.Load(), elapsed, tc.want)
			}
			switch {
			case tc.want == 201 && elapsed < tc.leaseFor:
				t.Fatalf("201 after %v, before the lease of %v ended", elapsed, tc.leaseFor)
			case tc.want == 409 && tc.name != "no lease wait" && tc.lease == "" && elapsed > httpidem.DefaultMaxLeaseWait:
				t.Fatalf("gave up after %v, past MaxLeaseWait %v", elapsed, httpidem.DefaultMaxLeaseWait)
			case tc.want == 409 && elapsed > httpidem.DefaultMaxLeaseWait:
				t.Fatalf("gave up after %v, past MaxLeaseWait %v", elapsed, httpidem.DefaultMaxLeaseWait)
			case tc.want == 409 && tc.lease != "" && tc.lease != "30" && s.attempts.Load() != httpidem.DefaultMaxAttempts:
				t.Fatalf("a bad header: %d attempts, want the plain %d", s.attempts.Load(), httpidem.DefaultMaxAttempts)
			}
			t.Logf("%d after %d attempts and %v", resp.StatusCode, s.attempts.Load(), elapsed)
		})
	}
}

// A POST or PATCH without a key gets one per RoundTrip, sent by each of
// its attempts and by no other call; other methods get none; the caller's
// request is left as it was.
func TestTransportAutoKey(t *testing.T) {
	s := &statusServer{statuses: []int{503, 200}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	clock := newFakeTime()
	tr := clock.transport(t)
	for _, method := range []string{"POST", "PATCH", "PUT"} {
		s.attempts.Store(0)
		s.mu.Lock()
		s.keys = nil
		s.mu.Unlock()
		var keys []string
		for range 2 { // two calls: two intents
			req, _ := http.NewRequest(method, srv.URL, strings.NewReader("b"))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if req.Header.Get("Idempotency-Key") != "" {
				t.Fatalf("%s: the caller's request was changed", method)
			}
			s.attempts.Store(0)
		}
		s.mu.Lock()
		keys = append(keys, s.keys...)
		s.mu.Unlock()
		if method == "PUT" {
			if len(keys) != 2 || keys[0] != "" || keys[1] != "" {
				t.Fatalf("PUT: keys %q, want none, sent once per call", keys)
			}
			continue
		}
		if len(keys) != 4 || keys[0] == "" || keys[0] != keys[1] || keys[2] != keys[3] || keys[1] == keys[2] {
			t.Fatalf("%s: keys %q, want one key per call, the same on its retry", method, keys)
		}
	}
}

// expiryServer answers 503 with the expiry header (header, or
// Idempotency-Key-Expires) set to expires, and a Date from its own clock:
// the client's fake clock plus skew.
type expiryServer struct {
	header   string
	expires  string
	clock    *fakeTime
	skew     time.Duration
	attempts atomic.Int64
}

func (s *expiryServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.attempts.Add(1)
	w.Header().Set("Date", s.clock.Now().Add(s.skew).Format(http.TimeFormat))
	h := s.header
	if h == "" {
		h = "Idempotency-Key-Expires"
	}
	w.Header().Set(h, s.expires)
	w.Header().Set("Retry-After", "10")
	w.WriteHeader(http.StatusServiceUnavailable)
}

// The Transport stops retrying, with ErrKeyExpired, once the key's
// advertised expiry has passed or would pass before the next attempt,
// judged by the server's clock (the response's Date), whichever way the
// client's clock is off; a malformed or absurd expiry is ignored (the
// plain budget applies), and never makes it retry longer.
func TestTransportStopsAtTheKeysExpiry(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) func(time.Time) string {
		return func(server time.Time) string { return server.Add(d).Format(http.TimeFormat) }
	}
	for _, tc := range []struct {
		name     string
		skew     time.Duration // the server's clock minus the client's
		expires  func(server time.Time) string
		attempts int64
		expired  bool
	}{
		{"expires before the next attempt", 0, at(5 * time.Second), 1, true},
		{"expires after two retries", 0, at(25 * time.Second), 3, true},
		{"expires after two retries, the server's clock an hour ahead", time.Hour, at(25 * time.Second), 3, true},
		{"expires after two retries, the server's clock an hour behind", -time.Hour, at(25 * time.Second), 3, true},
		{"far ahead", 0, at(24 * time.Hour), 4, false},
		{"malformed", 0, func(time.Time) string { return "tomorrow" }, 4, false},
		{"in the past (absurd)", 0, at(-time.Hour), 4, false},
		{"centuries ahead (absurd)", 0, func(time.Time) string { return "Fri, 01 Jan 2500 00:00:00 GMT" }, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeTime()
			s := &expiryServer{expires: tc.expires(start.Add(tc.skew)), clock: clock, skew: tc.skew}
			srv := httptest.NewServer(s)
			defer srv.Close()
			// 4 attempts, each 10 s apart (Retry-After), within 30 s.
			tr := clock.transport(t, httpidem.WithMaxAttempts(4))
			req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("b"))
			httpidem.SetKey(req, "k")
			resp, err := tr.RoundTrip(req)
			if tc.expired {
				if !errors.Is(err, httpidem.ErrKeyExpired) || resp != nil || s.attempts.Load() != tc.attempts {
					t.Fatalf("%v, %v after %d attempts; want ErrKeyExpired after %d", resp, err, s.attempts.Load(), tc.attempts)
				}
				return
			}
			if err != nil || resp.StatusCode != 503 || s.attempts.Load() != tc.attempts {
				t.Fatalf("%v after %d attempts; want the last 503 after %d", err, s.attempts.Load(), tc.attempts)
			}
			resp.Body.Close()
		})
	}
}

// WithClientExpiresHeader: the Transport reads the key's expiry from the
// header the server names it in: a renamed header is ignored under the
// default name and honoured under its own; "" ignores the default one;
// an invalid name is refused by NewTransport, naming the option.
func TestClientExpiresHeader(t *testing.T) {
	soon := func(server time.Time) string { return server.Add(5 * time.Second).Format(http.TimeFormat) }
	for _, tc := range []struct {
		name, serverHeader string
		opts               []httpidem.ClientOption
		expired            bool
	}{
		{"renamed, read under the default name", "X-Key-Expires", nil, false},
		{"renamed, read under its name", "X-Key-Expires", []httpidem.ClientOption{httpidem.WithClientExpiresHeader("x-key-expires")}, true},
		{"default, ignored", "", []httpidem.ClientOption{httpidem.WithClientExpiresHeader("")}, false},
		{"default", "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeTime()
			s := &expiryServer{header: tc.serverHeader, expires: soon(clock.Now()), clock: clock}
			srv := httptest.NewServer(s)
			defer srv.Close()
			tr := clock.transport(t, append([]httpidem.ClientOption{httpidem.WithMaxAttempts(4)}, tc.opts...)...)
			req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("b"))
			httpidem.SetKey(req, "k")
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			switch {
			case tc.expired && (!errors.Is(err, httpidem.ErrKeyExpired) || s.attempts.Load() != 1):
				t.Fatalf("%v after %d attempts; want ErrKeyExpired after 1", err, s.attempts.Load())
			case !tc.expired && (err != nil || s.attempts.Load() != 4):
				t.Fatalf("%v after %d attempts; want the last 503 after 4 (the expiry not read)", err, s.attempts.Load())
			}
		})
	}
	if _, err := httpidem.NewTransport(httpidem.WithClientExpiresHeader("bad header")); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithClientExpiresHeader") {
		t.Errorf("an invalid header name: %v; want ErrInvalidArgument naming WithClientExpiresHeader", err)
	}
}

// ShouldRetry is the Transport's rule for other clients: a network error,
// a 5xx, 429 or 409 not marked replayed; never a replayed answer, a
// success or another 4xx.
func TestShouldRetry(t *testing.T) {
	resp := func(status int, replayed bool) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}}
		if replayed {
			r.Header.Set(httpidem.DefaultReplayHeader, "true")
		}
		return r
	}
	for _, tc := range []struct {
		name string
		resp *http.Response
		err  error
		want bool
	}{
		{"network error", nil, errors.New("connection reset"), true},
		{"503", resp(503, false), nil, true},
		{"500", resp(500, false), nil, true},
		{"429", resp(429, false), nil, true},
		{"409 in progress", resp(409, false), nil, true},
		{"500 replayed", resp(500, true), nil, false},
		{"409 replayed", resp(409, true), nil, false},
		{"200", resp(200, false), nil, false},
		{"201 replayed", resp(201, true), nil, false},
		{"422 mismatch", resp(422, false), nil, false},
		{"400", resp(400, false), nil, false},
		{"no response, no error", nil, nil, false},
	} {
		if got := httpidem.ShouldRetry(tc.resp, tc.err); got != tc.want {
			t.Errorf("%s: ShouldRetry = %v, want %v", tc.name, got, tc.want)
		}
	}
}
