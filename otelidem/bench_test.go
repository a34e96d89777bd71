package otelidem_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/otelidem"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// cpuTime is the CPU time the process has used (user and system, every
// thread: the garbage collector's work counts).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ns/op: on a machine shared with other work, the
// process's CPU time per call varies far less than the wall time.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkObserver measures a fresh call of Do on the memory store (claim,
// fn, complete) and a replay (claim) with no observer, and with the
// Observer and its store wrapper recording metrics into the SDK: with
// tracing off, with every span sampled, and with none sampled. The
// observer's overhead is the difference from "none"; compare the runs
// interleaved (-count), and on a busy machine compare cpu-ns/op.
func BenchmarkObserver(b *testing.B) {
	ctx := context.Background()
	fp := idempotency.FingerprintBytes([]byte("body"))
	fn := func(ctx context.Context) (int, error) { return 1, nil }
	scope := []string{"acct", "POST /payments"}
	round := 0
	fresh := func(b *testing.B, r *idempotency.Runner) {
		round++ // the runner is kept across rounds: new keys for each
		ks := make([]string, b.N)
		for i := range ks {
			ks[i] = "key-" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu := cpuTime(b)
		for i := range b.N {
			res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: scope, Key: ks[i], Fingerprint: fp}, fn)
			if err != nil || res.Replayed {
				b.Fatal(res, err)
			}
		}
		reportCPU(b, cpu)
	}
	replay := func(b *testing.B, r *idempotency.Runner) {
		req := idempotency.Request{Scope: scope, Key: "k", Fingerprint: fp}
		if _, err := idempotency.Do(ctx, r, req, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu := cpuTime(b)
		for range b.N {
			res, err := idempotency.Do(ctx, r, req, fn)
			if err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		}
		reportCPU(b, cpu)
	}
	run := func(b *testing.B, r *idempotency.Runner) {
		b.Run("fresh", func(b *testing.B) { fresh(b, r) })
		b.Run("replay", func(b *testing.B) { replay(b, r) })
	}
	b.Run("none", func(b *testing.B) {
		r, err := idempotency.New(memStore(nil))
		if err != nil {
			b.Fatal(err)
		}
		run(b, r)
	})
	observed := func(b *testing.B, tp trace.TracerProvider) *idempotency.Runner {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		o, err := otelidem.New(&otelidem.Options{MeterProvider: mp, TracerProvider: tp, ScopeAttributes: []string{"", "http.route"}})
		if err != nil {
			b.Fatal(err)
		}
		r, err := idempotency.New(o.Store(memStore(nil)), idempotency.WithObserver(o))
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	b.Run("metrics", func(b *testing.B) {
		run(b, observed(b, noop.NewTracerProvider()))
	})
	b.Run("metrics+traces", func(b *testing.B) {
		run(b, observed(b, sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))))
	})
	// Traces on, but this call not sampled (as most calls are under a
	// ratio sampler).
	b.Run("metrics+unsampled", func(b *testing.B) {
		run(b, observed(b, sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))))
	})
}
