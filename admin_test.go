package idempotency_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// crash leaves req's record STARTED as a holder that died after recording
// a checkpoint would: claimed under its own token, never renewed, never
// completed. It returns the dead holder's fence.
func crash(t *testing.T, r *idempotency.Runner, s idempotency.Store, req idempotency.Request, checkpoint string) int64 {
	t.Helper()
	key, err := r.StorageKey(req)
	if err != nil {
		t.Fatal(err)
	}
	tok := idempotency.Token("dead-holder-" + req.Key)
	res, err := s.Claim(context.Background(), idempotency.ClaimRequest{Key: key, Fingerprint: req.Fingerprint, Token: tok, Lease: idempotency.DefaultLease, Grace: time.Hour})
	if err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("crash: claim %+v, %v", res, err)
	}
	if checkpoint != "" {
		if err := s.Checkpoint(context.Background(), key, tok, checkpoint, []byte(`"done"`)); err != nil {
			t.Fatal(err)
		}
	}
	return res.Fence
}

func TestInspectPurgeStuck(t *testing.T) {
	var events []idempotency.Outcome
	obs := idempotency.ObserverFunc(func(_ context.Context, e idempotency.Event) { events = append(events, e.Outcome) })
	r, s, clock := newRunner(t, idempotency.WithObserver(obs))
	ctx := context.Background()

	if _, err := r.Inspect(ctx, req("nothing"), false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Inspect of an absent key: %v", err)
	}
	if _, err := r.Inspect(ctx, idempotency.Request{Key: ""}, false); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Fatalf("Inspect of an empty key: %v", err)
	}

	done := req("done")
	if _, err := idempotency.Do(ctx, r, done, func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
		t.Fatal(err)
	}
	info, err := r.Inspect(ctx, done, false)
	if err != nil || info.State != idempotency.StateCompleted || info.Result != nil || info.ResultSize == 0 || info.Fence < 1 {
		t.Fatalf("Inspect without the result: %+v, %v", info, err)
	}
	info, err = r.Inspect(ctx, done, true)
	kind, payload, derr := idempotency.DescribeResult(info.Result)
	if err != nil || derr != nil || kind != "value" || string(payload) != `"ch_1"` || info.ResultSize != len(info.Result) {
		t.Fatalf("Inspect with the result: %+v, %v; DescribeResult %q %q %v", info, err, kind, payload, derr)
	}

	stuck := req("stuck")
	deadFence := crash(t, r, s, stuck, "charge")
	if got, _, err := r.Stuck(ctx, "", 10); err != nil || len(got) != 0 {
		t.Fatalf("Stuck while the lease lives: %+v, %v", got, err)
	}
	clock.Advance(idempotency.DefaultLease + time.Second)
	got, next, err := r.Stuck(ctx, "", 10)
	sk, _ := r.StorageKey(stuck)
	if err != nil || next != "" || len(got) != 1 || got[0].Key != sk || got[0].Fence != deadFence || got[0].Result != nil {
		t.Fatalf("Stuck: %+v, %q, %v; want the crashed record", got, next, err)
	}
	scope, key, err := idempotency.ParseStorageKey(got[0].Key)
	if err != nil || key != stuck.Key || !slices.Equal(scope, stuck.Scope) {
		t.Fatalf("ParseStorageKey(%q) = %q, %q, %v", got[0].Key, scope, key, err)
	}

	events = nil
	if err := r.Purge(ctx, stuck); err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0] != idempotency.OutcomePurged {
		t.Fatalf("events after Purge: %v, want [purged]", events)
	}
	var runs atomic.Int32
	res, err := idempotency.Do(ctx, r, stuck, func(context.Context) (int, error) { runs.Add(1); return 1, nil })
	if err != nil || runs.Load() != 1 || res.Fence <= deadFence || res.Attempt != 1 {
		t.Fatalf("Do after Purge: %+v, %v, %d runs; want a fresh run with a greater fence", res, err, runs.Load())
	}
	if _, _, err := r.Stuck(ctx, "", 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("Stuck with limit 0: %v", err)
	}
	if n, err := r.Sweep(ctx, 0); err != nil || n != 0 {
		t.Fatalf("Sweep: %d, %v", n, err)
	}
}

// bareStore is a store with nothing but the Store methods.
type bareStore struct{ idempotency.Store }

func TestOperatorViewNeedsAnInspector(t *testing.T) {
	r, err := idempotency.New(bareStore{memStore(nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := r.Inspect(ctx, req("k"), false); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Inspect: %v", err)
	}
	if err := r.Purge(ctx, req("k")); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Purge: %v", err)
	}
	if _, _, err := r.Stuck(ctx, "", 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Stuck: %v", err)
	}
	if _, err := r.Sweep(ctx, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Sweep: %v", err)
	}
	if _, err := idempotency.Reconcile(ctx, r, 10, func(context.Context, idempotency.StuckRecord) (idempotency.Resolution[int], error) {
		return idempotency.CompleteWith(1), nil
	}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Reconcile: %v", err)
	}
}

func TestParseStorageKey(t *testing.T) {
	for _, c := range []struct {
		scope []string
		key   string
	}{
		{nil, "k"},
		{[]string{"acct:1", "POST /p"}, "a:b"},
		{[]string{"12", "3:4"}, "5"},
		{[]string{"ünïcode"}, strings.Repeat("x", 255)},
	} {
		sk, err := idempotency.StorageKey(c.scope, c.key)
		if err != nil {
			t.Fatal(err)
		}
		scope, key, err := idempotency.ParseStorageKey(sk)
		if err != nil || key != c.key || !slices.Equal(scope, c.scope) && !(len(scope) == 0 && len(c.scope) == 0) {
			t.Errorf("ParseStorageKey(%q) = %q, %q, %v; want %q, %q", sk, scope, key, err, c.scope, c.key)
		}
	}
	for _, bad := range []string{"", "k", "3:ab", "01:a", "1:", "x:a", "2:ab1", "99999999:a"} {
		if _, _, err := idempotency.ParseStorageKey(bad); !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Errorf("ParseStorageKey(%q): %v, want ErrInvalidKey", bad, err)
		}
	}
}

// inspectCounter counts the Inspect calls that reach the store.
type inspectCounter struct {
	*memory.Store
	calls atomic.Int32
}

func (c *inspectCounter) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	c.calls.Add(1)
	return c.Store.Inspect(ctx, key)
}

// ErrNotFound is an answer, not a failure: it is never retried.
func TestInspectNotFoundIsNotRetried(t *testing.T) {
	s := &inspectCounter{Store: memStore(nil)}
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Inspect(context.Background(), req("absent"), false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Inspect of an absent key: %v, want ErrNotFound", err)
	}
	if n := s.calls.Load(); n != 1 {
		t.Errorf("Inspect reached the store %d times for an absent key, want 1 (ErrNotFound retried)", n)
	}
}
