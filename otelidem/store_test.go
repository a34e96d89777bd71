package otelidem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

type (
	base    struct{ idempotency.Store }
	watch   struct{}
	inspect struct{}
	sweep   struct{}
	limited struct{}
)

func (watch) Watch(context.Context, string) error { return nil }
func (inspect) Inspect(context.Context, string) (idempotency.RecordInfo, error) {
	return idempotency.RecordInfo{}, idempotency.ErrNotFound
}
func (inspect) Purge(context.Context, string) error { return nil }
func (inspect) Stuck(context.Context, string, int) ([]idempotency.RecordInfo, string, error) {
	return nil, "", nil
}
func (sweep) Sweep(context.Context, int) (int, error) { return 7, nil }
func (limited) Limits() idempotency.Limits            { return idempotency.Limits{MinLease: 5 * time.Second} }

// TestStoreInterfaces: the wrapper implements exactly the optional
// interfaces of the store it wraps, and reports its limits.
func TestStoreInterfaces(t *testing.T) {
	mem := memory.New(nil)
	for name, tc := range map[string]struct {
		s                idempotency.Store
		watch, in, sweep bool
	}{
		"none": {base{mem}, false, false, false},
		"watch": {struct {
			base
			watch
		}{base{mem}, watch{}}, true, false, false},
		"inspect": {struct {
			base
			inspect
		}{base{mem}, inspect{}}, false, true, false},
		"sweep": {struct {
			base
			sweep
		}{base{mem}, sweep{}}, false, false, true},
		"watch+inspect": {struct {
			base
			watch
			inspect
		}{base{mem}, watch{}, inspect{}}, true, true, false},
		"watch+sweep": {struct {
			base
			watch
			sweep
		}{base{mem}, watch{}, sweep{}}, true, false, true},
		"inspect+sweep": {struct {
			base
			inspect
			sweep
		}{base{mem}, inspect{}, sweep{}}, false, true, true},
		"watch+inspect+sweep": {struct {
			base
			watch
			inspect
			sweep
		}{base{mem}, watch{}, inspect{}, sweep{}}, true, true, true},
		"memory (all three)": {mem, true, true, true},
		"limited, none else": {struct {
			base
			limited
		}{base{mem}, limited{}}, false, false, false},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, otelidem.Options{})
			w := h.o.Store(tc.s)
			_, isW := w.(idempotency.Watcher)
			_, isI := w.(idempotency.Inspector)
			sw, isS := w.(idempotency.Sweeper)
			if isW != tc.watch || isI != tc.in || isS != tc.sweep {
				t.Errorf("wrapper is Watcher %v Inspector %v Sweeper %v, want %v %v %v", isW, isI, isS, tc.watch, tc.in, tc.sweep)
			}
			ls, ok := w.(idempotency.LimitedStore)
			if !ok {
				t.Fatal("wrapper is not a LimitedStore")
			}
			want := idempotency.Limits{}
			if inner, ok := tc.s.(idempotency.LimitedStore); ok {
				want = inner.Limits()
			}
			if got := ls.Limits(); got != want {
				t.Errorf("Limits() = %+v, want %+v", got, want)
			}
			if u, ok := w.(interface{ Unwrap() idempotency.Store }); !ok || u.Unwrap() != tc.s {
				t.Error("Unwrap does not return the wrapped store")
			}
			if isS {
				if _, err := sw.Sweep(context.Background(), 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestStoreLimitsReachRunner: a store's minimum lease still refuses a
// shorter one through the wrapper.
func TestStoreLimitsReachRunner(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	s := struct {
		base
		limited
	}{base{memory.New(nil)}, limited{}}
	_, err := idempotency.New(h.o.Store(s), idempotency.WithLease(time.Second))
	if !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("New with a lease under the store's minimum: %v", err)
	}
	if h.o.Store(nil) != nil || h.o.Store((*memory.Store)(nil)) != nil {
		t.Error("Store(nil) is not nil")
	}
}

// TestAdminThroughWrapper: the operator's calls work through the wrapper
// and are timed.
func TestAdminThroughWrapper(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	r, err := idempotency.New(h.o.Store(memory.New(nil)), idempotency.WithObserver(h.o))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := idempotency.Request{Key: "k"}
	if _, err := idempotency.Do(ctx, r, req, func(ctx context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if info, err := r.Inspect(ctx, req, false); err != nil || info.State != idempotency.StateCompleted {
		t.Fatalf("inspect: %+v %v", info, err)
	}
	if err := r.Purge(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sweep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	equalMaps(t, otelidem.MetricStoreDuration, h.counts(otelidem.MetricStoreDuration), map[string]uint64{
		"idempotency.store.operation=claim":    1,
		"idempotency.store.operation=complete": 1,
		"idempotency.store.operation=inspect":  1,
		"idempotency.store.operation=purge":    1,
		"idempotency.store.operation=sweep":    1,
	})
}

// TestCallOutcome: the classification of calls, including fn errors that
// wrap the runner's sentinels.
func TestCallOutcome(t *testing.T) {
	for _, tc := range []struct {
		c    idempotency.Call
		want otelidem.Outcome
	}{
		{idempotency.Call{Ran: true, Attempt: 1}, otelidem.OutcomeAcquired},
		{idempotency.Call{Ran: true, Attempt: 1, Err: errors.New("declined")}, otelidem.OutcomeAcquired},
		{idempotency.Call{Ran: true, Attempt: 2}, otelidem.OutcomeTakeover},
		{idempotency.Call{Ran: true, Attempt: 1, Err: &idempotency.StoreError{Op: "complete", Ran: true, Err: errDown}}, otelidem.OutcomeStoreError},
		{idempotency.Call{Ran: true, Attempt: 1, Err: idempotency.ErrLeaseLost}, otelidem.OutcomeLeaseLost},
		{idempotency.Call{Ran: true, Attempt: 1, Err: idempotency.ErrFnPanicked}, otelidem.OutcomeAcquired},
		{idempotency.Call{Replayed: true}, otelidem.OutcomeReplayed},
		{idempotency.Call{Replayed: true, Err: &idempotency.StoredError{Message: "x"}}, otelidem.OutcomeStoredError},
		{idempotency.Call{Replayed: true, Err: idempotency.ErrResultNotStored}, otelidem.OutcomeResultNotStored},
		{idempotency.Call{Err: &idempotency.InProgressError{}}, otelidem.OutcomeInProgress},
		{idempotency.Call{Err: context.Canceled}, otelidem.OutcomeInProgress},
		{idempotency.Call{Err: idempotency.ErrMismatch}, otelidem.OutcomeMismatch},
		{idempotency.Call{Err: idempotency.ErrInvalidKey}, otelidem.OutcomeInvalidKey},
		{idempotency.Call{Err: &idempotency.StoreError{Op: "claim", Err: errDown}}, otelidem.OutcomeStoreError},
	} {
		if got := otelidem.CallOutcome(tc.c); got != tc.want {
			t.Errorf("CallOutcome(%+v) = %v, want %v", tc.c, got, tc.want)
		}
	}
}
