package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// recorder is a CallObserver that records what it sees. Its StartCall
// returns a context carrying a marker, so the test can check that the
// store, fn and the events get it.
type recorder struct {
	mu     sync.Mutex
	events []idempotency.Event
	marked []bool // whether each event's context carried the marker
	starts int
	ends   []idempotency.Call
}

type markKey struct{}

func marked(ctx context.Context) bool { return ctx.Value(markKey{}) != nil }

func (o *recorder) Observe(ctx context.Context, e idempotency.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
	o.marked = append(o.marked, marked(ctx))
}

func (o *recorder) StartCall(ctx context.Context, scope []string) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts++
	return context.WithValue(ctx, markKey{}, true)
}

func (o *recorder) EndCall(ctx context.Context, c idempotency.Call) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !marked(ctx) {
		panic("EndCall without StartCall's context")
	}
	o.ends = append(o.ends, c)
}

// markedStore checks that every store call gets StartCall's context.
type markedStore struct {
	*memory.Store
	t *testing.T
}

func (s markedStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if !marked(ctx) {
		s.t.Error("Claim without StartCall's context")
	}
	return s.Store.Claim(ctx, r)
}

func (s markedStore) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if !marked(ctx) {
		s.t.Error("Complete without StartCall's context")
	}
	return s.Store.Complete(ctx, key, token, result, retention)
}

// TestCallObserver: a CallObserver brackets every call of Do with
// StartCall and EndCall; its context reaches the store, fn and the
// events; the summary says whether fn ran and what the result was.
func TestCallObserver(t *testing.T) {
	o := &recorder{}
	r, err := idempotency.New(markedStore{memStore(nil), t}, idempotency.WithObserver(o))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	scope := []string{"acct"}
	fn := func(ctx context.Context) (int, error) {
		if !marked(ctx) {
			t.Error("fn without StartCall's context")
		}
		time.Sleep(time.Millisecond)
		return 7, nil
	}
	rq := idempotency.Request{Scope: scope, Key: "k"}
	first, err := idempotency.Do(ctx, r, rq, fn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, r, rq, fn); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope}, fn); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go on")
			}
		}()
		idempotency.Do(ctx, r, idempotency.Request{Key: "p"}, func(ctx context.Context) (int, error) { panic("boom") })
	}()

	o.mu.Lock()
	defer o.mu.Unlock()
	if o.starts != 4 || len(o.ends) != 4 {
		t.Fatalf("%d StartCall, %d EndCall; want 4 each", o.starts, len(o.ends))
	}
	fresh, replay, invalid, panicked := o.ends[0], o.ends[1], o.ends[2], o.ends[3]
	if !fresh.Ran || fresh.Replayed || fresh.Err != nil || fresh.Fence != first.Fence || fresh.Attempt != 1 || fresh.FnDuration < time.Millisecond || len(fresh.Scope) != 1 {
		t.Errorf("fresh call: %+v", fresh)
	}
	if replay.Ran || !replay.Replayed || replay.Err != nil || replay.Fence != first.Fence {
		t.Errorf("replay: %+v", replay)
	}
	if invalid.Ran || !errors.Is(invalid.Err, idempotency.ErrInvalidKey) {
		t.Errorf("invalid key: %+v", invalid)
	}
	if !panicked.Ran || panicked.Err != idempotency.ErrFnPanicked {
		t.Errorf("panic: %+v", panicked)
	}
	for i, m := range o.marked {
		if !m {
			t.Errorf("event %v without StartCall's context", o.events[i].Outcome)
		}
	}
}

// TestEventInvalidKeyAndReplayedError: a refused key is an event, and a
// replay reports what it replayed.
func TestEventInvalidKeyAndReplayedError(t *testing.T) {
	var buf bytes.Buffer
	logs := idempotency.NewSlogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	var mu sync.Mutex
	var events []idempotency.Event
	r, err := idempotency.New(memStore(nil), idempotency.WithObserver(idempotency.ObserverFunc(func(ctx context.Context, e idempotency.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
		logs.Observe(ctx, e)
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: strings.Repeat("x", 300)}, func(ctx context.Context) (int, error) { return 1, nil }); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Fatal(err)
	}
	perm := func(ctx context.Context) (int, error) { return 0, idempotency.Permanent(errors.New("declined")) }
	idempotency.Do(ctx, r, idempotency.Request{Key: "k"}, perm)
	idempotency.Do(ctx, r, idempotency.Request{Key: "k"}, perm)

	mu.Lock()
	defer mu.Unlock()
	if len(events) != 4 {
		t.Fatalf("events %v", events)
	}
	if e := events[0]; e.Outcome != idempotency.OutcomeInvalidKey || !errors.Is(e.Err, idempotency.ErrInvalidKey) || e.Key != "" {
		t.Errorf("invalid key event: %+v", e)
	}
	var se *idempotency.StoredError
	if e := events[3]; e.Outcome != idempotency.OutcomeReplay || !errors.As(e.Err, &se) || se.Message != "declined" {
		t.Errorf("replay event: %+v", e)
	}
	if idempotency.OutcomeInvalidKey.String() != "invalid_key" {
		t.Errorf("OutcomeInvalidKey.String() = %q", idempotency.OutcomeInvalidKey.String())
	}
	if !strings.Contains(buf.String(), "outcome=invalid_key") {
		t.Errorf("slog observer did not log the invalid key: %s", buf.String())
	}
}
