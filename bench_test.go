package idempotency_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

type payment struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = "key-" + strconv.Itoa(i)
	}
	return ks
}

// BenchmarkDo measures Do on the memory store. Compare fresh with
// BenchmarkStoreDirect/claim+complete, which makes the same store calls
// without the core: the difference is the core's overhead.
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	fp := idempotency.FingerprintBytes([]byte("body"))
	fn := func(ctx context.Context) (payment, error) { return payment{ID: "ch_1", Amount: 100}, nil }
	b.Run("fresh", func(b *testing.B) {
		r, _ := idempotency.New(memStore(nil))
		ks := keys(b.N)
		scope := []string{"acct"}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: ks[i], Fingerprint: fp}, fn)
			if err != nil || res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		r, _ := idempotency.New(memStore(nil))
		req := idempotency.Request{Scope: []string{"acct"}, Key: "k", Fingerprint: fp}
		if _, err := idempotency.Do(ctx, r, req, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			res, err := idempotency.Do(ctx, r, req, fn)
			if err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
}

// BenchmarkStoreDirect is the baseline: the memory store's own cost for
// what a fresh Do asks of it (a claim and a complete) and for a replay (a
// claim), with keys, token and result prepared outside the loop.
func BenchmarkStoreDirect(b *testing.B) {
	ctx := context.Background()
	fp := idempotency.FingerprintBytes([]byte("body"))
	result := []byte(`v{"id":"ch_1","amount":100}`)
	b.Run("claim+complete", func(b *testing.B) {
		s := memStore(nil)
		ks := make([]string, b.N)
		for i, k := range keys(b.N) {
			ks[i], _ = idempotency.StorageKey([]string{"acct"}, k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			cr, err := s.Claim(ctx, idempotency.ClaimRequest{Key: ks[i], Fingerprint: fp, Token: "0123456789abcdef0123456789abcdef", Lease: idempotency.DefaultLease, Grace: idempotency.DefaultRetention})
			if err != nil || cr.Outcome != idempotency.OutcomeAcquired {
				b.Fatal(cr, err)
			}
			if err := s.Complete(ctx, ks[i], "0123456789abcdef0123456789abcdef", result, idempotency.DefaultRetention); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("claim-replay", func(b *testing.B) {
		s := memStore(nil)
		key, _ := idempotency.StorageKey([]string{"acct"}, "k")
		s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: "t", Lease: idempotency.DefaultLease})
		s.Complete(ctx, key, "t", result, idempotency.DefaultRetention)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			cr, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: "u", Lease: idempotency.DefaultLease})
			if err != nil || cr.Outcome != idempotency.OutcomeReplay {
				b.Fatal(cr, err)
			}
		}
	})
}

// nopStore answers instantly without keeping anything, so a benchmark on
// it measures the core alone: key encoding, token, contexts, heartbeat
// timer, codec and result framing.
type nopStore struct{ replay []byte }

func (s nopStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if s.replay != nil {
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeReplay, Fence: 1, Attempt: 1, Result: s.replay}, nil
	}
	return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: 1, Attempt: 1}, nil
}
func (nopStore) Renew(context.Context, string, idempotency.Token, time.Duration) error { return nil }
func (nopStore) Checkpoint(context.Context, string, idempotency.Token, string, []byte) error {
	return nil
}
func (nopStore) Complete(context.Context, string, idempotency.Token, []byte, time.Duration) error {
	return nil
}
func (nopStore) Release(context.Context, string, idempotency.Token) error { return nil }

// BenchmarkCoreOverhead is Do on a store that costs nothing: the core's
// own overhead per call, which the issue bounds at 1µs and 10 allocations
// for a fresh call.
func BenchmarkCoreOverhead(b *testing.B) {
	ctx := context.Background()
	req := idempotency.Request{Scope: []string{"acct"}, Key: "k", Fingerprint: idempotency.FingerprintBytes([]byte("body"))}
	fn := func(ctx context.Context) (payment, error) { return payment{ID: "ch_1", Amount: 100}, nil }
	b.Run("fresh", func(b *testing.B) {
		r, _ := idempotency.New(nopStore{})
		b.ReportAllocs()
		for b.Loop() {
			if res, err := idempotency.Do(ctx, r, req, fn); err != nil || res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		r, _ := idempotency.New(nopStore{replay: []byte(`v{"id":"ch_1","amount":100}`)})
		b.ReportAllocs()
		for b.Loop() {
			if res, err := idempotency.Do(ctx, r, req, fn); err != nil || !res.Replayed || res.Value.ID != "ch_1" {
				b.Fatal(res, err)
			}
		}
	})
}
