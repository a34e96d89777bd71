package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

// TestReconcile: a holder crashed after charging (its "charge" recovery
// point says so) and its client never retried. The reconciler takes the
// record over with a greater fence, the resolver sees the checkpoint and
// the same downstream key the dead holder used, and completes it: the
// client's late retry gets the receipt without a second charge.
func TestReconcile(t *testing.T) {
	r, s, clock := newRunner(t)
	ctx := context.Background()
	charged, refunded, unknown, failing := req("charged"), req("not-charged"), req("unknown"), req("declined")
	fences := map[string]int64{}
	for _, rq := range []idempotency.Request{charged, refunded, unknown, failing} {
		cp := ""
		if rq.Key == charged.Key {
			cp = "charge"
		}
		fences[rq.Key] = crash(t, r, s, rq, cp)
	}
	live := req("live") // held by a live holder: never touched
	crash(t, r, s, live, "")
	clock.Advance(idempotency.DefaultLease + time.Second)
	// The live holder renews (as its heartbeat would).
	liveKey, _ := r.StorageKey(live)
	if err := s.Renew(ctx, liveKey, idempotency.Token("dead-holder-"+live.Key), time.Hour); err != nil {
		t.Fatal(err)
	}

	wantDownstream, _ := r.StorageKey(charged)
	var calls atomic.Int32
	rep, err := idempotency.Reconcile(ctx, r, 100, func(ctx context.Context, st idempotency.StuckRecord) (idempotency.Resolution[string], error) {
		calls.Add(1)
		info, ok := idempotency.FromContext(ctx)
		if !ok || info.Fence <= fences[st.Key] || st.Fence != info.Fence || st.Attempt != 2 || st.Listed.Fence != fences[st.Key] {
			t.Errorf("%s: resolver's lease %+v (StuckRecord %+v); want a takeover with a greater fence", st.Key, info, st)
		}
		if info.StorageKey != mustKey(t, r, st.Scope, st.Key) {
			t.Errorf("%s: resolver runs under %q", st.Key, info.StorageKey)
		}
		switch st.Key {
		case charged.Key:
			if _, ok := st.Checkpoints["charge"]; !ok {
				t.Errorf("the dead holder's checkpoints were not handed over: %v", st.Checkpoints)
			}
			if info.StorageKey != wantDownstream {
				t.Errorf("downstream keys differ")
			}
			return idempotency.CompleteWith("receipt-from-gateway"), nil
		case refunded.Key:
			return idempotency.ReleaseForRetry[string](), nil
		case failing.Key:
			return idempotency.FailWith[string](errors.New("card declined")), nil
		}
		return idempotency.Resolution[string]{}, errors.New("gateway unreachable")
	})
	if calls.Load() != 4 {
		t.Fatalf("resolver called %d times, want 4 (never for the live record)", calls.Load())
	}
	if rep.Listed != 4 || rep.Completed != 1 || rep.Released != 1 || rep.Failed != 1 || rep.Left != 1 || rep.Skipped != 0 || rep.Errors != 0 {
		t.Fatalf("report %+v", rep)
	}
	if err == nil || !strings.Contains(err.Error(), "gateway unreachable") {
		t.Fatalf("error %v; want the undecided resolver's", err)
	}

	var runs atomic.Int32
	fn := func(context.Context) (string, error) { runs.Add(1); return "ran", nil }
	if res, err := idempotency.Do(ctx, r, charged, fn); err != nil || !res.Replayed || res.Value != "receipt-from-gateway" {
		t.Fatalf("retry of the charged request: %+v, %v", res, err)
	}
	var se *idempotency.StoredError
	if _, err := idempotency.Do(ctx, r, failing, fn); !errors.As(err, &se) || se.Message != "card declined" {
		t.Fatalf("retry of the declined request: %v", err)
	}
	if res, err := idempotency.Do(ctx, r, refunded, fn); err != nil || res.Replayed || res.Value != "ran" {
		t.Fatalf("retry of the released request: %+v, %v; want fn to run", res, err)
	}
	// The undecided record keeps the reconciler's lease, then is stuck again.
	if _, err := idempotency.Do(ctx, r, unknown, fn); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("retry of the undecided request: %v; want in progress under the reconciler's lease", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times, want once (the released request)", runs.Load())
	}
	clock.Advance(idempotency.DefaultLease + time.Second)
	got, _, err := r.Stuck(ctx, "", 10)
	if err != nil || len(got) != 1 || got[0].Key != mustKey(t, r, unknown.Scope, unknown.Key) || got[0].Attempt != 2 {
		t.Fatalf("Stuck after the undecided lease ran out: %+v, %v", got, err)
	}
}

func mustKey(t *testing.T, r *idempotency.Runner, scope []string, key string) string {
	t.Helper()
	sk, err := r.StorageKey(idempotency.Request{Scope: scope, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	return sk
}

// raceStore lets a retry take a listed record over between the listing
// and the reconciler's claim.
type raceStore struct {
	idempotency.Store
	retry func()
}

func (s raceStore) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	return s.Store.(idempotency.Inspector).Inspect(ctx, key)
}

func (s raceStore) Purge(ctx context.Context, key string) error {
	return s.Store.(idempotency.Inspector).Purge(ctx, key)
}

func (s raceStore) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	infos, next, err := s.Store.(idempotency.Inspector).Stuck(ctx, cursor, limit)
	s.retry()
	return infos, next, err
}

// TestReconcileNeverRacesARetry: a record that a retry takes over after
// the listing is skipped; the resolver never runs beside the retry.
func TestReconcileNeverRacesARetry(t *testing.T) {
	base, s, clock := newRunner(t)
	stuck := req("contended")
	crash(t, base, s, stuck, "")
	clock.Advance(idempotency.DefaultLease + time.Second)
	retried := make(chan struct{})
	var r *idempotency.Runner
	r, err := idempotency.New(raceStore{Store: s, retry: func() {
		select {
		case <-retried:
			return
		default:
		}
		close(retried)
		key, _ := r.StorageKey(stuck)
		res, err := s.Claim(context.Background(), idempotency.ClaimRequest{Key: key, Fingerprint: stuck.Fingerprint, Token: "retry", Lease: time.Hour, Grace: time.Hour})
		if err != nil || res.Outcome != idempotency.OutcomeAcquired {
			t.Errorf("the retry's takeover: %+v, %v", res, err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := idempotency.Reconcile(context.Background(), r, 10, func(context.Context, idempotency.StuckRecord) (idempotency.Resolution[int], error) {
		t.Error("the resolver ran on a record a retry holds")
		return idempotency.CompleteWith(1), nil
	})
	if err != nil || rep.Listed != 1 || rep.Skipped != 1 {
		t.Fatalf("report %+v, %v; want the record skipped", rep, err)
	}
}

// TestReconcilePanicLeavesTheRecord: a resolver that panics does not
// release the record (a release would let a retry charge again); the
// panic goes on.
func TestReconcilePanicLeavesTheRecord(t *testing.T) {
	r, s, clock := newRunner(t)
	stuck := req("panicky")
	crash(t, r, s, stuck, "")
	clock.Advance(idempotency.DefaultLease + time.Second)
	func() {
		defer func() {
			if p := recover(); p != "resolver bug" {
				t.Fatalf("recovered %v", p)
			}
		}()
		idempotency.Reconcile(context.Background(), r, 10, func(context.Context, idempotency.StuckRecord) (idempotency.Resolution[int], error) {
			panic("resolver bug")
		})
	}()
	info, err := r.Inspect(context.Background(), stuck, false)
	if err != nil || info.State != idempotency.StateStarted || info.Attempt != 2 || info.LeaseLeft <= 0 {
		t.Fatalf("after the panic: %+v, %v; want the record held under the reconciler's lease", info, err)
	}
	for name, f := range map[string]func() error{
		"limit": func() error {
			_, err := idempotency.Reconcile(context.Background(), r, 0, func(context.Context, idempotency.StuckRecord) (idempotency.Resolution[int], error) {
				return idempotency.CompleteWith(1), nil
			})
			return err
		},
		"resolver": func() error { _, err := idempotency.Reconcile[int](context.Background(), r, 1, nil); return err },
	} {
		if err := f(); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestReconcileKey: one record resolved by key, as an operator who
// checked the downstream by hand does. A live holder's record is left
// alone (nothing listed), a stuck one is taken over with a greater fence
// and completed, and an absent key is ErrNotFound.
func TestReconcileKey(t *testing.T) {
	r, s, clock := newRunner(t)
	ctx := context.Background()
	stuck, live := req("stuck"), req("live")
	fence := crash(t, r, s, stuck, "charge")
	clock.Advance(idempotency.DefaultLease + time.Second)
	crash(t, r, s, live, "")
	resolve := func(ctx context.Context, st idempotency.StuckRecord) (idempotency.Resolution[string], error) {
		info, _ := idempotency.FromContext(ctx)
		if st.Key != stuck.Key || st.Attempt != 2 || info.Fence <= fence || st.Listed.Fence != fence || st.Checkpoints["charge"] == nil {
			t.Errorf("resolver handed %+v under %+v", st, info)
		}
		return idempotency.CompleteWith("paid"), nil
	}
	if rep, err := idempotency.ReconcileKey(ctx, r, live, resolve); err != nil || rep != (idempotency.ReconcileReport{}) {
		t.Fatalf("ReconcileKey of a live holder's record: %+v, %v; want nothing done", rep, err)
	}
	if rep, err := idempotency.ReconcileKey(ctx, r, stuck, resolve); err != nil || rep.Listed != 1 || rep.Completed != 1 {
		t.Fatalf("ReconcileKey of a stuck record: %+v, %v", rep, err)
	}
	if res, err := idempotency.Do(ctx, r, stuck, func(context.Context) (string, error) { return "charged again", nil }); err != nil || !res.Replayed || res.Value != "paid" {
		t.Fatalf("retry after ReconcileKey: %+v, %v", res, err)
	}
	if rep, err := idempotency.ReconcileKey(ctx, r, stuck, resolve); err != nil || rep.Listed != 0 {
		t.Fatalf("ReconcileKey of a completed record: %+v, %v; want nothing done", rep, err)
	}
	if _, err := idempotency.ReconcileKey(ctx, r, req("absent"), resolve); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("ReconcileKey of an absent key: %v", err)
	}
}

// TestDownstreamKeyOf: the key an operator computes from a storage key is
// the one DownstreamKey gives fn.
func TestDownstreamKeyOf(t *testing.T) {
	r, _, _ := newRunner(t)
	rq := req("order-7")
	var inside string
	if _, err := idempotency.Do(context.Background(), r, rq, func(ctx context.Context) (string, error) {
		var err error
		inside, err = idempotency.DownstreamKey(ctx, "charge")
		return "", err
	}); err != nil {
		t.Fatal(err)
	}
	if got := idempotency.DownstreamKeyOf(mustKey(t, r, rq.Scope, rq.Key), "charge"); got != inside {
		t.Fatalf("DownstreamKeyOf = %q, DownstreamKey in fn = %q", got, inside)
	}
}
