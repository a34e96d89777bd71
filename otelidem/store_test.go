package otelidem_test

import (
	"context"
	"errors"
	"fmt"
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
func (limited) Capabilities() idempotency.Capabilities {
	return idempotency.Capabilities{Limits: idempotency.Limits{MinLease: 5 * time.Second}}
}

// TestStoreInterfaces: the wrapper keeps exactly the capabilities of the
// store it wraps, parts and limits, whatever their combination, with no
// type per combination.
func TestStoreInterfaces(t *testing.T) {
	mem := memStore(nil)
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
			c := idempotency.CapabilitiesOf(w)
			if (c.Watcher != nil) != tc.watch || (c.Inspector != nil) != tc.in || (c.Sweeper != nil) != tc.sweep {
				t.Errorf("wrapper has Watcher %v Inspector %v Sweeper %v, want %v %v %v", c.Watcher != nil, c.Inspector != nil, c.Sweeper != nil, tc.watch, tc.in, tc.sweep)
			}
			if got, want := c.Limits, idempotency.CapabilitiesOf(tc.s).Limits; got != want {
				t.Errorf("Limits = %+v, want %+v", got, want)
			}
			if u, ok := w.(interface{ Unwrap() idempotency.Store }); !ok || u.Unwrap() != tc.s {
				t.Error("Unwrap does not return the wrapped store")
			}
			if c.Sweeper != nil {
				if _, err := c.Sweeper.Sweep(context.Background(), 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestStoreKeepsTheBatcher: a wrapped Batcher stays one (DoBatch still
// claims a batch in one store call, not one per item), and each batch is
// one timed store operation.
func TestStoreKeepsTheBatcher(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	mem := memStore(nil)
	var claims, batches int
	counted := &countBatches{Store: mem, claims: &claims, batches: &batches}
	w := h.o.Store(counted)
	if idempotency.CapabilitiesOf(w).Batcher == nil {
		t.Fatal("the wrapper lost the store's Batcher")
	}
	r, err := idempotency.New(w)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]idempotency.Request, 10)
	for i := range reqs {
		reqs[i] = idempotency.Request{Key: fmt.Sprintf("b%d", i), Fingerprint: "fp"}
	}
	out := idempotency.DoBatch(context.Background(), r, reqs, func(ctx context.Context, i int) (int, error) { return i, nil })
	for i, o := range out {
		if o.Err != nil || o.Value != i {
			t.Fatalf("item %d: %+v, %v", i, o.Result, o.Err)
		}
	}
	if batches != 1 || claims != 0 {
		t.Errorf("%d claim batches and %d single claims through the wrapper, want 1 and 0", batches, claims)
	}
	equalMaps(t, otelidem.MetricStoreDuration, h.counts(otelidem.MetricStoreDuration), map[string]uint64{
		"idempotency.store.operation=claim_batch":  1,
		"idempotency.store.operation=finish_batch": 1,
	})
}

// countBatches is a memory store that counts its single and batch claims.
type countBatches struct {
	*memory.Store
	claims, batches *int
}

func (c *countBatches) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	*c.claims++
	return c.Store.Claim(ctx, r)
}

func (c *countBatches) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	*c.batches++
	return c.Store.ClaimBatch(ctx, reqs)
}

func (c *countBatches) Capabilities() idempotency.Capabilities {
	caps := c.Store.Capabilities()
	caps.Batcher = c
	return caps
}

// TestStoreLimitsReachRunner: a store's minimum lease still refuses a
// shorter one through the wrapper.
func TestStoreLimitsReachRunner(t *testing.T) {
	h := newHarness(t, otelidem.Options{})
	s := struct {
		base
		limited
	}{base{memStore(nil)}, limited{}}
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
	r, err := idempotency.New(h.o.Store(memStore(nil)), idempotency.WithObserver(h.o))
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
