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

var testRows = []row{
	{backend: "memory", workload: "fresh", nsPerOp: 2500, allocsPerOp: 11, bytesPerOp: 1400, extra: map[string]float64{"roundtrips/op": 0}},
	{backend: "postgres", workload: "fresh", nsPerOp: 340000, allocsPerOp: 42, bytesPerOp: 3383, extra: map[string]float64{"roundtrips/op": 2}},
	{backend: "postgres", workload: "contended", nsPerOp: 88000, allocsPerOp: 35, bytesPerOp: 1989,
		extra: map[string]float64{"roundtrips/op": 1.14, "acquired/op": 0.125, "replayed/op": 0.5, "inprogress/op": 0.375}},
}

// TestChart checks that the chart is well-formed SVG with a bar per row,
// each labelled with its throughput.
func TestChart(t *testing.T) {
	svg := chart(testRows, comparisons{}, environment(time.Second, 3))
	d := xml.NewDecoder(strings.NewReader(svg))
	bars := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			for _, a := range se.Attr {
				if a.Name.Local == "fill" && a.Value == colors["postgres"] {
					bars++
				}
			}
		}
	}
	// Two postgres bars and its legend square.
	if bars != 3 {
		t.Errorf("%d postgres rects, want 3", bars)
	}
	for _, want := range []string{">400k<", ">2.9k<", ">11.4k<", ">fresh<", ">contended<", ">1k<", ">1M<", "median of 3 runs of 1s"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestMarkdown(t *testing.T) {
	var b bytes.Buffer
	writeMarkdown(&b, testRows, []string{"redis (IDEM_REDIS_ADDR not set)"}, nil, environment(time.Second, 1))
	out := b.String()
	for _, want := range []string{
		"| postgres | fresh | 340,000 | 2,941 | 42 | 3383 | 2.00 |",
		"| memory | fresh | 2,500 | 400,000 | 11 | 1400 | 0.00 |",
		"| postgres | 0.125 | 0.500 | 0.375 |",
		"Not run: redis (IDEM_REDIS_ADDR not set).",
		"; 1s per workload;",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestHuman(t *testing.T) {
	for v, want := range map[float64]string{950: "950", 9500: "9.5k", 2000: "2k", 95000: "95k", 412345: "412k", 1e6: "1M", 1.25e6: "1.25M", 1.5e6: "1.5M"} {
		if got := human(v); got != want {
			t.Errorf("human(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567"} {
		if got := group(v); got != want {
			t.Errorf("group(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestMarkdownRoundTrip checks that the tables the report writes read back
// into the same rows, so a chart can be drawn again from saved figures.
func TestMarkdownRoundTrip(t *testing.T) {
	var b bytes.Buffer
	writeMarkdown(&b, testRows, nil, nil, environment(time.Second, 1))
	names, runs, err := parseBench(strings.NewReader(sampleBench))
	if err != nil {
		t.Fatal(err)
	}
	writeComparisons(&b, collect(names, runs)) // tables of 7 columns too, to be left alone
	rows, err := parseMarkdown(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(testRows) {
		t.Fatalf("read back %d rows, want %d:\n%s", len(rows), len(testRows), b.String())
	}
	for i, r := range rows {
		w := testRows[i]
		if r.backend != w.backend || r.workload != w.workload || r.nsPerOp != w.nsPerOp || r.allocsPerOp != w.allocsPerOp ||
			r.bytesPerOp != w.bytesPerOp || math.Abs(r.extra["roundtrips/op"]-w.extra["roundtrips/op"]) > 0.005 {
			t.Errorf("row %d read back as %+v, want %+v", i, r, w)
		}
	}
	if env, want := environmentOf(b.String()), environment(time.Second, 1); env != want {
		t.Errorf("environment read back as %q, want %q", env, want)
	}
	if env := environmentOf("no header here\n"); env != "" {
		t.Errorf("environment of a text without the header: %q", env)
	}
	if got := rows[2].extra["inprogress/op"]; got != 0.375 {
		t.Errorf("contended in progress read back as %v, want 0.375", got)
	}
	if _, err := parseMarkdown("no tables here"); err == nil {
		t.Error("parseMarkdown of text without tables: no error")
	}
}
