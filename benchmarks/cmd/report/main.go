// Command report runs the benchmark workloads on every backend whose server
// is configured (the memory store always), prints a Markdown table of the
// figures and writes a bar chart of the throughput as SVG.
//
//	go run ./benchmarks/cmd/report [-duration 1s] [-count 1] [-svg benchmarks/results.svg] [-backends memory,postgres]
//	go run ./benchmarks/cmd/report -compare 'Floor|Scale' -compare-benchtime 2000x -count 5
//	go run ./benchmarks/cmd/report -workloads=false -compare-from bench.txt
//
// With -compare it also runs, through go test, the comparison benchmarks
// of benchmarks/ whose names match (BenchmarkXxxFloor: Do against a raw
// floor; BenchmarkXxxScale: Do on a loaded store against an empty one,
// and claims beside a sweep), -count times, and adds their medians and
// ranges to the tables and the chart; -compare-from reads them from a
// saved go test -bench output instead. See compare.go for the naming
// convention a new backend's benchmark follows to be picked up.
//
// The servers come from IDEM_POSTGRES_URL, IDEM_REDIS_ADDR and
// IDEM_REDIS_CLUSTER_ADDRS, as for the benchmarks; a backend whose variable
// is unset is left out (and said so), unless -backends names it, in which
// case its absence is an error. The figures are those of
// go test -bench ./benchmarks/, measured the same way (testing.Benchmark on
// the same workload functions).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
)

// row is the figures of one workload on one backend.
type row struct {
	backend, workload string
	nsPerOp           float64
	allocsPerOp       int64
	bytesPerOp        int64
	extra             map[string]float64 // b.ReportMetric figures
}

func (r row) opsPerSec() float64 { return 1e9 / r.nsPerOp }

func main() {
	testing.Init() // registers -test.benchtime, which testing.Benchmark follows
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	duration := fs.Duration("duration", time.Second, "how long each workload runs on each backend")
	svgPath := fs.String("svg", "benchmarks/results.svg", "where to write the SVG chart (empty: do not write it)")
	count := fs.Int("count", 1, "runs of each workload on each backend; the run with the median ns/op is reported")
	only := fs.String("backends", "", "comma-separated backends to run (default: memory and every backend whose server variable is set)")
	workloads := fs.Bool("workloads", true, "run the workloads (false: only the comparisons of -compare or -compare-from)")
	compare := fs.String("compare", "", "also run the comparison benchmarks of benchmarks/ matching this -bench pattern, e.g. 'Floor|Scale'")
	compareTime := fs.String("compare-benchtime", "2000x", "the -benchtime of the comparison benchmarks")
	compareFrom := fs.String("compare-from", "", "read the comparison benchmarks' results from this go test -bench output instead of running them")
	workloadsFrom := fs.String("workloads-from", "", "read the workloads' figures from this earlier output of the report (its Markdown tables) instead of running them")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: report [flags]\n\nRuns the workloads of benchmarks/ on each backend and prints a Markdown table.\n\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if *count < 1 {
		fatal(fmt.Errorf("-count must be at least 1, got %d", *count))
	}
	if err := flag.Set("test.benchtime", duration.String()); err != nil {
		fatal(err)
	}

	backends, skipped, err := choose(*only)
	if err != nil {
		fatal(err)
	}
	if !*workloads || *workloadsFrom != "" {
		backends, skipped = nil, nil
	}
	ctx := context.Background()
	var rows []row
	var failed []string
	for _, name := range backends {
		fmt.Fprintf(os.Stderr, "report: %s:", name)
		be, err := bench.Open(ctx, name)
		if err != nil {
			fmt.Fprintln(os.Stderr)
			failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		for _, w := range bench.Workloads {
			fmt.Fprintf(os.Stderr, " %s", w.Name)
			r, err := measure(be, w, *count)
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s/%s: %v", name, w.Name, err))
				continue
			}
			rows = append(rows, r)
		}
		fmt.Fprintln(os.Stderr)
		if err := be.Close(); err != nil {
			failed = append(failed, fmt.Sprintf("%s: close: %v", name, err))
		}
	}

	var earlierEnv string
	if *workloadsFrom != "" {
		b, err := os.ReadFile(*workloadsFrom)
		if err != nil {
			fatal(err)
		}
		if rows, err = parseMarkdown(string(b)); err != nil {
			fatal(fmt.Errorf("%s: %w", *workloadsFrom, err))
		}
		earlierEnv = environmentOf(string(b))
	}
	var cmpOut string
	switch {
	case *compareFrom != "":
		b, err := os.ReadFile(*compareFrom)
		if err != nil {
			fatal(err)
		}
		cmpOut = string(b)
	case *compare != "":
		cmpOut, err = runComparisons(*compare, *compareTime, *count)
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	names, runs, err := parseBench(strings.NewReader(cmpOut))
	if err != nil {
		fatal(err)
	}
	cmps := collect(names, runs)

	env := environment(*duration, *count)
	switch {
	case earlierEnv != "":
		env = earlierEnv
	case *workloadsFrom != "":
		env = fmt.Sprintf("%s/%s; workload figures read from %s", runtime.GOOS, runtime.GOARCH, *workloadsFrom)
	}
	if len(rows) > 0 || len(failed) > 0 {
		writeMarkdown(os.Stdout, rows, skipped, failed, env)
	}
	writeComparisons(os.Stdout, cmps)
	if *svgPath != "" && (len(rows) > 0 || !cmps.empty()) {
		if err := os.WriteFile(*svgPath, []byte(chart(rows, cmps, env)), 0o644); err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "report: wrote %s\n", *svgPath)
	}
	if len(failed) > 0 {
		os.Exit(1)
	}
}

// measure runs w on be count times and returns the run with the median
// ns/op, which a burst of load from other processes moves less than the
// mean.
func measure(be *bench.Backend, w bench.Workload, count int) (row, error) {
	var runs []row
	for range count {
		var werr error
		res := testing.Benchmark(func(b *testing.B) {
			if err := w.Run(b, be); err != nil {
				werr = err
				b.FailNow()
			}
		})
		if werr == nil && res.N == 0 {
			werr = errors.New("no operations ran")
		}
		if werr != nil {
			return row{}, werr
		}
		runs = append(runs, row{
			backend: be.Name, workload: w.Name,
			nsPerOp:     float64(res.T.Nanoseconds()) / float64(res.N),
			allocsPerOp: res.AllocsPerOp(), bytesPerOp: res.AllocedBytesPerOp(),
			extra: res.Extra,
		})
	}
	slices.SortFunc(runs, func(a, b row) int { return cmp.Compare(a.nsPerOp, b.nsPerOp) })
	return runs[len(runs)/2], nil
}

// choose returns the backends to run: those named, or memory and every
// backend whose server variable is set, with the others as skipped.
func choose(only string) (run, skipped []string, err error) {
	if only != "" {
		for _, name := range strings.Split(only, ",") {
			if !slices.Contains(bench.Backends, name) {
				return nil, nil, fmt.Errorf("unknown backend %q (want some of %s)", name, strings.Join(bench.Backends, ","))
			}
			run = append(run, name)
		}
		return run, nil, nil
	}
	for _, name := range bench.Backends {
		if v := bench.Var(name); v != "" && os.Getenv(v) == "" {
			skipped = append(skipped, name+" ("+v+" not set)")
			continue
		}
		run = append(run, name)
	}
	return run, skipped, nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "report:", err)
	os.Exit(2)
}

// environment describes the machine and the settings in one line.
func environment(d time.Duration, count int) string {
	runs := fmt.Sprintf("%v per workload", d)
	if count > 1 {
		runs = fmt.Sprintf("median of %d runs of %v per workload", count, d)
	}
	return fmt.Sprintf("%s/%s, %d CPUs, GOMAXPROCS %d, %s; %s; parallel workloads on %d goroutines",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runs,
		bench.Parallelism*runtime.GOMAXPROCS(0))
}

// environmentOf returns the description of the machine and the runs in
// an earlier output of the report (what writeMarkdown put in parentheses
// on its first line), or "" when it has none.
func environmentOf(report string) string {
	const prefix = "Workloads through idempotency.Do with a "
	line, _, _ := strings.Cut(report, "\n")
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		return ""
	}
	_, env, ok := strings.Cut(rest, " (")
	if !ok || !strings.HasSuffix(env, ").") {
		return ""
	}
	return strings.TrimSuffix(env, ").")
}

func writeMarkdown(w io.Writer, rows []row, skipped, failed []string, env string) {
	fmt.Fprintf(w, "Workloads through idempotency.Do with a %d-byte JSON result (%s).\n\n", bench.ResultSize, env)
	fmt.Fprintln(w, workloadHeader)
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %d | %.2f |\n",
			r.backend, r.workload, group(r.nsPerOp), group(r.opsPerSec()), r.allocsPerOp, r.bytesPerOp, r.extra["roundtrips/op"])
	}
	var contended []row
	for _, r := range rows {
		if r.workload == "contended" {
			contended = append(contended, r)
		}
	}
	if len(contended) > 0 {
		fmt.Fprintf(w, "\nOutcomes of the contended workload (%d hot keys, %d requests each), per operation:\n\n", bench.HotKeys, bench.PerKey)
		fmt.Fprintln(w, outcomesHeader)
		fmt.Fprintln(w, "|---|--:|--:|--:|")
		for _, r := range contended {
			fmt.Fprintf(w, "| %s | %.3f | %.3f | %.3f |\n", r.backend, r.extra["acquired/op"], r.extra["replayed/op"], r.extra["inprogress/op"])
		}
	}
	fmt.Fprintln(w, "\nWorkloads:")
	for _, wl := range bench.Workloads {
		fmt.Fprintf(w, "- %s: %s.\n", wl.Name, wl.Doc)
	}
	if len(skipped) > 0 {
		fmt.Fprintf(w, "\nNot run: %s.\n", strings.Join(skipped, ", "))
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "\nFailed:")
		for _, f := range failed {
			fmt.Fprintf(w, "- %s\n", f)
		}
	}
}

// The headers of writeMarkdown's tables, by which parseMarkdown finds them.
const (
	workloadHeader = "| backend | workload | ns/op | ops/s | allocs/op | B/op | round trips/op |"
	outcomesHeader = "| backend | acquired | replayed | in progress |"
)

// parseMarkdown reads back the rows of the tables writeMarkdown wrote
// (the figures of each workload, then the contended outcomes), so that
// the chart can be drawn again from saved figures.
func parseMarkdown(md string) ([]row, error) {
	var rows []row
	num := func(s string) (float64, error) { return strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64) }
	table := "" // the table being read, by its header
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			table = ""
			continue
		}
		if strings.HasPrefix(line, "| backend |") {
			table = line
			continue
		}
		c := strings.Split(strings.Trim(line, "| "), " | ")
		switch {
		case strings.HasPrefix(line, "|--"): // the alignment row
		case table == workloadHeader && len(c) == 7: // backend, workload, ns/op, ops/s, allocs/op, B/op, round trips/op
			ns, err := num(c[2])
			if err != nil {
				return nil, fmt.Errorf("row %q: %w", line, err)
			}
			allocs, err1 := num(c[4])
			bytes, err2 := num(c[5])
			trips, err3 := num(c[6])
			if err := errors.Join(err1, err2, err3); err != nil {
				return nil, fmt.Errorf("row %q: %w", line, err)
			}
			rows = append(rows, row{backend: c[0], workload: c[1], nsPerOp: ns, allocsPerOp: int64(allocs), bytesPerOp: int64(bytes),
				extra: map[string]float64{"roundtrips/op": trips}})
		case table == outcomesHeader && len(c) == 4: // backend, acquired, replayed, in progress (of contended)
			for i := range rows {
				if rows[i].backend != c[0] || rows[i].workload != "contended" {
					continue
				}
				for j, unit := range []string{"acquired/op", "replayed/op", "inprogress/op"} {
					if v, err := num(c[j+1]); err == nil {
						rows[i].extra[unit] = v
					}
				}
			}
		}
	}
	if len(rows) == 0 {
		return nil, errors.New("no workload figures found")
	}
	return rows, nil
}

// group formats x rounded to an integer with thousands separated by commas.
func group(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
