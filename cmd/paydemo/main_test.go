package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency/internal/paydemo"
)

// The demo's own verdict is the test: every intent charged once, every
// client answered as expected, on a few seeds of the flaky link.
func TestDemo(t *testing.T) {
	for _, seed := range []uint64{1, 7} {
		var out bytes.Buffer
		ok, err := paydemo.Run(memStore(nil), paydemo.Config{Seed: seed}, &out)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("seed %d:\n%s", seed, out.String())
		}
		for _, row := range []string{"double-click", "timeout-then-retry", "50-concurrent-duplicates", "key-reused-other-amount", "worker-crash-takeover", "flaky-link-20"} {
			if !strings.Contains(out.String(), row) {
				t.Fatalf("seed %d: no row %s in\n%s", seed, row, out.String())
			}
		}
	}
}
