package chaos

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// Defaults of a [Schedule] taken from the environment: the short,
// fixed-seed set that `make test` runs.
const (
	DefaultSeed   = 20261201
	DefaultBudget = 90 * time.Second
)

// A Schedule says which trials a test runs: trial i (counting from First)
// draws its fault kind, timing and target from a generator seeded with
// (Seed, i), so any one trial can be replayed alone. Trials stop at Trials
// or when Budget has passed, whichever comes first.
type Schedule struct {
	Seed   uint64
	First  int
	Trials int
	Budget time.Duration
}

// FromEnv returns the schedule that CHAOS_SEED, CHAOS_FIRST, CHAOS_TRIALS
// and CHAOS_BUDGET (a Go duration) ask for, with defaultTrials trials and
// [DefaultSeed], [DefaultBudget] where they are not set. A malformed
// variable fails the test: a typo must not shrink a long run silently.
func FromEnv(t testing.TB, defaultTrials int) Schedule {
	t.Helper()
	s := Schedule{Seed: DefaultSeed, Trials: defaultTrials, Budget: DefaultBudget}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		s.Seed = n
	}
	for _, e := range []struct {
		name string
		dst  *int
	}{{"CHAOS_FIRST", &s.First}, {"CHAOS_TRIALS", &s.Trials}} {
		if v := os.Getenv(e.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a count", e.name, v)
			}
			*e.dst = n
		}
	}
	if v := os.Getenv("CHAOS_BUDGET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CHAOS_BUDGET=%q: want a Go duration such as 10m", v)
		}
		s.Budget = d
	}
	return s
}

// A Trial is one draw of a schedule.
type Trial struct {
	// Index is the trial's number in its schedule.
	Index int
	// Seed is the schedule's seed.
	Seed uint64
	// Rand is the trial's own generator: draw every choice from it, in
	// the same order, so that a replay makes the same choices.
	Rand *rand.Rand
}

// Replay is the command line that runs this trial alone.
func (tr Trial) Replay(test string) string {
	return fmt.Sprintf("CHAOS_SEED=%d CHAOS_FIRST=%d CHAOS_TRIALS=1 go test -run '^%s$' ./chaos/", tr.Seed, tr.Index, test)
}

// Between draws a duration uniformly in [lo, hi).
func (tr Trial) Between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(tr.Rand.Int64N(int64(hi-lo)))
}

// Pick draws one of choices.
func Pick[E any](tr Trial, choices ...E) E {
	return choices[tr.Rand.IntN(len(choices))]
}

// Run runs the schedule's trials in order, each as a subtest named by its
// index, and stops at the first failing one (after logging the command
// that replays it) or when the budget is spent. It returns the number of
// trials run.
func Run(t *testing.T, s Schedule, trial func(t *testing.T, tr Trial)) int {
	t.Helper()
	deadline := time.Now().Add(s.Budget)
	ran := 0
	for i := s.First; i < s.First+s.Trials; i++ {
		if time.Now().After(deadline) {
			t.Logf("budget %v spent after %d of %d trials", s.Budget, ran, s.Trials)
			break
		}
		tr := Trial{Index: i, Seed: s.Seed, Rand: rand.New(rand.NewPCG(s.Seed, uint64(i)))}
		ok := t.Run(strconv.Itoa(i), func(t *testing.T) { trial(t, tr) })
		ran++
		if !ok {
			t.Errorf("trial %d failed; replay it with: %s", i, tr.Replay(t.Name()))
			break
		}
	}
	return ran
}
