package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// sampleBench is go test -bench output with two runs of each comparison,
// including a Redis floor and a Redis Cluster scale run, which no file of
// benchmarks/ defines here: the report finds them by name alone.
const sampleBench = `goos: linux
BenchmarkPostgresFloor/op=fresh/callers=1-2         	    1000	    400000 ns/op	         0.8000 ratio	    320000 raw-ns/op	    328000 json-ns/op	         0.8200 json-ratio	         2.000 roundtrips/op
BenchmarkPostgresFloor/op=fresh/callers=1-2         	    1000	    380000 ns/op	         0.9000 ratio	    342000 raw-ns/op	    353400 json-ns/op	         0.9300 json-ratio	         2.000 roundtrips/op
BenchmarkRedisFloor/op=replay/callers=16-2          	    3000	     50000 ns/op	         0.9500 ratio	     47500 raw-ns/op	         1.000 roundtrips/op
BenchmarkRedisFloor/op=replay/callers=16-2          	    3000	     60000 ns/op	         0.8500 ratio	     51000 raw-ns/op	         1.000 roundtrips/op
BenchmarkPostgresScale/records=1e6/op=fresh/callers=16-2   	 3000	 200000 ns/op	 560.0 bytes/record	 180000 empty-ns/op	 0.9000 ratio	 2.000 roundtrips/op
BenchmarkRedisClusterScale/records=1e5/op=replay/callers=16-2   	 3000	 60000 ns/op	 300.0 bytes/record	 57000 empty-ns/op	 0.9500 ratio	 1.000 roundtrips/op
BenchmarkRedisScale/records=0/op=fresh/callers=16-2   	 2000	 100000 ns/op	 0.5000 ratio	 50000 raw-ns/op	 2.015 roundtrips/op
BenchmarkRedisScale/records=1e6/op=fresh/callers=16-2   	 2000	 110000 ns/op	 1040 bytes/record	 0.4500 ratio	 49500 raw-ns/op	 2.015 roundtrips/op
BenchmarkPostgresScale/sweep=1e6/callers=16-2   	       1	 41000000000 ns/op	 3.000 p99-base-ms	 4.500 p99-sweep-ms	 1.500 p99-ratio	 1000001 swept
BenchmarkPostgresScale/stuck=1e6/callers=16-2   	       1	 2500000000 ns/op	 3.000 p99-base-ms	 3.300 p99-stuck-ms	 1.100 p99-ratio	 101 pages
--- BENCH: BenchmarkPostgresScale/records=1e6/op=fresh/callers=16-2
    postgres_scale_test.go:123: preloaded 1000001 records
PASS
`

func TestComparisons(t *testing.T) {
	names, runs, err := parseBench(strings.NewReader(sampleBench))
	if err != nil {
		t.Fatal(err)
	}
	c := collect(names, runs)
	if len(c.floors) != 2 || len(c.scales) != 4 || len(c.passes) != 2 {
		t.Fatalf("found %d floors, %d scales, %d passes, want 2, 4, 2", len(c.floors), len(c.scales), len(c.passes))
	}
	if f := c.floors[0]; f.backend != "postgres" || f.runs != 2 || math.Abs(f.ratio.med-0.85) > 1e-9 || f.ratio.lo != 0.8 || f.ratio.hi != 0.9 || f.do.med != 390000 {
		t.Errorf("postgres floor: %+v", f)
	}
	var b bytes.Buffer
	writeComparisons(&b, c)
	out := b.String()
	for _, want := range []string{
		"| postgres | fresh | 1 | 390 µs | 331 µs | **0.85** (0.80–0.90) | 341 µs | **0.88** (0.82–0.93) | 0.90 | 2.00 |",
		"| redis | replay | 16 | 55 µs | 49 µs | **0.90** (0.85–0.95) | – | – | 0.90 | 1.00 |",
		"| postgres | 1e6 | fresh | 16 | 200 µs | 180 µs | **0.90** | 560 |",
		"| redis-cluster | 1e5 | replay | 16 |",
		"| postgres | sweep | 1e6 | 16 | 41.0 s | 3.00 ms | 4.50 ms | **1.50** |",
		"| postgres | stuck | 1e6 | 16 | 2.50 s | 3.00 ms | 3.30 ms | **1.10** |",
		"against a raw floor on the same server",
		"| redis | 0 | fresh | 16 | 100 µs | 50 µs | **0.50** | 0 |",
		"| redis | 1e6 | fresh | 16 | 110 µs | 50 µs | **0.45** | 1040 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison tables lack %q:\n%s", want, out)
		}
	}

	svg := chart(testRows, c, environment(time.Second, 2))
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v\n%s", err, svg)
		}
	}
	for _, want := range []string{"postgres fresh, 1 caller(s): Do vs raw floor", "postgres fresh, 1 caller(s): Do vs JSON floor", "redis-cluster replay, 1e5 records: loaded vs empty", "redis fresh, 1e6 records: Do vs raw floor", ">0.85<", "Ratios to a baseline"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if only := chart(nil, c, "env"); !strings.Contains(only, ">env<") || strings.Contains(only, "throughput by backend") {
		t.Errorf("chart of comparisons alone: no environment line, or a throughput panel")
	}
}

func TestBackendName(t *testing.T) {
	for in, want := range map[string]string{"Postgres": "postgres", "RedisCluster": "redis-cluster", "Etcd": "etcd"} {
		if got := backendName(in); got != want {
			t.Errorf("backendName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFloorTargets checks the targets of issue 23, against the raw floor.
func TestFloorTargets(t *testing.T) {
	for _, c := range []struct {
		backend, workload string
		callers           int
		want              float64
	}{
		{"postgres", "fresh", 1, 0.9}, {"postgres", "fresh", 16, 0.85},
		{"postgres", "replay", 1, 0.85}, {"postgres", "replay", 16, 0.85},
		{"redis", "fresh", 1, 0.9}, {"redis", "fresh", 16, 0.85}, {"redis", "replay", 16, 0.9},
		{"etcd", "fresh", 16, 0.9},
	} {
		if got := (floorRow{backend: c.backend, workload: c.workload, callers: c.callers}).target(); got != c.want {
			t.Errorf("target of %s %s from %d: %v, want %v", c.backend, c.workload, c.callers, got, c.want)
		}
	}
}
