package conformancetest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
)

// realTimeEnv names the behaviour of the store TestRealTimeStore runs the
// suite on, in real time: see stallingStore.
const realTimeEnv = "CONFORMANCETEST_REAL_TIME_STORE"

// stallingStore is the memory store in real time, with a fault or a
// stall on the keys of repeated_claim_sets_grace and
// in_progress_retry_after:
//   - "stall-once": the first repeated claim of the first case's "longer"
//     key waits 300 ms (more than its lease of one 200 ms unit), as a
//     stalled machine would make it;
//   - "stall-always": every such claim waits;
//   - "half-lease": every claim of the second case's key asks half the
//     lease it was given (a fault, with no stall).
type stallingStore struct {
	idempotency.Store
	mode    string
	holders sync.Map // key → the token of its first claim
	stalled atomic.Bool
}

// repeats reports whether r repeats the first claim of its key.
func (s *stallingStore) repeats(r idempotency.ClaimRequest) bool {
	first, loaded := s.holders.LoadOrStore(r.Key, r.Token)
	return loaded && first == r.Token
}

func (s *stallingStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	switch {
	case s.mode == "half-lease" && strings.Contains(r.Key, "in-progress"):
		r.Lease /= 2
	case s.mode != "half-lease" && strings.Contains(r.Key, "repeat-grace-longer") && s.repeats(r):
		if s.mode == "stall-always" || s.stalled.CompareAndSwap(false, true) {
			time.Sleep(300 * time.Millisecond)
		}
	}
	return s.Store.Claim(ctx, r)
}

// TestRealTimeStore runs the two cases on a stallingStore in the mode
// named by realTimeEnv; TestRealTimeFirstAttempts runs it.
func TestRealTimeStore(t *testing.T) {
	mode := os.Getenv(realTimeEnv)
	if mode == "" {
		t.Skip(realTimeEnv + " is not set: TestRealTimeFirstAttempts runs this test with it")
	}
	// One store for both cases (Run calls newStore from several goroutines
	// at once), so that a rerun is not stalled again.
	store := sync.OnceValue(func() idempotency.Store { return &stallingStore{Store: memStore(nil), mode: mode} })
	conformancetest.Run(t, func(*testing.T, *conformancetest.Clock) idempotency.Store { return store() }, conformancetest.Capabilities{})
}

// TestRealTimeFirstAttempts: in real time, a case that fails after a stall
// of more than half its time unit runs again alone, and only the second
// run counts (it passes when the stall does not return, and fails when it
// does); a case that fails without a stall fails at once.
func TestRealTimeFirstAttempts(t *testing.T) {
	if os.Getenv(realTimeEnv) != "" {
		t.Skip("inside a real-time subprocess")
	}
	rerun := `first attempt failed with the case \S+ behind its planned waits`
	for _, c := range []struct {
		mode, pass, fail string
		reran            bool
	}{
		{"stall-once", "repeated_claim_sets_grace", "", true},
		{"stall-always", "", "repeated_claim_sets_grace", true},
		{"half-lease", "", "in_progress_retry_after", false},
	} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestRealTimeStore$/^(repeated_claim_sets_grace|in_progress_retry_after)$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), realTimeEnv+"="+c.mode)
			out, err := cmd.CombinedOutput()
			if _, exited := err.(*exec.ExitError); err != nil && !exited {
				t.Fatalf("running the %s store's suite: %v", c.mode, err)
			}
			if (err != nil) != (c.fail != "") {
				t.Errorf("the suite's exit: %v; want it to fail: %v", err, c.fail != "")
			}
			if c.pass != "" && !regexp.MustCompile(`(?m)^\s*--- PASS: TestRealTimeStore/`+c.pass+` `).Match(out) {
				t.Errorf("case %s did not pass", c.pass)
			}
			if c.fail != "" && !regexp.MustCompile(`(?m)^\s*--- FAIL: TestRealTimeStore/`+c.fail+` `).Match(out) {
				t.Errorf("case %s did not fail", c.fail)
			}
			if got := regexp.MustCompile(rerun).Match(out); got != c.reran {
				t.Errorf("the output says a case ran again: %v, want %v", got, c.reran)
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}
