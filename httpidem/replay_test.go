package httpidem_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

// The key's expiry is sent on the stored response and on every replay,
// the runner's retention from the handler's end (never later than the
// store's), and not on answers that were not stored; the header can be
// renamed or turned off.
func TestExpiresHeader(t *testing.T) {
	const retention = 2 * time.Hour
	for _, tc := range []struct {
		name   string
		opts   []httpidem.Option
		header string
	}{
		{"default", nil, "Idempotency-Key-Expires"},
		{"renamed", []httpidem.Option{httpidem.WithExpiresHeader("x-key-expires")}, "X-Key-Expires"},
		{"off", []httpidem.Option{httpidem.WithExpiresHeader("")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &payments{}
			h := wrap(t, newRunner(t, nil, idempotency.WithRetention(retention)), p, tc.opts...)
			before := time.Now().Truncate(time.Second)
			fresh := do(h, "POST", "/payments", "k", `{"a":1}`)
			replay := do(h, "POST", "/payments", "k", `{"a":1}`)
			after := time.Now()
			if replay.Header().Get("Idempotent-Replayed") != "true" || p.runs.Load() != 1 {
				t.Fatalf("no replay")
			}
			for _, w := range []http.Header{fresh.Header(), replay.Header()} {
				if tc.header == "" {
					if v := w.Get("Idempotency-Key-Expires"); v != "" {
						t.Fatalf("header sent while off: %q", v)
					}
					continue
				}
				exp, err := http.ParseTime(w.Get(tc.header))
				if err != nil || exp.Before(before.Add(retention)) || exp.After(after.Add(retention)) {
					t.Fatalf("%s %q (%v), want now + %v", tc.header, w.Get(tc.header), err, retention)
				}
			}
			if fresh.Header().Get(tc.header) != replay.Header().Get(tc.header) && tc.header != "" {
				t.Fatalf("fresh %q, replay %q: one expiry", fresh.Header().Get(tc.header), replay.Header().Get(tc.header))
			}
		})
	}
	// Not on an answer that was not stored: a 5xx (released), a 409.
	h := wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "later", http.StatusServiceUnavailable)
	}))
	if w := do(h, "POST", "/p", "k", `{}`); w.Code != 503 || w.Header().Get("Idempotency-Key-Expires") != "" {
		t.Fatalf("5xx: %d with expiry %q", w.Code, w.Header().Get("Idempotency-Key-Expires"))
	}
	if _, err := httpidem.New(newRunner(t, nil), httpidem.WithSharedKeySpace(), httpidem.WithExpiresHeader("bad header")); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithExpiresHeader") {
		t.Fatalf("bad name: %v", err)
	}
}

// catalog is the resources the reference tests create: id -> body.
type catalog struct {
	mu    sync.Mutex
	items map[string]string
}

func (c *catalog) render(w http.ResponseWriter, r *http.Request, ref httpidem.Reference) error {
	if ref.Ref == "broken" {
		return errors.New("the catalog is down")
	}
	c.mu.Lock()
	body, ok := c.items[ref.Ref]
	c.mu.Unlock()
	if !ok {
		// Deleted since: the service decides what a replay says.
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusGone)
		io.WriteString(w, "resource "+ref.Ref+" was deleted")
		return nil
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(ref.Status)
	io.WriteString(w, body)
	return nil
}

// A handler stores a reference instead of its (large) body; every replay
// renders the resource as it is then, marked replayed; a deleted
// resource answers what the renderer decides; a renderer that fails
// answers 500 and the handler never runs again; without a renderer,
// StoreReference reports false and the body is stored as usual.
func TestStoreReference(t *testing.T) {
	cat := &catalog{items: map[string]string{}}
	var runs atomic.Int64
	var stored atomic.Bool
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		id := fmt.Sprint("res_", n)
		if strings.Contains(r.URL.Path, "broken") {
			id = "broken"
		}
		body := strings.Repeat("x", 10_000) // larger than the stored limit
		cat.mu.Lock()
		cat.items[id] = body
		cat.mu.Unlock()
		stored.Store(httpidem.StoreReference(w, id))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	})
	h := wrap(t, newRunner(t, nil), handler, httpidem.WithMaxResponseSize(1024), httpidem.WithReferenceRenderer(cat.render))

	first := do(h, "POST", "/items", "k", `{}`)
	if first.Code != 201 || first.Body.Len() != 10_000 || !stored.Load() {
		t.Fatalf("first: %d, %d bytes, reference stored %v", first.Code, first.Body.Len(), stored.Load())
	}
	cat.mu.Lock()
	cat.items["res_1"] = "updated since"
	cat.mu.Unlock()
	w := do(h, "POST", "/items", "k", `{}`)
	if w.Code != 201 || w.Body.String() != "updated since" || w.Header().Get("Idempotent-Replayed") != "true" || w.Header().Get("Idempotency-Key-Expires") == "" {
		t.Fatalf("replay: %d %q %v, want the current state, marked replayed", w.Code, w.Body, w.Header())
	}
	// The fingerprint rule is unchanged: another body is a 422.
	problem(t, do(h, "POST", "/items", "k", `{"other":1}`), 422, httpidem.ProblemKeyReused)
	cat.mu.Lock()
	delete(cat.items, "res_1")
	cat.mu.Unlock()
	if w := do(h, "POST", "/items", "k", `{}`); w.Code != 410 || !strings.Contains(w.Body.String(), "deleted") {
		t.Fatalf("deleted: %d %q, want the renderer's 410", w.Code, w.Body)
	}
	do(h, "POST", "/broken", "b", `{}`)
	problem(t, do(h, "POST", "/broken", "b", `{}`), 500, httpidem.ProblemReferenceFailed)
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2: a replay never runs the handler", runs.Load())
	}

	// No renderer: no reference; the small body is stored as usual.
	h = wrap(t, newRunner(t, nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stored.Store(httpidem.StoreReference(w, "res_x"))
		io.WriteString(w, "small")
	}))
	do(h, "POST", "/items", "k", `{}`)
	if w := do(h, "POST", "/items", "k", `{}`); stored.Load() || w.Body.String() != "small" {
		t.Fatalf("without a renderer: StoreReference %v, replay %q", stored.Load(), w.Body)
	}
}

// The replay hook sees every replay before it is written, can add
// headers, and cannot change the stored body or status.
func TestReplayHook(t *testing.T) {
	var seen []string
	hook := func(r *http.Request, resp *httpidem.ReplayedResponse) {
		b, _ := io.ReadAll(resp.Body())
		seen = append(seen, fmt.Sprint(resp.Status, " ", string(b), " ", r.Header.Get("X-Request-Id")))
		resp.Header.Set("X-Replay-Of", "req-1")
		resp.Status = 500 // ignored
	}
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p, httpidem.WithReplayHook(hook))
	fresh := do(h, "POST", "/payments", "k", `{}`, "X-Request-Id", "req-1")
	for i := 2; i <= 3; i++ {
		w := do(h, "POST", "/payments", "k", `{}`, "X-Request-Id", fmt.Sprint("req-", i))
		if w.Code != fresh.Code || w.Body.String() != fresh.Body.String() || w.Header().Get("X-Replay-Of") != "req-1" {
			t.Fatalf("replay %d: %d %q %v", i, w.Code, w.Body, w.Header())
		}
	}
	if fresh.Header().Get("X-Replay-Of") != "" || len(seen) != 2 || seen[1] != fmt.Sprint(fresh.Code, " ", fresh.Body.String(), " req-3") {
		t.Fatalf("hook saw %q", seen)
	}
}

// Firefox may attach its own key to a POST: a quoted integer, an RFC 8941
// sf-string. It is accepted, and it is the same key as its bare form.
func TestFirefoxQuotedIntegerKey(t *testing.T) {
	p := &payments{}
	h := wrap(t, newRunner(t, nil), p)
	first := do(h, "POST", "/payments", `"1732998771"`, `{}`)
	again := do(h, "POST", "/payments", `1732998771`, `{}`)
	if first.Code != 201 || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() || p.runs.Load() != 1 {
		t.Fatalf("quoted %d, bare %d replayed=%q, runs %d; want one record", first.Code, again.Code, again.Header().Get("Idempotent-Replayed"), p.runs.Load())
	}
}
