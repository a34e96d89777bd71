package etcdtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
)

// TestNoQuorum: a three-member cluster that loses two members has no
// quorum. A Do whose completion meets it fails with a *StoreError, Ran
// true, and a Do that starts without quorum fails with Ran false, fn not
// run; both within the store calls' bound. With the members back, the key
// left STARTED is taken over after its lease.
func TestNoQuorum(t *testing.T) {
	const (
		lease        = 2 * time.Second
		storeTimeout = 500 * time.Millisecond
	)
	bound := idempotency.DefaultStoreAttempts*storeTimeout + 1500*time.Millisecond
	c := etcdtest.Start(t, 3, etcdtest.Fast)
	store, err := idemetcd.New(c.Client(t), &idemetcd.Options{Prefix: "quorum/"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := idempotency.New(store, idempotency.WithLease(lease), idempotency.WithStoreTimeout(storeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	leader := c.Leader()
	var others []*etcdtest.Member
	for _, m := range c.Members() {
		if m != leader {
			others = append(others, m)
		}
	}

	var start time.Time // when fn returns: stopping members takes a while
	_, err = idempotency.Do(ctx, r, idempotency.Request{Key: "lost-quorum"}, func(context.Context) (int, error) {
		for _, m := range others { // the leader is left alone
			c.Stop(m)
		}
		start = time.Now()
		return 1, nil
	})
	took := time.Since(start)
	var se *idempotency.StoreError
	if !errors.As(err, &se) || !se.Ran {
		t.Fatalf("Do whose completion met no quorum: %v, want a *StoreError with Ran true", err)
	}
	if took > bound {
		t.Errorf("it took %v, want at most %v", took, bound)
	}
	t.Logf("quorum lost while fn ran: %v, %v after fn returned", err, took.Round(time.Millisecond))

	start = time.Now()
	ran := false
	_, err = idempotency.Do(ctx, r, idempotency.Request{Key: "no-quorum"}, func(context.Context) (int, error) { ran = true; return 1, nil })
	took = time.Since(start)
	if !errors.As(err, &se) || se.Ran || ran {
		t.Fatalf("Do without quorum: %v (fn ran: %v), want a *StoreError with Ran false", err, ran)
	}
	if took > bound {
		t.Errorf("it took %v, want at most %v", took, bound)
	}
	t.Logf("no quorum from the start: %v after %v", err, took.Round(time.Millisecond))

	for _, m := range others {
		if err := c.Restart(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The key whose completion failed is STARTED until its lease (restarted
	// by the new leader) ends; then a retry takes it over.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Key: "lost-quorum"}, func(context.Context) (int, error) { return 2, nil })
		if err == nil {
			if res.Value != 2 || res.Attempt != 2 {
				t.Errorf("retry after the lease: %+v, want a takeover (attempt 2) running fn", res)
			}
			break
		}
		if !errors.Is(err, idempotency.ErrInProgress) && !errors.Is(err, idempotency.ErrStore) || time.Now().After(deadline) {
			t.Fatalf("retry after quorum came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
