package main

import (
	"io"
	"strings"
	"testing"
)

// The example's verdict holds, and its control shows what it claims: the
// same flaky connection makes duplicate charges without the middleware.
func TestExampleChargesEachIntentOnce(t *testing.T) {
	cfg := config{intents: 12, lose: 0.4, seed: 1}
	var out strings.Builder
	ok, err := run(&out, cfg)
	if err != nil || !ok {
		t.Fatalf("run: %v, %v\n%s", ok, err, out.String())
	}
	with, err := play(io.Discard, cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	if with.lost == 0 || with.attempts <= cfg.intents {
		t.Errorf("the connection lost nothing (%+v): the example shows no retry", with)
	}
	without, err := play(io.Discard, cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	dups := 0
	for _, n := range without.charges {
		if n > 1 {
			dups++
		}
	}
	if dups == 0 {
		t.Errorf("without the middleware no intent was charged twice (%+v): the control shows nothing", without)
	}
}
