package benchmarks_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	"github.com/exactlyonce/idempotency/inbox"
)

// BenchmarkInboxBatch measures the inbox's throughput, one consumer on one
// goroutine, with [inbox.Inbox.HandleBatch] against [inbox.Inbox.Handle]
// message by message (issue 27), on PostgreSQL, Redis and etcd: each
// iteration hands HandleBatch one batch of size fresh messages and Handle
// as many others, one at a time, alternating which goes first, so that
// both see the same load. The messages carry a 200-byte payload (which
// the inbox fingerprints) and the handler only counts its effects; the
// benchmark fails unless every message was handled exactly once (its
// disposition Ack, not a duplicate, one effect).
//
// Metrics: msgs/s is HandleBatch's rate, handle-msgs/s Handle's, speedup
// their ratio (the target of issue 27 is 10 or more at size 100 on
// PostgreSQL and on Redis); roundtrips/msg and handle-roundtrips/msg count
// the store's round trips per message (queries, prepares and batches for
// PostgreSQL; commands and pipelines for Redis; unary calls for etcd),
// lease grants included. A store without a Batcher (PostgreSQL, until it
// has one) gets DoBatch's fallback of one call per item: its speedup is
// about 1.
//
//	go test -run '^$' -bench InboxBatch -benchtime 3x ./benchmarks/
func BenchmarkInboxBatch(b *testing.B) {
	for _, backend := range []string{bench.Postgres, bench.Redis, bench.Etcd} {
		b.Run("backend="+backend, func(b *testing.B) {
			be, err := bench.Open(context.Background(), backend)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = be.Close() })
			for _, size := range []int{1, 10, 100, 1000} {
				b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) { inboxBatch(b, be, size) })
			}
		})
	}
}

func inboxBatch(b *testing.B, be *bench.Backend, size int) {
	ctx := context.Background()
	r, err := idempotency.New(be.Store(), idempotency.WithRetention(bench.Retention))
	if err != nil {
		b.Fatal(err)
	}
	in, err := inbox.New(r, "bench-consumer")
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(strings.Repeat("p", bench.ResultSize))
	run := bench.RandomHex(4)
	messages := func(tag string, n int) []inbox.Message {
		msgs := make([]inbox.Message, size)
		for i := range msgs {
			msgs[i] = inbox.Message{Source: "orders", ID: fmt.Sprintf("%s-%s-%d-%d", run, tag, n, i), Payload: payload}
		}
		return msgs
	}
	var effects atomic.Int64
	trips := be.Trips()
	batch := func(msgs []inbox.Message) (time.Duration, int64) {
		t0, n0 := time.Now(), trips.Load()
		ds := in.HandleBatch(ctx, msgs, func(context.Context, int) error { effects.Add(1); return nil })
		took, n := time.Since(t0), trips.Load()-n0
		for i, d := range ds {
			if d.Err != nil || d.Disposition != inbox.Ack || d.Duplicate {
				b.Fatalf("HandleBatch message %d: %+v", i, d)
			}
		}
		return took, n
	}
	single := func(msgs []inbox.Message) (time.Duration, int64) {
		t0, n0 := time.Now(), trips.Load()
		for i, m := range msgs {
			d, err := in.Handle(ctx, m, func(context.Context) error { effects.Add(1); return nil })
			if err != nil || d.Disposition != inbox.Ack || d.Duplicate {
				b.Fatalf("Handle message %d: %+v", i, d)
			}
		}
		return time.Since(t0), trips.Load() - n0
	}
	// Warm-up: connections, scripts, the leases the store shares.
	batch(messages("warm-batch", 0))
	single(messages("warm-single", 0))
	effects.Store(0)
	var batchTime, singleTime time.Duration
	var batchTrips, singleTrips int64
	b.ResetTimer()
	for n := range b.N {
		bm, sm := messages("batch", n), messages("single", n)
		if n%2 == 1 {
			d, t := single(sm)
			singleTime, singleTrips = singleTime+d, singleTrips+t
		}
		d, t := batch(bm)
		batchTime, batchTrips = batchTime+d, batchTrips+t
		if n%2 == 0 {
			d, t := single(sm)
			singleTime, singleTrips = singleTime+d, singleTrips+t
		}
	}
	b.StopTimer()
	msgs := float64(b.N * size)
	if got := effects.Load(); got != int64(2*b.N*size) {
		b.Fatalf("%d effects for %d messages", got, 2*b.N*size)
	}
	b.ReportMetric(float64(batchTime.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(msgs/batchTime.Seconds(), "msgs/s")
	b.ReportMetric(msgs/singleTime.Seconds(), "handle-msgs/s")
	b.ReportMetric(float64(singleTime)/float64(batchTime), "speedup")
	b.ReportMetric(float64(batchTrips)/msgs, "roundtrips/msg")
	b.ReportMetric(float64(singleTrips)/msgs, "handle-roundtrips/msg")
}
