package benchmarks_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkEtcdStuck measures a full pass of Stuck (every page of 100,
// until the cursor is "") over a store that holds 10⁵ COMPLETED records
// and 100 stuck ones (STARTED, lease ended), and over one that also has
// 10⁴ live holders (STARTED, lease running), which the index lists and
// the pass must read and pass over. One op is one pass; roundtrips/op
// counts its unary calls and listed/op the records it listed (100). The
// records are written once per sub-benchmark through the store's own
// Claim and Complete from 32 goroutines (a few minutes on a quiet
// machine), and deleted after:
//
//	go test -run '^$' -bench EtcdStuck -benchtime 20x -timeout 30m ./benchmarks/
func BenchmarkEtcdStuck(b *testing.B) {
	eps := bench.Server(b, bench.Etcd)
	for _, w := range []struct{ completed, live int }{{1e5, 0}, {1e5, 1e4}} {
		b.Run(fmt.Sprintf("completed=%s/live=%d/stuck=100", power(w.completed), w.live), func(b *testing.B) {
			etcdStuck(b, strings.Split(eps, ","), w.completed, w.live, 100)
		})
	}
}

func etcdStuck(b *testing.B, endpoints []string, completed, live, stuck int) {
	var trips atomic.Int64
	c, err := bench.EtcdClient(endpoints, &trips)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prefix := "idem-stuck-" + bench.RandomHex(6) + "/"
	defer c.Delete(context.Background(), prefix, clientv3.WithPrefix())
	s, err := idemetcd.New(c, &idemetcd.Options{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	type job struct {
		key   string
		lease time.Duration
		done  bool
	}
	jobs := make(chan job)
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for j := range jobs {
				tok := idempotency.Token(bench.RandomHex(16))
				_, err := s.Claim(ctx, idempotency.ClaimRequest{Key: j.key, Fingerprint: "fp", Token: tok, Lease: j.lease, Grace: time.Hour})
				if err == nil && j.done {
					err = s.Complete(ctx, j.key, tok, []byte(strings.Repeat("r", bench.ResultSize)), time.Hour)
				}
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	// Stuck, live and completed keys interleave in key order.
	for i := range completed {
		jobs <- job{key: fmt.Sprintf("k%07d", i), lease: time.Hour, done: true}
		if i%(completed/stuck) == 0 {
			jobs <- job{key: fmt.Sprintf("k%07d-stuck", i), lease: time.Second}
		}
		if live > 0 && i%(completed/live) == 0 {
			jobs <- job{key: fmt.Sprintf("k%07d-live", i), lease: time.Hour}
		}
	}
	close(jobs)
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.Logf("wrote %d completed, %d live and %d stuck records in %v", completed, live, stuck, time.Since(start).Round(time.Second))
	time.Sleep(2500 * time.Millisecond) // the stuck ones' leases end

	// A sub-benchmark, so that the records above are written once while
	// the measured loop runs with growing b.N.
	b.Run("pass", func(b *testing.B) {
		before := trips.Load()
		listed := 0
		for range b.N {
			cursor := ""
			for {
				infos, next, err := s.Stuck(ctx, cursor, 100)
				if err != nil {
					b.Fatal(err)
				}
				listed += len(infos)
				if next == "" {
					break
				}
				cursor = next
			}
		}
		b.StopTimer()
		if listed != stuck*b.N {
			b.Fatalf("%d passes listed %d records, want %d each", b.N, listed, stuck)
		}
		b.ReportMetric(float64(trips.Load()-before)/float64(b.N), "roundtrips/op")
		b.ReportMetric(float64(listed)/float64(b.N), "listed/op")
	})
}
