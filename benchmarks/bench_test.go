package benchmarks_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
)

// BenchmarkDo runs every workload on every backend, as
// BenchmarkDo/backend=NAME/op=WORKLOAD, so benchstat can compare backends:
//
//	go test -run '^$' -bench . -count 6 ./benchmarks/ | tee new.txt
//	benchstat -col /backend new.txt
//
// Besides ns/op and allocs/op, each reports roundtrips/op (0 for memory),
// and contended its outcomes per operation (acquired/op, replayed/op,
// inprogress/op). Parallel workloads run bench.Parallelism × GOMAXPROCS
// goroutines; their ns/op is wall time divided by operations.
func BenchmarkDo(b *testing.B) {
	for _, name := range bench.Backends {
		b.Run("backend="+name, func(b *testing.B) {
			be := open(b, name)
			for _, w := range bench.Workloads {
				b.Run("op="+w.Name, func(b *testing.B) {
					b.ReportAllocs()
					if err := w.Run(b, be); err != nil {
						b.Fatal(err)
					}
				})
			}
		})
	}
}

// open opens backend, failing when its server is not configured or
// unreachable (the error says how to get the server). It skips only a
// backend whose server script said none could be had (bench.ErrAbsent:
// MongoDB without a Docker daemon), which scripts/test.sh reports loudly.
func open(tb testing.TB, backend string) *bench.Backend {
	tb.Helper()
	be, err := bench.Open(context.Background(), backend)
	if errors.Is(err, bench.ErrAbsent) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := be.Close(); err != nil {
			tb.Errorf("closing %s: %v", backend, err)
		}
	})
	return be
}

// smokeN is how many operations each workload makes in the smoke test.
const smokeN = 50

// TestBackendsSmoke runs every workload once on every backend, with
// b.N = smokeN, so that CI proves the benchmarks run and measure what they
// claim: the round trips per operation, the outcomes of the contended
// workload, and that the records the store holds afterwards are as many as
// the distinct keys the workload means to use (spread over every node of a
// cluster).
func TestBackendsSmoke(t *testing.T) {
	setBenchtime(t, "50x")
	// roundtrips/op bounds: claim + complete for a fresh key, a claim for a
	// replay; the slack covers statements prepared on a new connection and
	// scripts loaded on a cluster node for the first time.
	trips := map[string][2]float64{
		"fresh":          {2, 3},
		"replay":         {1, 2},
		"parallel-fresh": {2, 3},
		"contended":      {1, 3},
	}
	// Distinct keys each workload writes in its measured part.
	keys := map[string]int{
		"fresh":          smokeN,
		"replay":         1,
		"parallel-fresh": smokeN,
		"contended":      bench.ContendedKeys(smokeN),
	}
	for _, name := range bench.Backends {
		t.Run(name, func(t *testing.T) {
			be := open(t, name)
			ctx := t.Context()
			for _, w := range bench.Workloads {
				t.Run(w.Name, func(t *testing.T) {
					warm0 := be.WarmUpRecords()
					before, counted, err := be.Records(ctx)
					if err != nil {
						t.Fatal(err)
					}
					var werr error
					res := testing.Benchmark(func(b *testing.B) {
						if err := w.Run(b, be); err != nil {
							werr = err
							b.FailNow()
						}
					})
					if werr != nil {
						t.Fatal(werr)
					}
					t.Logf("%s %v", res, res.Extra)
					if res.N != smokeN {
						t.Fatalf("ran %d operations, want %d", res.N, smokeN)
					}
					rt, ok := res.Extra["roundtrips/op"]
					switch {
					case !ok:
						t.Errorf("no roundtrips/op reported: %v", res.Extra)
					case name == bench.Memory && rt != 0:
						t.Errorf("memory store: %v roundtrips/op, want 0", rt)
					case name != bench.Memory && (rt < trips[w.Name][0] || rt > trips[w.Name][1]):
						t.Errorf("%v roundtrips/op, want %v to %v", rt, trips[w.Name][0], trips[w.Name][1])
					}
					if w.Name == "contended" {
						a, r, p := res.Extra["acquired/op"], res.Extra["replayed/op"], res.Extra["inprogress/op"]
						if want := float64(bench.ContendedKeys(smokeN)) / smokeN; a != want || r+p < 0.5 {
							t.Errorf("outcomes per op: acquired %v (want %v), replayed %v, in progress %v", a, want, r, p)
						}
					}
					if !counted {
						return // the memory store cannot count its records
					}
					after, _, err := be.Records(ctx)
					if err != nil {
						t.Fatal(err)
					}
					// Besides the records of the measured operations and of
					// the warm-ups, testing.Benchmark runs the workload once
					// with b.N = 1 first, which writes one more.
					var added int
					for node := range after {
						d := int(after[node] - before[node])
						added += d
						if name == bench.RedisCluster && w.Name != "replay" && d == 0 {
							t.Errorf("cluster node %s got no records (before %v, after %v): the keys do not spread", node, before, after)
						}
					}
					if name == bench.RedisCluster && len(after) != 3 {
						t.Errorf("records on %d cluster masters, want 3: %v", len(after), after)
					}
					warm := int(be.WarmUpRecords() - warm0)
					if want := keys[w.Name] + warm; added < want || added > want+2 {
						t.Errorf("%d records written, want %d (%d keys, %d warm-ups) plus at most 2", added, want, keys[w.Name], warm)
					}
				})
			}
		})
	}
}

// setBenchtime sets -test.benchtime, which testing.Benchmark follows, for
// the rest of the test.
func setBenchtime(t *testing.T, v string) {
	f := flag.Lookup("test.benchtime")
	if f == nil {
		t.Fatal("no -test.benchtime flag")
	}
	old := f.Value.String()
	if err := f.Value.Set(v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Value.Set(old) })
}

// TestResultSize checks that fn's result is the 200 bytes of JSON the
// figures are quoted for.
func TestResultSize(t *testing.T) {
	b, err := json.Marshal(bench.Result)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != bench.ResultSize {
		t.Fatalf("result encodes to %d bytes, want %d: %s", len(b), bench.ResultSize, b)
	}
}

// TestOpenRequiresServer checks that a backend without its server variable
// fails with a message saying how to get the server, rather than being
// skipped or dialling a default address.
func TestOpenRequiresServer(t *testing.T) {
	for _, name := range bench.Backends[1:] {
		t.Setenv(bench.Var(name), "")
		_, err := bench.Open(t.Context(), name)
		if !errors.Is(err, bench.ErrNotConfigured) || !strings.Contains(err.Error(), "run scripts/test.sh or set "+bench.Var(name)) {
			t.Errorf("Open(%s) without %s: %v", name, bench.Var(name), err)
		}
	}
}
