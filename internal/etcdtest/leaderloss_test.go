package etcdtest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeaderLoss runs Do with concurrent duplicates on a few hundred keys
// against a three-member cluster while its leader is stopped, a new one is
// elected, and the old one comes back. It asserts that no completed key
// ran its effect twice, that every completion acknowledged to a caller is
// still replayed afterwards, that every key ends COMPLETED or claimable,
// and that no call of Do took longer than its store calls' bound plus one
// lease; and it reports the figures.
func TestLeaderLoss(t *testing.T) {
	const (
		keys         = 400
		pairs        = 4 // goroutines 0..3 and 4..7 ask for the same keys: duplicates
		lease        = 3 * time.Second
		storeTimeout = time.Second // a third of the lease
		attempts     = idempotency.DefaultStoreAttempts
		work         = 25 * time.Millisecond
	)
	c := etcdtest.Start(t, 3, etcdtest.Fast)
	cli := c.Client(t)
	store, err := idemetcd.New(cli, &idemetcd.Options{Prefix: "leaderloss/"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := idempotency.New(store, idempotency.WithLease(lease), idempotency.WithStoreTimeout(storeTimeout),
		idempotency.WithRetention(time.Hour), idempotency.WithWait(lease))
	if err != nil {
		t.Fatal(err)
	}
	// Each call of Do: its store calls (every attempt timing out, plus
	// backoff), at most one wait of a lease for a duplicate, and a margin
	// for a loaded machine.
	callBound := attempts*storeTimeout + 200*time.Millisecond + lease + time.Second

	var (
		effects   [keys]atomic.Int32
		acked     [keys]atomic.Int32 // value acknowledged to a caller + 1, or 0
		calls     atomic.Int64
		inProg    atomic.Int64
		storeErrs atomic.Int64
		ranErrs   atomic.Int64
		maxCall   atomic.Int64
		maxReq    atomic.Int64
		replayed  atomic.Int64
		during    atomic.Int64 // calls in flight while the cluster had no leader
		outage    atomic.Pointer[[2]time.Time]
		badErrs   = make(chan error, 64)
	)
	request := func(ctx context.Context, i int) {
		req := idempotency.Request{Scope: []string{"leader-loss"}, Key: fmt.Sprintf("key-%03d", i), Fingerprint: idempotency.FingerprintParts("k", fmt.Sprint(i))}
		begin := time.Now()
		defer func() { setMax(&maxReq, time.Since(begin)) }()
		for ctx.Err() == nil {
			start := time.Now()
			res, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) {
				effects[i].Add(1)
				time.Sleep(work)
				return i, nil
			})
			took := time.Since(start)
			calls.Add(1)
			if o := outage.Load(); o != nil && start.Before(o[1]) && start.Add(took).After(o[0]) {
				during.Add(1)
			}
			setMax(&maxCall, took)
			if took > callBound {
				badErrs <- fmt.Errorf("key %d: a call of Do took %v, above %v (%v)", i, took, callBound, err)
			}
			var se *idempotency.StoreError
			switch {
			case err == nil:
				if res.Value != i {
					badErrs <- fmt.Errorf("key %d: Do returned %d", i, res.Value)
				}
				acked[i].Store(int32(res.Value) + 1)
				if res.Replayed {
					replayed.Add(1)
				}
				return
			case errors.Is(err, idempotency.ErrInProgress):
				inProg.Add(1)
			case errors.As(err, &se):
				storeErrs.Add(1)
				if se.Ran {
					// fn may have run and the caller is told so: it does
					// not try again, and the key is left to its lease.
					ranErrs.Add(1)
					return
				}
				time.Sleep(50 * time.Millisecond)
			default:
				badErrs <- fmt.Errorf("key %d: %v", i, err)
				return
			}
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 2 * pairs {
		wg.Go(func() {
			for i := g % pairs; i < keys; i += pairs {
				request(ctx, i)
			}
		})
	}

	// A record claimed with a 10s lease, to see what the leader change does
	// to its lease.
	probeTTL := func() int64 {
		res, err := cli.Get(ctx, store.Key("probe")[:len(store.Key("probe"))-1]+"l")
		if err != nil || len(res.Kvs) == 0 {
			t.Fatalf("probe's live marker: %v %v", res, err)
		}
		l, err := cli.TimeToLive(ctx, clientv3.LeaseID(res.Kvs[0].Lease))
		if err != nil {
			t.Fatal(err)
		}
		return l.TTL
	}
	if _, err := store.Claim(ctx, idempotency.ClaimRequest{Key: "probe", Fingerprint: "p", Token: "probe-token", Lease: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}

	time.Sleep(1500 * time.Millisecond) // load on the healthy cluster; the probe's lease runs down
	before := probeTTL()
	leader := c.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	stopped := time.Now()
	c.Stop(leader)
	next, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	elected := time.Since(stopped)
	outage.Store(&[2]time.Time{stopped, stopped.Add(elected)})
	after := probeTTL()
	time.Sleep(1500 * time.Millisecond) // load on two members
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	back := time.Since(stopped)
	wg.Wait()
	close(badErrs)
	for err := range badErrs {
		t.Error(err)
	}

	// Every key ends COMPLETED (and replays what was acknowledged) or
	// claimable; no completed key ran twice.
	var completed, claimable, dup int
	for i := range keys {
		key, _ := r.StorageKey(idempotency.Request{Scope: []string{"leader-loss"}, Key: fmt.Sprintf("key-%03d", i)})
		fp := idempotency.FingerprintParts("k", fmt.Sprint(i))
		var res idempotency.ClaimResult
		for try := 0; try < 3; try++ {
			res, err = store.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: idempotency.Token(fmt.Sprintf("final-%d-%d", i, try)), Lease: time.Minute})
			if err != nil {
				t.Fatalf("final claim of key %d: %v", i, err)
			}
			if res.Outcome != idempotency.OutcomeInProgress {
				break
			}
			time.Sleep(res.RetryAfter) // a key left STARTED by a caller told Ran: its lease ends
		}
		switch res.Outcome {
		case idempotency.OutcomeReplay:
			completed++
			if n := effects[i].Load(); n != 1 {
				dup++
				t.Errorf("key %d is COMPLETED and its effect ran %d times", i, n)
			}
		case idempotency.OutcomeAcquired:
			claimable++
			if a := acked[i].Load(); a != 0 {
				t.Errorf("key %d: a completion acknowledged to a caller (%d) is lost: the key is claimable", i, a-1)
			}
		default:
			t.Errorf("key %d ends %v: want COMPLETED or claimable", i, res.Outcome)
		}
	}
	lostAcks := 0
	for i := range keys {
		if acked[i].Load() != 0 && effects[i].Load() == 0 {
			lostAcks++
		}
	}
	t.Logf("3 members, %d keys, %d goroutines (2 per key): %d calls of Do (%d replays of a duplicate's result, %d in flight during the election), %d in progress answers, %d store errors (%d after fn ran)",
		keys, 2*pairs, calls.Load(), replayed.Load(), during.Load(), inProg.Load(), storeErrs.Load(), ranErrs.Load())
	t.Logf("leader %s stopped; %s elected after %v; old leader back after %v", leader.Name, next.Name, elected.Round(time.Millisecond), back.Round(time.Millisecond))
	t.Logf("a 10s lease had %ds left before the leader stopped and %ds after the election: the new leader restarts every lease's TTL", before, after)
	t.Logf("ends: %d COMPLETED (%d with a duplicate effect), %d claimable; acknowledged completions lost: %d", completed, dup, claimable, lostAcks)
	t.Logf("longest call of Do %v (bound %v), longest request from first call to answer %v",
		time.Duration(maxCall.Load()).Round(time.Millisecond), callBound, time.Duration(maxReq.Load()).Round(time.Millisecond))
	if after < before {
		t.Errorf("the leader change shortened a lease: %ds left before, %ds after", before, after)
	}
}

func setMax(m *atomic.Int64, d time.Duration) {
	for {
		old := m.Load()
		if int64(d) <= old || m.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}
