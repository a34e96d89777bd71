package batch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/examples/batch"
	"github.com/exactlyonce/idempotency/store/memory"
)

// gateway is a downstream that sends messages, failing the ones it is
// told to fail once.
type gateway struct {
	mu    sync.Mutex
	sent  map[string]int // by key
	flaky map[string]bool
}

func (g *gateway) send(ctx context.Context, it batch.Item) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flaky[it.Key] {
		g.flaky[it.Key] = false
		return "", errors.New("gateway timeout")
	}
	if it.To == "" {
		return "", idempotency.Permanent(errors.New("no recipient"))
	}
	g.sent[it.Key]++
	return fmt.Sprintf("msg_%s_%d", it.Key, g.sent[it.Key]), nil
}

func post(t *testing.T, h http.Handler, account string, items ...batch.Item) []batch.Answer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"items": items})
	req := httptest.NewRequest("POST", "/messages:batch", bytes.NewReader(body))
	req.Header.Set("X-Account", account)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var out struct{ Results []batch.Answer }
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	return out.Results
}

// TestRetriedBatch: a batch whose third item fails transiently; its retry
// replays the items that completed and runs the third; a duplicate key in
// one batch sends once; a key reused with another message is rejected; an
// invalid key fails its item only; another account's same keys are its own.
func TestRetriedBatch(t *testing.T) {
	store, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{sent: map[string]int{}, flaky: map[string]bool{"c": true}}
	h := batch.Handler(r, func(req *http.Request) (string, bool) {
		a := req.Header.Get("X-Account")
		return a, a != ""
	}, g.send)
	items := []batch.Item{
		{Key: "a", To: "+1", Text: "one"},
		{Key: "b", To: "+2", Text: "two"},
		{Key: "c", To: "+3", Text: "three"},
		{Key: "a", To: "+1", Text: "one"}, // the same item again
		{Key: "", To: "+4", Text: "no key"},
		{Key: "d", To: "", Text: "no recipient"},
	}
	statuses := func(as []batch.Answer) string {
		s := ""
		for _, a := range as {
			s += a.Status + " "
		}
		return s
	}
	first := post(t, h, "acct_1", items...)
	if got := statuses(first); got != "sent sent retry replayed rejected failed " {
		t.Fatalf("first request: %q (%+v)", got, first)
	}
	second := post(t, h, "acct_1", items...)
	if got := statuses(second); got != "replayed replayed sent replayed rejected failed " {
		t.Fatalf("retried request: %q (%+v)", got, second)
	}
	if second[0].ID != first[0].ID || second[1].ID != first[1].ID || second[3].ID != first[0].ID {
		t.Errorf("the replayed items' IDs changed: %+v, then %+v", first, second)
	}
	reused := post(t, h, "acct_1", batch.Item{Key: "a", To: "+1", Text: "another text"})
	if reused[0].Status != "rejected" {
		t.Errorf("a key reused with another message: %+v", reused[0])
	}
	other := post(t, h, "acct_2", items[0])
	if other[0].Status != "sent" {
		t.Errorf("another account's key a: %+v, want its own send", other[0])
	}
	if g.sent["a"] != 2 || g.sent["b"] != 1 || g.sent["c"] != 1 || g.sent["d"] != 0 {
		t.Errorf("sent %v: want a once per account, b and c once, d never", g.sent)
	}
}
