package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// The comparison benchmarks of benchmarks/ that the report reads, by
// naming convention, so that a new backend's benchmark slots in by its
// name alone:
//
//   - BenchmarkXxxFloor/op=OP/callers=N: Do against a raw floor of the
//     same round trips (metrics ns/op, raw-ns/op, ratio, roundtrips/op),
//     and against the JSON floor, the raw floor plus the encoding or
//     decoding of the value every caller of a raw driver does
//     (json-ns/op, json-ratio), when the benchmark reports it;
//   - BenchmarkXxxScale/records=1eK/op=OP/callers=N: Do on a store that
//     holds 10^K live records against an empty one (ns/op, empty-ns/op,
//     ratio, bytes/record); or, when the benchmark reports raw-ns/op
//     instead of empty-ns/op, Do on that store against a raw floor on the
//     same server (a backend whose absolute times drift between runs is
//     compared with its floor at each size, records=0 included);
//   - BenchmarkXxxScale/PASS=1eK/callers=N, PASS sweep or stuck: claims
//     beside an operator's pass over 10^K records, a sweep of expired ones
//     or a Stuck listing of live ones (ns/op: the pass; p99-base-ms,
//     p99-PASS-ms, p99-ratio).
//
// Xxx names the backend in CamelCase: Postgres, Redis, RedisCluster, Etcd,
// Mongo become postgres, redis, redis-cluster, etcd, mongo.
var (
	floorName = regexp.MustCompile(`^Benchmark(\w+)Floor/op=([\w-]+)/callers=(\d+)$`)
	scaleName = regexp.MustCompile(`^Benchmark(\w+)Scale/records=(0|1e\d+)/op=([\w-]+)/callers=(\d+)$`)
	passName  = regexp.MustCompile(`^Benchmark(\w+)Scale/(sweep|stuck)=(1e\d+)/callers=(\d+)$`)
)

// benchRun is one result line of go test -bench: its metrics by unit.
type benchRun map[string]float64

// parseBench reads go test -bench output and returns the runs of every
// benchmark, by name without the -GOMAXPROCS suffix, in order of first
// appearance.
func parseBench(r io.Reader) (names []string, runs map[string][]benchRun, err error) {
	runs = map[string][]benchRun{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		run := benchRun{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("benchmark line %q: %w", sc.Text(), err)
			}
			run[f[i+1]] = v
		}
		if _, ok := runs[name]; !ok {
			names = append(names, name)
		}
		runs[name] = append(runs[name], run)
	}
	return names, runs, sc.Err()
}

// stat is the median and range of one metric over the runs.
type stat struct{ med, lo, hi float64 }

func statOf(runs []benchRun, unit string) stat {
	var v []float64
	for _, r := range runs {
		if x, ok := r[unit]; ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return stat{}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return stat{med, v[0], v[len(v)-1]}
}

// floorRow, scaleRow and passRow are the comparison figures of one
// benchmark, over its runs.
type floorRow struct {
	backend, workload string
	callers, runs     int
	do, raw, ratio    stat
	// json and jsonRatio are the JSON floor's, when reported (med 0
	// otherwise).
	json, jsonRatio stat
	trips           float64
}

// target is the floor ratio issue 23 asks of row f: 0.9, but 0.85 for
// PostgreSQL replays and for fresh calls from 16 callers on PostgreSQL and
// Redis. Targets are against the raw floor.
func (f floorRow) target() float64 {
	switch {
	case f.backend == "postgres" && f.workload == "replay",
		f.workload == "fresh" && f.callers > 1 && (f.backend == "postgres" || f.backend == "redis"):
		return 0.85
	}
	return 0.9
}

type scaleRow struct {
	backend, records, workload string
	callers, runs              int
	do, empty, ratio           stat
	bytesPerRecord             float64
	// floor is set, and empty is not, for a scale benchmark measured
	// against a raw floor at each size (its raw-ns/op).
	floor stat
}

// againstFloor reports whether s compares Do with a floor rather than
// with an empty store.
func (s scaleRow) againstFloor() bool { return s.floor.med > 0 && s.empty.med == 0 }

type passRow struct {
	backend, pass, rows      string
	callers, runs            int
	seconds, base, during, r stat
}

// comparisons are the comparison benchmarks found in a go test -bench
// output.
type comparisons struct {
	floors []floorRow
	scales []scaleRow
	passes []passRow
}

func (c comparisons) empty() bool {
	return len(c.floors) == 0 && len(c.scales) == 0 && len(c.passes) == 0
}

// backendName turns the CamelCase Xxx of a benchmark's name into the
// backend's name: RedisCluster → redis-cluster.
func backendName(camel string) string {
	var b strings.Builder
	for i, r := range camel {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('-')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func collect(names []string, runs map[string][]benchRun) comparisons {
	var c comparisons
	for _, name := range names {
		rs := runs[name]
		if m := floorName.FindStringSubmatch(name); m != nil {
			callers, _ := strconv.Atoi(m[3])
			c.floors = append(c.floors, floorRow{
				backend: backendName(m[1]), workload: m[2], callers: callers, runs: len(rs),
				do: statOf(rs, "ns/op"), raw: statOf(rs, "raw-ns/op"), ratio: statOf(rs, "ratio"),
				json: statOf(rs, "json-ns/op"), jsonRatio: statOf(rs, "json-ratio"),
				trips: statOf(rs, "roundtrips/op").med,
			})
		}
		if m := scaleName.FindStringSubmatch(name); m != nil {
			callers, _ := strconv.Atoi(m[4])
			c.scales = append(c.scales, scaleRow{
				backend: backendName(m[1]), records: m[2], workload: m[3], callers: callers, runs: len(rs),
				do: statOf(rs, "ns/op"), empty: statOf(rs, "empty-ns/op"), floor: statOf(rs, "raw-ns/op"), ratio: statOf(rs, "ratio"),
				bytesPerRecord: statOf(rs, "bytes/record").med,
			})
		}
		if m := passName.FindStringSubmatch(name); m != nil {
			callers, _ := strconv.Atoi(m[4])
			ns := statOf(rs, "ns/op")
			c.passes = append(c.passes, passRow{
				backend: backendName(m[1]), pass: m[2], rows: m[3], callers: callers, runs: len(rs),
				seconds: stat{ns.med / 1e9, ns.lo / 1e9, ns.hi / 1e9},
				base:    statOf(rs, "p99-base-ms"), during: statOf(rs, "p99-"+m[2]+"-ms"), r: statOf(rs, "p99-ratio"),
			})
		}
	}
	slices.SortStableFunc(c.floors, func(a, b floorRow) int { return cmp.Compare(a.backend, b.backend) })
	slices.SortStableFunc(c.scales, func(a, b scaleRow) int { return cmp.Compare(a.backend, b.backend) })
	return c
}

// runComparisons runs the benchmarks of benchmarks/ matching pattern with
// go test, echoing their output to stderr, and returns what it printed.
func runComparisons(pattern, benchtime string, count int) (string, error) {
	args := []string{"test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime,
		"-count", strconv.Itoa(count), "-timeout", "2h", "github.com/exactlyonce/idempotency/benchmarks"}
	fmt.Fprintf(os.Stderr, "report: go %s\n", strings.Join(args, " "))
	cmd := exec.Command("go", args...)
	var out strings.Builder
	cmd.Stdout = io.MultiWriter(&out, os.Stderr)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("go test -bench %s: %w", pattern, err)
	}
	return out.String(), nil
}

// ms formats nanoseconds as milliseconds, or as µs below one.
func ms(ns float64) string {
	if ns < 1e6 {
		return fmt.Sprintf("%.0f µs", ns/1e3)
	}
	return fmt.Sprintf("%.2f ms", ns/1e6)
}

// seconds formats a time in seconds, with more digits under ten.
func seconds(s float64) string {
	if s < 10 {
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.1f s", s)
}

// ranged formats a ratio's median with its range over the runs.
func ranged(s stat, runs int) string {
	if runs < 2 {
		return fmt.Sprintf("**%.2f**", s.med)
	}
	return fmt.Sprintf("**%.2f** (%.2f–%.2f)", s.med, s.lo, s.hi)
}

func writeComparisons(w io.Writer, c comparisons) {
	if len(c.floors) > 0 {
		fmt.Fprintln(w, "\nDo against two floors of the same round trips on the same server and pool, alternating (BenchmarkXxxFloor): the raw floor (trivial statements: the physical limit) and the JSON floor (the raw floor plus what every caller of a raw driver does with the value: encode the result before a fresh call, decode the value read into the same Go type after a replay). Ratio = floor time ÷ Do time, median of the runs and their range; the targets are against the raw floor:")
		fmt.Fprintln(w, "\n| backend | workload | callers | Do | raw floor | ratio | JSON floor | ratio | target | round trips/op |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
		for _, f := range c.floors {
			jsonTime, jsonRatio := "–", "–"
			if f.json.med > 0 {
				jsonTime, jsonRatio = ms(f.json.med), ranged(f.jsonRatio, f.runs)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %.2f | %.2f |\n",
				f.backend, f.workload, f.callers, ms(f.do.med), ms(f.raw.med), ranged(f.ratio, f.runs), jsonTime, jsonRatio, f.target(), f.trips)
		}
	}
	var vsEmpty, vsFloor []scaleRow
	for _, s := range c.scales {
		if s.againstFloor() {
			vsFloor = append(vsFloor, s)
		} else {
			vsEmpty = append(vsEmpty, s)
		}
	}
	writeScaleTable(w, vsEmpty, "Do on a store already holding live records against an empty one, alternating (BenchmarkXxxScale; ratio = empty time ÷ loaded time; target 0.8):",
		"Do, loaded | Do, empty", func(s scaleRow) stat { return s.empty })
	writeScaleTable(w, vsFloor, "Do on a store already holding live records against a raw floor on the same server, alternating, at each size (BenchmarkXxxScale with a floor; ratio = floor time ÷ Do time; the records do not slow Do down when the ratio holds from 0 records up, within 20%):",
		"Do | floor", func(s scaleRow) stat { return s.floor })
	if len(c.passes) > 0 {
		fmt.Fprintln(w, "\nClaims beside an operator's pass over many records: a sweep of expired records, or a full Stuck listing (pages of 100) of live ones with 100 stuck among them (the time of the pass; p99 claim latency before and during it; target: ratio at most 2):")
		fmt.Fprintln(w, "\n| backend | pass | records | callers | pass time | claim p99 before | during | ratio |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|")
		for _, s := range c.passes {
			fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %.2f ms | %.2f ms | %s |\n",
				s.backend, s.pass, s.rows, s.callers, seconds(s.seconds.med), s.base.med, s.during.med, ranged(s.r, s.runs))
		}
	}
}

// writeScaleTable writes the scale rows under intro, if there are any:
// Do's time and the baseline's (heads names the two columns), the ratio
// and the bytes per record.
func writeScaleTable(w io.Writer, rows []scaleRow, intro, heads string, baseline func(scaleRow) stat) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\n"+intro)
	fmt.Fprintf(w, "\n| backend | records | workload | callers | %s | ratio | bytes/record |\n", heads)
	fmt.Fprintln(w, "|---|--:|---|--:|--:|--:|--:|--:|")
	for _, s := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s | %.0f |\n",
			s.backend, s.records, s.workload, s.callers, ms(s.do.med), ms(baseline(s).med), ranged(s.ratio, s.runs), s.bytesPerRecord)
	}
}
