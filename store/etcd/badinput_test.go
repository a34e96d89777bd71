package etcd_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// clientOf returns a client of addr, which need not answer.
func clientOf(t *testing.T, addr string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// storeTimeout is the runner's bound on each store call in these tests;
// with the default three attempts and their backoff a call that never
// answers fails in about 3×storeTimeout.
const storeTimeout = 500 * time.Millisecond

// bound is what a caller may wait in these tests: every attempt of the
// store call timing out, the backoffs between them, and a margin for a
// loaded machine.
const bound = 3*storeTimeout + 2*time.Second

func runnerOn(t *testing.T, s idempotency.Store) *idempotency.Runner {
	t.Helper()
	r, err := idempotency.New(s, idempotency.WithLease(3*time.Second), idempotency.WithStoreTimeout(storeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestClosedPort: a server that is not there gives a *StoreError (Ran
// false, fn not run) within the store timeout's bound, never a hang.
func TestClosedPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s, err := idemetcd.New(clientOf(t, addr), &idemetcd.Options{MinLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := runnerOn(t, s)
	start := time.Now()
	ran := false
	_, err = idempotency.Do(t.Context(), r, idempotency.Request{Scope: []string{"t"}, Key: "k", Fingerprint: fp},
		func(context.Context) (int, error) { ran = true; return 1, nil })
	took := time.Since(start)
	var se *idempotency.StoreError
	if !errors.As(err, &se) || se.Ran || ran {
		t.Fatalf("Do on a closed port: %v (ran %v), want a *StoreError with Ran false", err, ran)
	}
	if took > bound {
		t.Errorf("Do on a closed port took %v, want at most %v", took, bound)
	}
	t.Logf("closed port: %v after %v", err, took.Round(time.Millisecond))
}

// TestMemberHangs: a member that accepts connections and never answers
// fails Do within the bound; when it hangs after the claim, Do reports
// Ran true, and once it answers again a retry after the lease takes the
// record over (fn's effect may have happened: the caller was told).
func TestMemberHangs(t *testing.T) {
	p := newProxy(t, endpoints(t)[0])
	s := newStore(t, clientOf(t, p.Addr()), &idemetcd.Options{MinLease: time.Second})
	r := runnerOn(t, s)
	ctx := t.Context()
	req := idempotency.Request{Scope: []string{"t"}, Key: "k", Fingerprint: fp}

	start := time.Now()
	_, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) {
		p.hang.Store(true) // the member stops answering while fn runs
		return 1, nil
	})
	took := time.Since(start)
	var se *idempotency.StoreError
	if !errors.As(err, &se) || !se.Ran || se.Op != "complete" {
		t.Fatalf("Do whose completion hangs: %v, want a *StoreError from complete with Ran true", err)
	}
	if took > bound {
		t.Errorf("Do whose completion hangs took %v, want at most %v", took, bound)
	}
	t.Logf("hang after the claim: %v after %v", err, took.Round(time.Millisecond))

	start = time.Now()
	ran := false
	_, err = idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"t"}, Key: "other", Fingerprint: fp},
		func(context.Context) (int, error) { ran = true; return 1, nil })
	took = time.Since(start)
	if !errors.As(err, &se) || se.Ran || ran {
		t.Fatalf("Do on a hanging member: %v (ran %v), want a *StoreError with Ran false", err, ran)
	}
	if took > bound {
		t.Errorf("Do on a hanging member took %v, want at most %v", took, bound)
	}
	t.Logf("hang before the claim: %v after %v", err, took.Round(time.Millisecond))
}

// TestLostReply: a reply lost after the server applied the claim or the
// completion is an error, the core repeats the call with the same token,
// and fn runs once.
func TestLostReply(t *testing.T) {
	p := newProxy(t, endpoints(t)[0])
	s := newStore(t, clientOf(t, p.Addr()), nil)
	r, err := idempotency.New(s, idempotency.WithStoreTimeout(2*time.Second), idempotency.WithStoreRetries(5, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i, when := range []string{"claim", "complete"} {
		req := idempotency.Request{Scope: []string{"t"}, Key: when, Fingerprint: fp}
		runs := 0
		if i == 0 {
			p.dropReplies.Store(true)
		}
		res, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) {
			runs++
			if i == 1 {
				p.dropReplies.Store(true)
			}
			return 42, nil
		})
		if err != nil || res.Value != 42 || runs != 1 {
			t.Errorf("Do with the %s's reply lost: %v %v, fn ran %d times; want 42, once", when, res, err, runs)
		}
		res, err = idempotency.Do(ctx, r, req, func(context.Context) (int, error) { runs++; return 0, nil })
		if err != nil || !res.Replayed || res.Value != 42 || runs != 1 {
			t.Errorf("retry after the %s's reply was lost: %+v %v, fn ran %d times; want a replay of 42", when, res, err, runs)
		}
	}
}

// TestResultLimits: a result exactly at MaxValueSize is kept and replayed,
// one byte more gets ErrTooLarge with nothing written; a store configured
// above the server's request limit (1.5 MiB) gets ErrTooLarge from the
// server, also with nothing written.
func TestResultLimits(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	for _, limit := range []int{idemetcd.DefaultMaxValueSize, 4 << 20} {
		s := newStore(t, c, &idemetcd.Options{MaxValueSize: limit})
		for _, size := range []int{limit, limit + 1, 1600 << 10} {
			if size > limit+1 && limit == idemetcd.DefaultMaxValueSize {
				continue
			}
			key := "k" + strings.Repeat("x", size%7)
			tk := tok("a")
			claim(t, s, key, tk, time.Minute, time.Minute)
			err := s.Complete(ctx, key, tk, make([]byte, size), time.Minute)
			switch {
			case size <= limit && size < 1500<<10:
				if err != nil {
					t.Errorf("Complete of %d bytes under MaxValueSize %d: %v", size, limit, err)
				}
			case !errors.Is(err, idempotency.ErrTooLarge):
				t.Errorf("Complete of %d bytes (MaxValueSize %d): %v, want ErrTooLarge", size, limit, err)
			default:
				// Nothing written: still STARTED under the holder.
				if res := claim(t, s, key, tk, time.Minute, time.Minute); res.Outcome != idempotency.OutcomeAcquired {
					t.Errorf("after a refused Complete of %d bytes: %v, want the holder's repeat", size, res.Outcome)
				}
				t.Logf("Complete of %d bytes (MaxValueSize %d): %v", size, limit, err)
			}
			_ = s.Release(ctx, key, tk)
		}
	}
}

// TestOddKeys: storage keys at the maximum length, built from binary and
// unicode scope parts, are distinct records.
func TestOddKeys(t *testing.T) {
	s := newStore(t, newClient(t), nil)
	r, err := idempotency.New(s, idempotency.WithMaxKeyLength(idempotency.MaxStorageKeyLen/2))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	scopes := [][]string{
		{"ключ", "鍵", "🔑"},
		{"\u00e9"}, {"e\u0301"},
		{strings.Repeat("s", 200), strings.Repeat("é", 100)},
		{"a\x7fb"},
	}
	longKey := strings.Repeat("k", idempotency.MaxStorageKeyLen/2)
	for i, sc := range scopes {
		for _, key := range []string{"k", longKey} {
			req := idempotency.Request{Scope: sc, Key: key, Fingerprint: fp}
			sk, err := r.StorageKey(req)
			if err != nil {
				if errors.Is(err, idempotency.ErrInvalidKey) {
					continue // refused before any store call, as documented
				}
				t.Fatal(err)
			}
			res, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) { return i, nil })
			if err != nil || res.Value != i {
				t.Errorf("scope %q key of %d bytes (storage key %d bytes): %v %v", sc, len(key), len(sk), res, err)
			}
		}
	}
	for i, sc := range scopes {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: sc, Key: "k", Fingerprint: fp}, func(context.Context) (int, error) { return -1, nil })
		if err == nil && (!res.Replayed || res.Value != i) {
			t.Errorf("scope %q: %+v, want a replay of %d", sc, res, i)
		}
	}
}
