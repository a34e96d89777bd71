package benchmarks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
)

// BenchmarkReplayCache compares replays of completed keys answered by the
// runner's replay cache (idempotency.WithReplayCache) with replays the
// store answers (one round trip each), on every backend, from 1 and 16
// callers, in alternating chunks: ns/op is the cached replay's,
// uncached-ns/op the store's, ratio = uncached-ns/op ÷ ns/op, and
// roundtrips/op the cached replays' (0: none reached the store).
//
//	go test -run '^$' -bench ReplayCache -benchtime 20000x ./benchmarks/
func BenchmarkReplayCache(b *testing.B) {
	for _, name := range bench.Backends {
		b.Run("backend="+name, func(b *testing.B) {
			be := open(b, name)
			store := be.Store()
			cached, err := idempotency.New(store, idempotency.WithReplayCache(64<<20, time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			plain, err := idempotency.New(store)
			if err != nil {
				b.Fatal(err)
			}
			for _, callers := range []int{1, 16} {
				b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
					ctx := context.Background()
					prefix := bench.RandomHex(4)
					// Each runner completes its own keys: the cached one
					// keeps what it completed (a replay the store answers
					// is cached only when the store says when the record
					// expires).
					req := func(r string, g int) idempotency.Request {
						return idempotency.Request{Scope: []string{"bench", r}, Key: prefix + bench.HotKey(g)}
					}
					fn := func(context.Context) (bench.Payment, error) { return bench.Payment{ID: "pay_1", Amount: 1000}, nil }
					bench.Warm(callers, func(g int) error {
						if _, err := idempotency.Do(ctx, plain, req("plain", g), fn); err != nil {
							return err
						}
						_, err := idempotency.Do(ctx, cached, req("cached", g), fn)
						return err
					}, b.Fatal)
					replay := func(r *idempotency.Runner, name string) func(g, i int) error {
						return func(g, _ int) error {
							res, err := idempotency.Do(ctx, r, req(name, g), fn)
							if err == nil && !res.Replayed {
								err = fmt.Errorf("key %s was not replayed", req(name, g).Key)
							}
							return err
						}
					}
					bench.Compare(b, callers, be.Trips(), "uncached", replay(cached, "cached"), replay(plain, "plain"))
				})
			}
		})
	}
}
