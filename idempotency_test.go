package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/memory"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// newRunner returns a runner on a fresh memory store whose clock the test
// moves by hand.
func newRunner(t *testing.T, opts ...idempotency.Option) (*idempotency.Runner, *memory.Store, *conformancetest.Clock) {
	t.Helper()
	clock := conformancetest.NewClock(t0)
	s := memStore(&memory.Options{Now: clock.Now})
	r, err := idempotency.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r, s, clock
}

func req(key string) idempotency.Request {
	return idempotency.Request{Scope: []string{"tenant-a", "POST /payments"}, Key: key, Fingerprint: idempotency.FingerprintBytes([]byte("amount=100"))}
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	r, _, _ := newRunner(t)
	ctx := context.Background()
	var runs atomic.Int32
	fn := func(ctx context.Context) (string, error) {
		runs.Add(1)
		return "charge-1", nil
	}
	first, err := idempotency.Do(ctx, r, req("k1"), fn)
	if err != nil || first.Value != "charge-1" || first.Replayed || first.Fence < 1 || first.Attempt != 1 {
		t.Fatalf("first call = %+v, %v", first, err)
	}
	second, err := idempotency.Do(ctx, r, req("k1"), fn)
	if err != nil || second.Value != "charge-1" || !second.Replayed {
		t.Fatalf("second call = %+v, %v", second, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}

func TestDoConcurrentDuplicatesRunOnce(t *testing.T) {
	r, _, _ := newRunner(t)
	var runs, inProgress, replays atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			res, err := idempotency.Do(context.Background(), r, req("same"), func(ctx context.Context) (int, error) {
				runs.Add(1)
				<-release
				return 42, nil
			})
			var ip *idempotency.InProgressError
			switch {
			case errors.As(err, &ip):
				if ip.RetryAfter <= 0 || ip.RetryAfter > idempotency.DefaultLease {
					t.Errorf("retry-after %v out of range", ip.RetryAfter)
				}
				inProgress.Add(1)
			case err != nil:
				t.Errorf("unexpected error: %v", err)
			case res.Replayed:
				replays.Add(1)
			}
		})
	}
	// Everyone but the holder finishes with 409; then let the holder go.
	for inProgress.Load()+replays.Load() < 63 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if runs.Load() != 1 || inProgress.Load() != 63 {
		t.Fatalf("runs=%d inProgress=%d, want 1 and 63", runs.Load(), inProgress.Load())
	}
}

func TestMismatch(t *testing.T) {
	r, _, _ := newRunner(t)
	ctx := context.Background()
	ok := func(ctx context.Context) (int, error) { return 1, nil }
	if _, err := idempotency.Do(ctx, r, req("k"), ok); err != nil {
		t.Fatal(err)
	}
	other := req("k")
	other.Fingerprint = idempotency.FingerprintBytes([]byte("amount=999"))
	ran := false
	_, err := idempotency.Do(ctx, r, other, func(ctx context.Context) (int, error) { ran = true; return 2, nil })
	if !errors.Is(err, idempotency.ErrMismatch) || ran {
		t.Fatalf("err = %v, ran = %v; want ErrMismatch and fn not run", err, ran)
	}
}

func TestScopeIsolation(t *testing.T) {
	r, _, _ := newRunner(t)
	ctx := context.Background()
	a := idempotency.Request{Scope: []string{"tenant-a"}, Key: "k"}
	b := idempotency.Request{Scope: []string{"tenant-b"}, Key: "k"}
	// Plain concatenation would make these two collide.
	c := idempotency.Request{Scope: []string{"tenant-", "ak"}, Key: "k"}
	for i, rq := range []idempotency.Request{a, b, c} {
		res, err := idempotency.Do(ctx, r, rq, func(ctx context.Context) (int, error) { return i, nil })
		if err != nil || res.Replayed || res.Value != i {
			t.Fatalf("scope %v: %+v, %v: one scope saw another's record", rq.Scope, res, err)
		}
	}
}

func TestHeartbeatKeepsLeaseForLongFn(t *testing.T) {
	// Real time: the lease is 300ms and fn runs five times as long. Without
	// the heartbeat a prober would take the key over.
	s := memStore(nil)
	const lease = 300 * time.Millisecond
	r, err := idempotency.New(s, idempotency.WithLease(lease), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	fn := func(ctx context.Context) (int, error) {
		runs.Add(1)
		select {
		case <-time.After(5 * lease):
			return 7, nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r, req("long"), fn)
		done <- err
	}()
	probes := 0
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("holder: %v", err)
			}
			if runs.Load() != 1 {
				t.Fatalf("fn ran %d times; a prober took the lease over", runs.Load())
			}
			if probes < 5 {
				t.Fatalf("only %d probes ran", probes)
			}
			res, err := idempotency.Do(context.Background(), r, req("long"), fn)
			if err != nil || !res.Replayed || res.Value != 7 {
				t.Fatalf("after completion: %+v, %v", res, err)
			}
			return
		case <-time.After(lease / 4):
			probes++
			_, err := idempotency.Do(context.Background(), r, req("long"), fn)
			if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("probe: %v", err)
			}
		}
	}
}

func TestLostLeaseCancelsFn(t *testing.T) {
	// The lease is short in real time so the heartbeat runs; the store's
	// clock is moved past it so a second caller takes over.
	const lease = 150 * time.Millisecond
	r, _, clock := newRunner(t, idempotency.WithLease(lease), idempotency.WithUnsafeShortDurations())
	ctx := context.Background()
	var cause error
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) {
			close(started)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return "stale", ctx.Err()
		})
		done <- err
	}()
	<-started
	clock.Advance(time.Hour)
	res, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) { return "new", nil })
	if err != nil || res.Replayed || res.Attempt != 2 {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	err = <-done
	if !errors.Is(err, idempotency.ErrLeaseLost) || !errors.Is(cause, idempotency.ErrLeaseLost) {
		t.Fatalf("stale holder: err = %v, cause = %v; want ErrLeaseLost for both", err, cause)
	}
	res, err = idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) { return "again", nil })
	if err != nil || !res.Replayed || res.Value != "new" {
		t.Fatalf("replay after takeover: %+v, %v; want the new holder's result", res, err)
	}
}

func TestErrorPolicy(t *testing.T) {
	r, _, _ := newRunner(t)
	ctx := context.Background()
	var runs atomic.Int32
	transient := errors.New("gateway timeout")
	_, err := idempotency.Do(ctx, r, req("t"), func(ctx context.Context) (int, error) { runs.Add(1); return 0, transient })
	if !errors.Is(err, transient) {
		t.Fatalf("err = %v", err)
	}
	res, err := idempotency.Do(ctx, r, req("t"), func(ctx context.Context) (int, error) { runs.Add(1); return 5, nil })
	if err != nil || res.Replayed || res.Value != 5 || runs.Load() != 2 {
		t.Fatalf("retry after transient error: %+v, %v, runs=%d; want a fresh run", res, err, runs.Load())
	}
	if res.Fence <= 1 {
		t.Fatalf("fence after release = %d, want > 1", res.Fence)
	}

	insufficient := errors.New("payment exceeds balance")
	_, err = idempotency.Do(ctx, r, req("p"), func(ctx context.Context) (int, error) {
		return 0, idempotency.Permanent(insufficient)
	})
	if !errors.Is(err, insufficient) || !errors.Is(err, idempotency.ErrPermanent) {
		t.Fatalf("err = %v", err)
	}
	ran := false
	res, err = idempotency.Do(ctx, r, req("p"), func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	var stored *idempotency.StoredError
	if ran || !res.Replayed || !errors.As(err, &stored) || stored.Message != insufficient.Error() {
		t.Fatalf("replay of permanent error: ran=%v res=%+v err=%v", ran, res, err)
	}

	// A policy can classify errors instead of marking them.
	r2, _, _ := newRunner(t, idempotency.WithErrorPolicy(func(err error) bool { return errors.Is(err, insufficient) }))
	_, _ = idempotency.Do(ctx, r2, req("q"), func(ctx context.Context) (int, error) { return 0, insufficient })
	_, err = idempotency.Do(ctx, r2, req("q"), func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	if !errors.As(err, &stored) {
		t.Fatalf("policy-classified error not replayed: %v", err)
	}
}

func TestPanicReleasesLease(t *testing.T) {
	r, _, _ := newRunner(t)
	ctx := context.Background()
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the original panic", p)
			}
		}()
		_, _ = idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { panic("boom") })
	}()
	res, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 3, nil })
	if err != nil || res.Replayed || res.Value != 3 {
		t.Fatalf("after panic: %+v, %v; want the key released and fn run", res, err)
	}
}

func TestUnstorableSuccessNeverRerun(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context) (any, error)
		opts []idempotency.Option
	}{
		{"too large for the runner", func(ctx context.Context) (any, error) { return strings.Repeat("x", 100), nil },
			[]idempotency.Option{idempotency.WithMaxResultSize(50)}},
		{"too large for the store", func(ctx context.Context) (any, error) { return strings.Repeat("x", 2<<20), nil },
			[]idempotency.Option{idempotency.WithMaxResultSize(4 << 20)}},
		{"not encodable", func(ctx context.Context) (any, error) { return make(chan int), nil }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events []idempotency.Outcome
			var mu sync.Mutex
			obs := idempotency.ObserverFunc(func(ctx context.Context, e idempotency.Event) {
				mu.Lock()
				events = append(events, e.Outcome)
				mu.Unlock()
			})
			clock := conformancetest.NewClock(t0)
			s := memStore(&memory.Options{Now: clock.Now, MaxValueSize: 1 << 20})
			r, err := idempotency.New(s, append(tc.opts, idempotency.WithObserver(obs))...)
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			fn := func(ctx context.Context) (any, error) { runs++; return tc.fn(ctx) }
			if _, err := idempotency.Do(ctx, r, req("k"), fn); err != nil {
				t.Fatalf("first call: %v (the effect happened; the call succeeded)", err)
			}
			_, err = idempotency.Do(ctx, r, req("k"), fn)
			if !errors.Is(err, idempotency.ErrResultNotStored) || runs != 1 {
				t.Fatalf("retry: err = %v, runs = %d; want ErrResultNotStored and 1 run", err, runs)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(events) != "[acquired completed result_not_stored]" {
				t.Fatalf("events %v", events)
			}
		})
	}
}

func TestWaitReturnsInFlightResult(t *testing.T) {
	r, _, _ := newRunner(t, idempotency.WithWait(10*time.Second))
	ctx := context.Background()
	release, first := holdKey(r, "k")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			res, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) {
				t.Error("waiter ran fn")
				return "", nil
			})
			if err != nil || !res.Replayed || res.Value != "result" {
				t.Errorf("waiter got %+v, %v", res, err)
			}
		})
	}
	time.Sleep(20 * time.Millisecond) // let the waiters block (not needed for correctness)
	release()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestWaitIsBounded(t *testing.T) {
	r, _, _ := newRunner(t, idempotency.WithWait(30*time.Millisecond))
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	go idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) {
		close(started)
		<-release
		return 1, nil
	})
	<-started
	_, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 2, nil })
	if !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("err = %v, want ErrInProgress after the wait ran out", err)
	}
}

func TestInvalidInput(t *testing.T) {
	ctx := context.Background()
	r, s, _ := newRunner(t)
	fn := func(ctx context.Context) (int, error) { return 1, nil }
	for _, tc := range []struct {
		name string
		req  idempotency.Request
	}{
		{"empty", idempotency.Request{Key: ""}},
		{"too long", idempotency.Request{Key: strings.Repeat("k", 256)}},
		{"control character", idempotency.Request{Key: "a\nb"}},
		{"NUL", idempotency.Request{Key: "a\x00b"}},
		{"DEL", idempotency.Request{Key: "a\x7fb"}},
		{"C1 control", idempotency.Request{Key: "a\u0085b"}},
		{"invalid UTF-8", idempotency.Request{Key: "a\xffb"}},
		{"invalid scope", idempotency.Request{Scope: []string{"t\x00"}, Key: "k"}},
		{"empty scope part", idempotency.Request{Scope: []string{"", "POST /payments"}, Key: "k"}},
	} {
		_, err := idempotency.Do(ctx, r, tc.req, fn)
		if !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Errorf("%s: err = %v, want ErrInvalidKey", tc.name, err)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("invalid input wrote %d records", s.Len())
	}
	if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: strings.Repeat("k", 255)}, fn); err != nil {
		t.Fatalf("a 255-byte key: %v", err)
	}
	if _, err := idempotency.Do(ctx, r, idempotency.Request{Key: "k", Fingerprint: idempotency.Fingerprint(strings.Repeat("f", 300))}, fn); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("long fingerprint: %v", err)
	}
	if _, err := idempotency.Do[int](ctx, r, req("k"), nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil fn: %v", err)
	}
	//lint:ignore SA1012 a nil context is the point of this check
	if _, err := idempotency.Do(nil, r, req("k"), fn); !errors.Is(err, idempotency.ErrInvalidArgument) { //nolint:staticcheck
		t.Errorf("nil context: %v", err)
	}
	if _, err := idempotency.Do(ctx, nil, req("k"), fn); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil runner: %v", err)
	}
	if _, err := idempotency.New(nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("nil store: %v", err)
	}
	for _, opt := range []idempotency.Option{
		idempotency.WithLease(0), idempotency.WithLease(-time.Second), idempotency.WithRetention(0),
		idempotency.WithGrace(-1), idempotency.WithWait(-1), idempotency.WithCodec(nil),
		idempotency.WithErrorPolicy(nil), idempotency.WithMaxKeyLength(0), idempotency.WithMaxResultSize(0),
		idempotency.WithStoreRetries(0, 0), nil,
	} {
		if _, err := idempotency.New(s, opt); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("New with invalid option: %v", err)
		}
	}
	if _, err := idempotency.Step(ctx, "x", fn); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Step outside Do: %v", err)
	}
	if k, err := idempotency.DownstreamKey(ctx, "charge"); !errors.Is(err, idempotency.ErrInvalidArgument) || k != "" {
		t.Errorf("DownstreamKey outside Do: %q, %v", k, err)
	}
	if s.Len() != 1 {
		t.Fatalf("invalid input wrote %d records, want only the valid call's", s.Len())
	}
}

func TestRecoveryPointsSurviveCrash(t *testing.T) {
	// A lease of an hour never needs a heartbeat during the test; moving
	// the store's clock past it is the crash: the holder is still
	// blocked, it never renews or releases, and the key is taken over.
	r, _, clock := newRunner(t, idempotency.WithLease(time.Hour))
	ctx := context.Background()
	var step1, step2 atomic.Int32
	var keys []string
	var mu sync.Mutex
	payment := func(crash chan struct{}) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			row, err := idempotency.Step(ctx, "create-payment-row", func(ctx context.Context) (int, error) {
				step1.Add(1)
				return 1001, nil
			})
			if err != nil {
				return "", err
			}
			dk, _ := idempotency.DownstreamKey(ctx, "charge")
			mu.Lock()
			keys = append(keys, dk)
			mu.Unlock()
			if crash != nil {
				crash <- struct{}{}
				<-crash // "crashed": blocked until the test ends
				return "", errors.New("crashed")
			}
			charge, err := idempotency.Step(ctx, "call-gateway", func(ctx context.Context) (string, error) {
				step2.Add(1)
				return fmt.Sprintf("ch_%d", row), nil
			})
			return charge, err
		}
	}
	crash := make(chan struct{})
	crashed := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, r, req("pay"), payment(crash))
		crashed <- err
	}()
	<-crash
	clock.Advance(2 * time.Hour)
	res, err := idempotency.Do(ctx, r, req("pay"), payment(nil))
	if err != nil || res.Value != "ch_1001" || res.Attempt != 2 {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	if step1.Load() != 1 || step2.Load() != 1 {
		t.Fatalf("step1 ran %d times, step2 %d; want 1 and 1", step1.Load(), step2.Load())
	}
	if len(keys) != 2 || keys[0] != keys[1] || !strings.HasPrefix(keys[0], "charge:") {
		t.Fatalf("downstream keys %q: want one stable key across the takeover", keys)
	}
	close(crash)
	if err := <-crashed; !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("crashed holder: %v, want ErrLeaseLost", err)
	}
}

func TestFromContext(t *testing.T) {
	r, _, _ := newRunner(t)
	res, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (idempotency.Info, error) {
		info, ok := idempotency.FromContext(ctx)
		if !ok {
			return info, errors.New("no info")
		}
		return info, nil
	})
	if err != nil || res.Value.Key != "k" || res.Value.Fence != res.Fence || res.Value.Attempt != 1 || res.Value.StorageKey == "" {
		t.Fatalf("%+v, %v", res, err)
	}
	if _, ok := idempotency.FromContext(context.Background()); ok {
		t.Fatal("FromContext outside Do reported a lease")
	}
}

// flakyStore applies some operations and then reports an error, as a
// store whose reply was lost on the network does.
type flakyStore struct {
	idempotency.Store
	mu        sync.Mutex
	loseClaim int // replies to lose
	loseDone  int
	failDone  bool // Complete always fails, nothing applied
	claims    []idempotency.Token
}

var errNetwork = errors.New("connection reset")

func (f *flakyStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := f.Store.Claim(ctx, r)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims = append(f.claims, r.Token)
	if err == nil && f.loseClaim > 0 {
		f.loseClaim--
		return idempotency.ClaimResult{}, errNetwork
	}
	return res, err
}

func (f *flakyStore) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, ret time.Duration) error {
	f.mu.Lock()
	fail, lose := f.failDone, f.loseDone > 0
	if lose {
		f.loseDone--
	}
	f.mu.Unlock()
	if fail {
		return errNetwork
	}
	err := f.Store.Complete(ctx, key, tok, result, ret)
	if err == nil && lose {
		return errNetwork
	}
	return err
}

func TestAmbiguousStoreErrorsRetriedWithSameToken(t *testing.T) {
	clock := conformancetest.NewClock(t0)
	fs := &flakyStore{Store: memStore(&memory.Options{Now: clock.Now}), loseClaim: 1, loseDone: 1}
	r, err := idempotency.New(fs, idempotency.WithStoreRetries(3, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	res, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { runs++; return 9, nil })
	if err != nil || res.Value != 9 || runs != 1 {
		t.Fatalf("%+v, %v, runs=%d", res, err, runs)
	}
	if len(fs.claims) != 2 || fs.claims[0] != fs.claims[1] {
		t.Fatalf("claims %v: want the lost claim repeated with the same token", fs.claims)
	}
	res, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { runs++; return 0, nil })
	if err != nil || !res.Replayed || res.Value != 9 || runs != 1 {
		t.Fatalf("replay: %+v, %v, runs=%d", res, err, runs)
	}
}

func TestStoreFailureAfterFnIsReportedAsRan(t *testing.T) {
	clock := conformancetest.NewClock(t0)
	fs := &flakyStore{Store: memStore(&memory.Options{Now: clock.Now}), failDone: true}
	r, err := idempotency.New(fs, idempotency.WithStoreRetries(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	res, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { return 9, nil })
	var se *idempotency.StoreError
	if !errors.As(err, &se) || !se.Ran || se.Op != "complete" || !errors.Is(err, errNetwork) || !errors.Is(err, idempotency.ErrStore) {
		t.Fatalf("err = %v, want a StoreError with Ran", err)
	}
	if res.Value != 9 {
		t.Fatalf("value %d: the caller should still get what fn returned", res.Value)
	}
	// The record stays STARTED: a retry must not run fn while the lease lives.
	_, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { return 0, nil })
	if !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("retry: %v, want ErrInProgress", err)
	}
}

type downStore struct{ idempotency.Store }

func (downStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, errNetwork
}

func TestStoreDownBeforeFn(t *testing.T) {
	r, err := idempotency.New(downStore{memStore(nil)}, idempotency.WithStoreRetries(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	var se *idempotency.StoreError
	if ran || !errors.As(err, &se) || se.Ran || se.Op != "claim" || !errors.Is(err, errNetwork) {
		t.Fatalf("ran=%v err=%v", ran, err)
	}
}

func TestCanceledContext(t *testing.T) {
	r, s, _ := newRunner(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	_, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	if !errors.Is(err, context.Canceled) || ran || s.Len() != 0 {
		t.Fatalf("err=%v ran=%v records=%d", err, ran, s.Len())
	}
}

func TestObserverAndSlog(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, _, _ := newRunner(t, idempotency.WithObserver(idempotency.NewSlogObserver(logger)))
	ctx := context.Background()
	idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
	idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
	idempotency.Do(ctx, r, req("t"), func(ctx context.Context) (int, error) { return 0, errors.New("transient") })
	out := buf.String()
	for _, want := range []string{"outcome=acquired", "outcome=completed", "outcome=replayed", "outcome=released", "error=transient"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestHeartbeatKeepsManyLeases(t *testing.T) {
	// Sixteen holders share the runner's heartbeat schedule; each runs for
	// four leases while a prober checks, past every lease's first end, that
	// none was left to expire.
	const lease = 300 * time.Millisecond
	r, err := idempotency.New(memStore(nil), idempotency.WithLease(lease), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 16 {
		key := fmt.Sprintf("long-%d", i)
		started := make(chan struct{})
		wg.Go(func() {
			res, err := idempotency.Do(ctx, r, req(key), func(ctx context.Context) (int, error) {
				close(started)
				select {
				case <-time.After(4 * lease):
					return i, nil
				case <-ctx.Done():
					return 0, context.Cause(ctx)
				}
			})
			if err != nil || res.Attempt != 1 {
				t.Errorf("%s: %+v, %v", key, res, err)
			}
		})
		wg.Go(func() {
			<-started
			time.Sleep(2 * lease)
			_, err := idempotency.Do(ctx, r, req(key), func(ctx context.Context) (int, error) {
				t.Errorf("%s: prober took the lease over", key)
				return -1, nil
			})
			if !errors.Is(err, idempotency.ErrInProgress) {
				t.Errorf("%s: prober got %v, want ErrInProgress", key, err)
			}
		})
	}
	wg.Wait()
}

// renewStore wraps a store whose Renew fails, hangs until its context ends,
// or hangs regardless of its context, as a store behind a broken network
// does.
type renewStore struct {
	idempotency.Store
	mode    string        // "slow", "fail", "hang", "ignore-ctx"
	blocked chan struct{} // closed at the end of the test
}

func (s *renewStore) Renew(ctx context.Context, key string, tok idempotency.Token, lease time.Duration) error {
	switch s.mode {
	case "slow": // slow, but it succeeds within the store timeout (a third of the lease), with a margin for a loaded machine
		time.Sleep(lease / 4)
		return s.Store.Renew(ctx, key, tok, lease)
	case "fail":
		return errNetwork
	case "hang":
		<-ctx.Done()
		return ctx.Err()
	default:
		<-s.blocked
		return errNetwork
	}
}

func TestHeartbeatStopsFnBeforeTakeoverWhenRenewalFails(t *testing.T) {
	// However the renewals fail, fn's context must be canceled before the
	// lease could end. fn here ignores its context (stuck code), so the key
	// is taken over, not released: a prober claims it in a loop, and when it
	// takes over, the first fn's context must already be canceled.
	const lease = time.Second
	for _, mode := range []string{"fail", "hang", "ignore-ctx"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			blocked := make(chan struct{})
			defer close(blocked)
			s := &renewStore{Store: memStore(nil), mode: mode, blocked: blocked}
			r, err := idempotency.New(s, idempotency.WithLease(lease), idempotency.WithUnsafeShortDurations(), idempotency.WithStoreRetries(2, time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			firstCtx := make(chan context.Context, 1)
			first := make(chan error, 1)
			stuck := make(chan struct{}) // fn ignores its context, as stuck code does
			go func() {
				_, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) {
					firstCtx <- ctx
					<-stuck
					return 1, nil
				})
				first <- err
			}()
			holderCtx := <-firstCtx
			for {
				var canceledBefore bool
				res, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) {
					canceledBefore = holderCtx.Err() != nil
					return 2, nil
				})
				if errors.Is(err, idempotency.ErrInProgress) {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if err != nil || res.Attempt != 2 {
					t.Fatalf("prober: %+v, %v", res, err)
				}
				if !canceledBefore {
					t.Fatal("the prober took over while the first fn's context was still live")
				}
				break
			}
			close(stuck)
			if err := <-first; !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Fatalf("first holder: %v, want ErrLeaseLost", err)
			}
			if cause := context.Cause(holderCtx); !errors.Is(cause, idempotency.ErrLeaseLost) {
				t.Fatalf("cause %v", cause)
			}
		})
	}
}

// noWatch hides the memory store's Watcher, so waiting polls.
type noWatch struct{ idempotency.Store }

func TestWaitPollsWithoutWatcher(t *testing.T) {
	clock := conformancetest.NewClock(t0)
	r, err := idempotency.New(noWatch{memStore(&memory.Options{Now: clock.Now})}, idempotency.WithWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	go idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) {
		close(started)
		<-release
		return "result", nil
	})
	<-started
	time.AfterFunc(50*time.Millisecond, func() { close(release) })
	res, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) {
		t.Error("waiter ran fn")
		return "", nil
	})
	if err != nil || !res.Replayed || res.Value != "result" {
		t.Fatalf("waiter: %+v, %v", res, err)
	}
}

// hangStore's Claim hangs until its context ends.
type hangStore struct{ idempotency.Store }

func (hangStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	<-ctx.Done()
	return idempotency.ClaimResult{}, ctx.Err()
}

func TestStoreTimeout(t *testing.T) {
	r, err := idempotency.New(hangStore{memStore(nil)}, idempotency.WithStoreTimeout(20*time.Millisecond), idempotency.WithStoreRetries(3, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	var se *idempotency.StoreError
	if ran || !errors.As(err, &se) || se.Ran || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ran=%v err=%v; want a StoreError wrapping the attempt's deadline", ran, err)
	}
	if _, err := idempotency.New(memStore(nil), idempotency.WithStoreTimeout(-1)); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("negative timeout: %v", err)
	}
}

func TestCanceledDuringBackoffMatchesContext(t *testing.T) {
	r, err := idempotency.New(downStore{memStore(nil)}, idempotency.WithStoreRetries(5, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errNetwork) {
		t.Fatalf("err = %v; want it to match both the context's error and the store's", err)
	}
}

// failCodec cannot encode strings, so a permanent error's message cannot
// be stored.
type failCodec struct{ idempotency.JSONCodec }

func (c failCodec) Marshal(v any) ([]byte, error) {
	if _, ok := v.(string); ok {
		return nil, errors.New("cannot encode strings")
	}
	return c.JSONCodec.Marshal(v)
}

func TestPermanentErrorWithUnstorableMessage(t *testing.T) {
	r, _, _ := newRunner(t, idempotency.WithCodec(failCodec{}))
	ctx := context.Background()
	_, _ = idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) {
		return 0, idempotency.Permanent(errors.New("card declined"))
	})
	_, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
	var se *idempotency.StoredError
	if !errors.As(err, &se) || errors.Is(err, idempotency.ErrResultNotStored) {
		t.Fatalf("err = %v; want a stored permanent error, not 'result not stored'", err)
	}
}

func TestSlowRenewalsThatSucceedKeepTheLease(t *testing.T) {
	// Each renewal takes a quarter of the lease, most of the store
	// timeout (a third of the lease, the longest allowed), but succeeds:
	// fn must not be stopped, since the lease is held all along. A lease of
	// 3 s leaves each renewal 250 ms of scheduling slack on a loaded
	// machine (1 s left 83 ms, which two busy cores exceeded).
	const lease = 3 * time.Second
	s := &renewStore{Store: memStore(nil), mode: "slow"}
	r, err := idempotency.New(s, idempotency.WithLease(lease), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	res, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) {
		select {
		case <-time.After(2 * lease):
			return 1, nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	})
	if err != nil || res.Value != 1 {
		t.Fatalf("%+v, %v: slow renewals cost the lease", res, err)
	}
}

func TestStepRefusesAfterLeaseLost(t *testing.T) {
	s := &renewStore{Store: memStore(nil), mode: "hang"}
	r, err := idempotency.New(s, idempotency.WithLease(300*time.Millisecond), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	var stepErr error
	_, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) {
		<-ctx.Done() // the renewal hangs, so fn is stopped
		_, stepErr = idempotency.Step(ctx, "charge", func(ctx context.Context) (int, error) {
			ran = true
			return 1, nil
		})
		return 0, stepErr
	})
	if ran || !errors.Is(stepErr, idempotency.ErrLeaseLost) || !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("step ran=%v, step err=%v, Do err=%v; want the step refused with ErrLeaseLost", ran, stepErr, err)
	}
}

func TestLeaseOutlivesCallerCancellation(t *testing.T) {
	// The caller gives up, fn finishes its effect anyway: the lease must
	// cover fn until it returns, so no retry takes over meanwhile.
	const lease = 300 * time.Millisecond
	r, err := idempotency.New(memStore(nil), idempotency.WithLease(lease), idempotency.WithUnsafeShortDurations())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) {
			close(started)
			time.Sleep(4 * lease) // finishing the charge, whatever the caller does
			return 1, nil
		})
		done <- err
	}()
	<-started
	cancel()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("first call: %v", err)
			}
			res, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { return 2, nil })
			if err != nil || !res.Replayed || res.Value != 1 {
				t.Fatalf("after: %+v, %v; want the first call's result", res, err)
			}
			return
		case <-time.After(lease / 3):
			_, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) {
				t.Error("a retry took over while fn was still running")
				return 2, nil
			})
			if !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("probe: %v, want ErrInProgress", err)
			}
		}
	}
}

// hangCompleteStore's Complete hangs until its context ends.
type hangCompleteStore struct{ idempotency.Store }

func (hangCompleteStore) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, ret time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestCompleteIsBoundedByTheLease(t *testing.T) {
	// No store timeout and a context that cannot be canceled: a hanging
	// Complete still ends when the lease would, with the effect reported
	// as having run.
	r, err := idempotency.New(hangCompleteStore{memStore(nil)}, idempotency.WithLease(200*time.Millisecond), idempotency.WithUnsafeShortDurations(), idempotency.WithStoreRetries(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
		done <- err
	}()
	select {
	case err := <-done:
		var se *idempotency.StoreError
		if !errors.As(err, &se) || !se.Ran || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want a StoreError with Ran and the lease's deadline", err)
		}
	case <-time.After(30 * time.Second): // far beyond the 200ms lease: it hangs
		t.Fatal("Do hung on a Complete that never returns")
	}
}

func TestHugeBackoffIsCapped(t *testing.T) {
	r, err := idempotency.New(downStore{memStore(nil)}, idempotency.WithStoreRetries(3, time.Duration(math.MaxInt64)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, errNetwork) {
		t.Fatalf("err = %v", err)
	}
}
