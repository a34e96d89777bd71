package httpidem_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// base64Results stores results as versions before raw []byte results
// did: a stored response as a base64 string inside JSON.
type base64Results struct{ *memory.Store }

func (s base64Results) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if len(result) == 0 || result[0] != 'b' {
		return s.Store.Complete(ctx, key, token, result, retention)
	}
	enc, err := json.Marshal(result[1:])
	if err != nil {
		return err
	}
	return s.Store.Complete(ctx, key, token, append([]byte{'v'}, enc...), retention)
}

// TestReplayOfFormerFormat: a response stored by an earlier version (as
// base64 inside JSON) replays unchanged, and one stored now is raw bytes.
func TestReplayOfFormerFormat(t *testing.T) {
	store := memStore(nil)
	p := &payments{}
	first := do(wrap(t, newRunner(t, base64Results{store}), p), "POST", "/payments", "k", `{"amount":100}`)
	h := wrap(t, newRunner(t, store), p)
	again := do(h, "POST", "/payments", "k", `{"amount":100}`)
	if p.runs.Load() != 1 || again.Code != http.StatusCreated || again.Body.String() != first.Body.String() ||
		again.Header().Get("Location") != first.Header().Get("Location") || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay of the former format: %d runs, %d %v %s; first %s", p.runs.Load(), again.Code, again.Header(), again.Body, first.Body)
	}

	do(h, "POST", "/payments", "k2", `{"amount":100}`)
	for _, key := range []string{"k", "k2"} {
		sk, _ := idempotency.StorageKey([]string{"tenant-1"}, key)
		info, err := store.Inspect(context.Background(), sk)
		if err != nil {
			t.Fatal(err)
		}
		kind, _, err := idempotency.DescribeResult(info.Result)
		want := map[string]string{"k": "value", "k2": "bytes"}[key]
		if err != nil || kind != want {
			t.Errorf("%s: stored as %q (%v), want %q", key, kind, err, want)
		}
	}
}
