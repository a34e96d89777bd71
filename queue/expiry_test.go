package queue_test

import (
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/queue"
)

// A retry that would come after the key's advertised expiry (less the
// margin) is not made: the item goes to the dead letters, saying why.
// The server's clock is an hour ahead of ours; its Date header corrects
// the expiry to our clock.
func TestAdvertisedExpiryStopsLateRetries(t *testing.T) {
	for _, c := range []struct {
		name    string
		skew    time.Duration // the server's clock minus ours
		expires time.Duration // from the server's now
		state   queue.State
	}{
		{"expires within the margin", 0, 30 * time.Second, queue.Dead},
		{"expires later", 0, 10 * time.Minute, queue.Done},
		{"server clock ahead, expires within the margin", time.Hour, 30 * time.Second, queue.Dead},
		{"server clock behind, expires later", -time.Hour, 10 * time.Minute, queue.Done},
	} {
		t.Run(c.name, func(t *testing.T) {
			var n atomic.Int64
			srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
				now := time.Now().Add(c.skew)
				w.Header().Set("Date", now.UTC().Format(http.TimeFormat))
				w.Header().Set(queue.DefaultExpiresHeader, now.Add(c.expires).UTC().Format(http.TimeFormat))
				if n.Add(1) == 1 {
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			var got ends
			q := openQueue(t, queue.WithOnDone(got.handler))
			key := enqueue(t, q, post(t, srv, "{}"))
			runUntil(t, q, func() bool { return got.len() == 1 })
			it := got.all()[0]
			if it.State != c.state {
				t.Fatalf("state %s (%q), want %s", it.State, it.Reason, c.state)
			}
			if c.state == queue.Dead {
				if n.Load() != 1 || it.Response != nil || !strings.Contains(it.Reason, "too late") ||
					!strings.Contains(it.Reason, queue.DefaultExpiresHeader) {
					t.Errorf("%d attempts; dead with response %v, reason %q; want 1, none, too late naming the header", n.Load(), it.Response, it.Reason)
				}
				if d := time.Until(it.Expires); d < 20*time.Second || d > 40*time.Second {
					t.Errorf("expiry %v from now on our clock, want about 30s", d)
				}
				dl, err := q.Inspect(key)
				if err != nil || dl.State != queue.Dead || dl.Reason != it.Reason {
					t.Errorf("dead letter %+v, %v", dl, err)
				}
			}
		})
	}
}

// clock is a test clock: the real time plus an offset that tests move.
type clock struct{ off atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) advance(d time.Duration) { c.off.Add(int64(d)) }

// Without an advertised expiry, the key's lifetime runs from the first
// attempt that may have reached the server: one that connected and then
// lost the connection does; one that could not connect does not, so a
// client offline for longer than the lifetime still sends its items.
func TestKeyLifetime(t *testing.T) {
	t.Run("reached", func(t *testing.T) {
		// The server takes the request and drops the connection: the
		// request may have run.
		srv := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
		})
		var clk clock
		var got ends
		q := openQueue(t, queue.WithOnDone(got.handler), queue.WithKeyLifetime(2*time.Minute), queue.WithClock(clk.now))
		enqueue(t, q, post(t, srv, "{}"))
		go func() {
			for got.len() == 0 {
				time.Sleep(20 * time.Millisecond)
				clk.advance(10 * time.Second)
			}
		}()
		runUntil(t, q, func() bool { return got.len() == 1 })
		it := got.all()[0]
		if it.State != queue.Dead || !strings.Contains(it.Reason, "may have reached the server") || it.Sent.IsZero() {
			t.Errorf("%s, %q, sent %v; want dead: too late, may have reached the server", it.State, it.Reason, it.Sent)
		}
	})
	t.Run("offline", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens: every attempt fails to connect
		var clk clock
		var got ends
		q := openQueue(t, queue.WithOnDone(got.handler), queue.WithKeyLifetime(2*time.Minute), queue.WithClock(clk.now))
		key := enqueue(t, q, post(t, "http://"+addr+"/x", "{}"))
		enqueue(t, q, post(t, "http://"+addr+"/x", "{}"))
		var tries atomic.Int64
		go func() {
			for tries.Add(1) < 50 {
				time.Sleep(5 * time.Millisecond)
				clk.advance(time.Minute) // 50 minutes offline
			}
		}()
		runUntil(t, q, func() bool { return tries.Load() >= 50 })
		it, err := q.Inspect(key)
		if err != nil || it.State != queue.Pending || it.Attempts < 2 || !it.Sent.IsZero() {
			t.Fatalf("after 50 minutes offline: %+v, %v; want pending, retried, never sent", it, err)
		}
		// Back online.
		l, err = net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		if err := q.Retry(key); err != nil {
			t.Fatal(err)
		}
		runUntil(t, q, func() bool { return got.len() == 2 })
		for _, it := range got.all() {
			if it.State != queue.Done || it.Response.Status != 201 {
				t.Errorf("%s %v (%q), want done 201", it.State, it.Response, it.Reason)
			}
		}
	})
}
