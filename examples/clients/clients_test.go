package clients_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/examples/clients"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// service is a charges API behind the middleware: POST /v1/charges
// charges once per key; amount=999 makes the charge slow (held until
// release is closed) so that a duplicate finds it in progress. It counts
// every request the server gets, by key and amount.
type service struct {
	srv      *httptest.Server
	charges  atomic.Int64
	mu       sync.Mutex
	requests map[string]int // key + " " + amount -> requests
	started  chan struct{}
	release  chan struct{}
}

func newService(t *testing.T, opts ...httpidem.Option) *service {
	t.Helper()
	store, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(runner, append([]httpidem.Option{httpidem.WithScope(func(r *http.Request) ([]string, error) {
		if r.Header.Get("Authorization") == "" {
			return nil, httpidem.RejectScope(http.StatusUnauthorized, "no API key")
		}
		return []string{r.Header.Get("Authorization")}, nil
	})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s := &service{requests: map[string]int{}, started: make(chan struct{}, 1), release: make(chan struct{})}
	charge := idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		amount := r.FormValue("amount")
		if amount == "999" {
			s.mu.Lock()
			release := s.release
			s.mu.Unlock()
			s.started <- struct{}{}
			<-release
		}
		n := s.charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"ch_%d","object":"charge","amount":%s}`, n, amount)
	}))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		s.mu.Lock()
		s.requests[r.Header.Get("Idempotency-Key")+" "+amountOf(string(body))]++
		s.mu.Unlock()
		charge.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func amountOf(form string) string {
	for _, kv := range strings.Split(form, "&") {
		if v, ok := strings.CutPrefix(kv, "amount="); ok {
			return v
		}
	}
	return ""
}

func (s *service) sent(key string, amount int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[fmt.Sprint(key, " ", amount)]
}

// stripeBackend is stripe-go's API backend on the service, its retries as
// configured; sleep false skips its waits between retries.
func stripeBackend(s *service, retries int64, client *http.Client, sleep bool) stripe.Backend {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(s.srv.URL),
		MaxNetworkRetries: stripe.Int64(retries),
		HTTPClient:        client,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	b.(*stripe.BackendImplementation).SetNetworkRetriesSleep(sleep)
	return b
}

func charge(b stripe.Backend, key string, amount int64) (*stripe.Charge, error) {
	p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("eur")}
	p.SetIdempotencyKey(key)
	var ch stripe.Charge
	err := b.Call(http.MethodPost, "/v1/charges", "sk_test_1", p, &ch)
	return &ch, err
}

// stripe-go retries the middleware's 422 (a problem it cannot parse is a
// generic error, which it retries); with the StripeErrors renderer it gets
// a *stripe.Error of type idempotency_error and sends the request once.
func TestStripeGoAndTheKeyReused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []httpidem.Option
		sends int
	}{
		{"problem+json (the default)", nil, 3},
		{"StripeErrors", []httpidem.Option{httpidem.WithErrorRenderer(clients.StripeErrors)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newService(t, tc.opts...)
			b := stripeBackend(s, stripe.DefaultMaxNetworkRetries, nil, false)
			if ch, err := charge(b, "key-1", 100); err != nil || ch.ID != "ch_1" {
				t.Fatalf("first charge: %+v, %v", ch, err)
			}
			_, err := charge(b, "key-1", 200) // the key reused for another request
			if n := s.sent("key-1", 200); n != tc.sends {
				t.Fatalf("the 422 was sent %d times, want %d", n, tc.sends)
			}
			var se *stripe.Error
			if tc.opts != nil && (!errors.As(err, &se) || se.Type != stripe.ErrorTypeIdempotency || se.HTTPStatusCode != 422) {
				t.Fatalf("err %#v, want a *stripe.Error of type idempotency_error, status 422", err)
			}
			if s.charges.Load() != 1 {
				t.Fatalf("%d charges", s.charges.Load())
			}
		})
	}
}

// stripe-go on httpidem's Transport, its own retries off: the Transport
// retries the 409 of a duplicate sent while the first charge runs until
// the replay, and stripe-go gets the first charge.
func TestStripeGoOnTheTransport(t *testing.T) {
	s := newService(t, httpidem.WithErrorRenderer(clients.StripeErrors))
	tr, err := httpidem.NewTransport(httpidem.WithBackoff(10*time.Millisecond, 50*time.Millisecond), httpidem.WithMaxAttempts(50))
	if err != nil {
		t.Fatal(err)
	}
	b := stripeBackend(s, 0, &http.Client{Transport: tr}, true)
	first := make(chan *stripe.Charge, 1)
	go func() {
		ch, err := charge(b, "slow", 999)
		if err != nil {
			t.Error(err)
		}
		first <- ch
	}()
	<-s.started
	time.AfterFunc(100*time.Millisecond, func() { close(s.release) })
	dup, err := charge(b, "slow", 999) // 409 until the first is stored
	if err != nil {
		t.Fatal(err)
	}
	if ch := <-first; ch.ID != "ch_1" || dup.ID != "ch_1" || s.charges.Load() != 1 || s.sent("slow", 999) < 3 {
		t.Fatalf("first %q, duplicate %q, %d charges, %d sends; want ch_1 twice, one charge, the 409 retried",
			ch.ID, dup.ID, s.charges.Load(), s.sent("slow", 999))
	}
	// The 422 is final for the Transport too.
	if _, err := charge(b, "slow", 5); err == nil || s.sent("slow", 5) != 1 {
		t.Fatalf("reused key: %v after %d sends, want an error after 1", err, s.sent("slow", 5))
	}
}

// go-retryablehttp never retries a 409 on its own; with CheckRetry
// httpidem.ShouldRetry and the Retry-After backoff it retries the
// duplicate's 409 until the replay, and never the 422.
func TestRetryableHTTP(t *testing.T) {
	s := newService(t)
	post := func(c *retryablehttp.Client, key, amount string) (*http.Response, string, error) {
		req, _ := retryablehttp.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader("amount="+amount))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer sk_test_1")
		httpidem.SetKey(req.Request, key)
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	newClient := func(configured bool) *retryablehttp.Client {
		c := retryablehttp.NewClient()
		c.Logger = nil
		c.RetryMax = 10
		c.RetryWaitMin, c.RetryWaitMax = 10*time.Millisecond, 50*time.Millisecond
		if configured {
			c.CheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				return httpidem.ShouldRetry(resp, err), nil
			}
			c.Backoff = clients.RetryAfterBackoff
		}
		return c
	}
	for _, configured := range []bool{false, true} {
		release := make(chan struct{})
		s.mu.Lock()
		s.release = release
		s.mu.Unlock()
		key := fmt.Sprint("slow-", configured)
		go post(newClient(configured), key, "999")
		<-s.started
		time.AfterFunc(200*time.Millisecond, func() { close(release) })
		resp, body, err := post(newClient(configured), key, "999")
		switch {
		case err != nil:
			t.Fatal(err)
		case !configured && resp.StatusCode != 409:
			t.Fatalf("default CheckRetry: %d, want the 409 it does not retry", resp.StatusCode)
		case configured && (resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(body, `"amount":999`)):
			t.Fatalf("configured: %d %q, want the replayed charge", resp.StatusCode, body)
		}
	}
	c := newClient(true)
	if resp, _, err := post(c, "slow-true", "7"); err != nil || resp.StatusCode != 422 || s.sent("slow-true", 7) != 1 {
		t.Fatalf("reused key: %v %v after %d sends, want one 422", resp, err, s.sent("slow-true", 7))
	}
}
