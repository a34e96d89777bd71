package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// floorStore is a memory store that declares a minimum lease, as a store
// with whole-second leases (etcd) does.
type floorStore struct{ *memory.Store }

func (f floorStore) Capabilities() idempotency.Capabilities {
	c := f.Store.Capabilities()
	c.Limits.MinLease = 2 * time.Second
	return c
}

// TestNewRefusesConfigurationsThatRunFnTwice: every configuration under
// which fn could run again for one request because of the configuration
// alone is refused by New, with an error that names the option and the
// value it got.
func TestNewRefusesConfigurationsThatRunFnTwice(t *testing.T) {
	s := memStore(nil)
	for _, c := range []struct {
		name  string
		store idempotency.Store
		opts  []idempotency.Option
		want  string // in the error message
	}{
		{"lease with its unit missed", s, opts(idempotency.WithLease(30)), "WithLease(30ns)"},
		{"lease below MinLease", s, opts(idempotency.WithLease(500 * time.Millisecond)), "WithLease(500ms) is shorter than 1s"},
		{"lease below the store's minimum", floorStore{s}, opts(idempotency.WithLease(1500 * time.Millisecond)), "store's minimum lease, 2s"},
		{"store minimum is not lifted by the unsafe option", floorStore{s}, opts(idempotency.WithLease(time.Second), idempotency.WithUnsafeShortDurations()), "WithLease(1s)"},
		{"zero lease", s, opts(idempotency.WithLease(0)), "WithLease(0s)"},
		{"negative lease", s, opts(idempotency.WithLease(-time.Second)), "WithLease(-1s)"},
		{"retention with its unit missed", s, opts(idempotency.WithRetention(24)), "WithRetention(24ns)"},
		{"retention below MinRetention", s, opts(idempotency.WithRetention(30 * time.Second)), "WithRetention(30s) is shorter than 1m0s"},
		{"retention shorter than the lease", s, opts(idempotency.WithLease(2*time.Minute), idempotency.WithRetention(time.Minute)), "WithRetention(1m0s) is shorter than the lease"},
		{"retention shorter than the lease, unsafe", s, opts(idempotency.WithLease(time.Second), idempotency.WithRetention(500*time.Millisecond), idempotency.WithUnsafeShortDurations()), "WithRetention(500ms) is shorter than the lease"},
		{"zero retention", s, opts(idempotency.WithRetention(0)), "WithRetention(0s)"},
		{"store timeout with its unit missed", s, opts(idempotency.WithStoreTimeout(500)), "WithStoreTimeout(500ns)"},
		{"zero store timeout", s, opts(idempotency.WithStoreTimeout(0)), "WithStoreTimeout(0s)"},
		{"negative store timeout", s, opts(idempotency.WithStoreTimeout(-1)), "WithStoreTimeout(-1ns)"},
		{"store timeout beyond a third of the lease", s, opts(idempotency.WithStoreTimeout(11 * time.Second)), "WithStoreTimeout(11s) does not fit in the lease (WithLease, 30s)"},
		{"store timeout beyond a third of a short lease", s, opts(idempotency.WithLease(3*time.Second), idempotency.WithStoreTimeout(2*time.Second)), "WithStoreTimeout(2s) does not fit"},
		{"negative grace", s, opts(idempotency.WithGrace(-1)), "WithGrace(-1ns)"},
		{"negative wait", s, opts(idempotency.WithWait(-1)), "WithWait(-1ns)"},
		{"nil codec", s, opts(idempotency.WithCodec(nil)), "WithCodec(nil)"},
		{"nil error policy", s, opts(idempotency.WithErrorPolicy(nil)), "WithErrorPolicy(nil)"},
		{"zero key length", s, opts(idempotency.WithMaxKeyLength(0)), "WithMaxKeyLength(0)"},
		{"zero result size", s, opts(idempotency.WithMaxResultSize(0)), "WithMaxResultSize(0)"},
		{"zero store attempts", s, opts(idempotency.WithStoreRetries(0, time.Millisecond)), "WithStoreRetries(0, 1ms)"},
		{"negative store backoff", s, opts(idempotency.WithStoreRetries(3, -1)), "WithStoreRetries(3, -1ns)"},
		{"nil option", s, opts(nil), "nil option"},
		{"nil store", nil, nil, "nil store"},
		{"typed nil store", (*memory.Store)(nil), nil, "nil store (*memory.Store)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := idempotency.New(c.store, c.opts...)
			if !errors.Is(err, idempotency.ErrInvalidArgument) || r != nil {
				t.Fatalf("New = %v, %v; want ErrInvalidArgument", r, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

func opts(o ...idempotency.Option) []idempotency.Option { return o }

// TestNewAcceptsSafeConfigurations: the floors are not in the way of
// sensible settings, and the unsafe option lifts exactly the floors.
func TestNewAcceptsSafeConfigurations(t *testing.T) {
	s := memStore(nil)
	for _, o := range [][]idempotency.Option{
		nil,
		opts(idempotency.WithLease(idempotency.MinLease)),
		opts(idempotency.WithLease(idempotency.MinLease), idempotency.WithRetention(idempotency.MinRetention)),
		opts(idempotency.WithStoreTimeout(idempotency.MinStoreTimeout)),
		opts(idempotency.WithStoreTimeout(idempotency.DefaultLease / 3)),
		opts(idempotency.WithLease(3*time.Second), idempotency.WithStoreTimeout(time.Second)),
		opts(idempotency.WithLease(150*time.Millisecond), idempotency.WithRetention(time.Second), idempotency.WithStoreTimeout(time.Millisecond), idempotency.WithUnsafeShortDurations()),
		opts(idempotency.WithLease(2*time.Second), idempotency.WithRetention(time.Minute)),
	} {
		if _, err := idempotency.New(s, o...); err != nil {
			t.Errorf("New: %v", err)
		}
	}
	if _, err := idempotency.New(floorStore{s}, idempotency.WithLease(2*time.Second)); err != nil {
		t.Errorf("New at the store's minimum lease: %v", err)
	}
}

// TestLeaseTypoRunsFnOnce is the day-one report: WithLease(30) meant 30
// seconds. It is refused, so no runner exists that could run fn three
// times for three calls with one key; the same calls on the runner the
// user meant run fn once.
func TestLeaseTypoRunsFnOnce(t *testing.T) {
	s := memStore(nil)
	if _, err := idempotency.New(s, idempotency.WithLease(30)); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("WithLease(30) accepted: %v", err)
	}
	r, err := idempotency.New(s, idempotency.WithLease(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	for range 3 {
		_, err := idempotency.Do(context.Background(), r, req("typo"), func(ctx context.Context) (int, error) {
			runs.Add(1)
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times", n)
	}
}

// TestDefaultStoreTimeoutBoundsAHangingStore: with no option set, a store
// that never answers fails the call with a *StoreError in bounded time
// (three attempts of DefaultStoreTimeout), instead of hanging.
func TestDefaultStoreTimeoutBoundsAHangingStore(t *testing.T) {
	t.Parallel()
	r, err := idempotency.New(hangStore{memStore(nil)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ran := false
	_, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	took := time.Since(start)
	var se *idempotency.StoreError
	if ran || !errors.As(err, &se) || se.Ran || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ran=%v err=%v; want a StoreError wrapping the attempt's deadline", ran, err)
	}
	want := idempotency.DefaultStoreAttempts * idempotency.DefaultStoreTimeout
	if took < want || took > 2*want+5*time.Second {
		t.Fatalf("took %v; want about %v (%d attempts of %v)", took, want, idempotency.DefaultStoreAttempts, idempotency.DefaultStoreTimeout)
	}
}

// TestDefaultStoreTimeoutFitsAShortLease: without WithStoreTimeout, the
// timeout is a third of the lease when that is shorter than the default,
// so that the default never breaks the rule an explicit one must keep.
func TestDefaultStoreTimeoutFitsAShortLease(t *testing.T) {
	t.Parallel()
	r, err := idempotency.New(hangStore{memStore(nil)}, idempotency.WithLease(300*time.Millisecond), idempotency.WithUnsafeShortDurations(), idempotency.WithStoreRetries(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = idempotency.Do(context.Background(), r, req("k"), func(ctx context.Context) (int, error) { return 1, nil })
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took < 100*time.Millisecond || took > 2*time.Second {
		t.Fatalf("took %v, err %v; want the attempt to time out after a third of the lease (100ms)", took, err)
	}
}

// TestEventsCarryTheScope: observers get the request's scope parts, so
// they can label metrics by route without parsing storage keys.
func TestEventsCarryTheScope(t *testing.T) {
	var got [][]string
	obs := idempotency.ObserverFunc(func(ctx context.Context, e idempotency.Event) {
		got = append(got, e.Scope)
	})
	r, err := idempotency.New(memStore(nil), idempotency.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	rq := req("scoped")
	for range 2 {
		if _, err := idempotency.Do(context.Background(), r, rq, func(ctx context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 3 { // acquired, completed, replayed
		t.Fatalf("%d events, want 3", len(got))
	}
	for _, sc := range got {
		if len(sc) != 2 || sc[0] != rq.Scope[0] || sc[1] != rq.Scope[1] {
			t.Fatalf("event scope = %q, want %q", sc, rq.Scope)
		}
	}
}
