package chaos

import (
	"testing"
	"time"
)

func TestTrialsReplayTheSameDraws(t *testing.T) {
	s := Schedule{Seed: 7, Trials: 5, Budget: time.Minute}
	var first [5]time.Duration
	Run(t, s, func(t *testing.T, tr Trial) { first[tr.Index] = tr.Between(0, time.Hour) })
	for i := range first {
		again := Schedule{Seed: 7, First: i, Trials: 1, Budget: time.Minute}
		Run(t, again, func(t *testing.T, tr Trial) {
			if d := tr.Between(0, time.Hour); d != first[i] {
				t.Errorf("trial %d replayed drew %v, first run drew %v", i, d, first[i])
			}
		})
	}
	if first[0] == first[1] && first[1] == first[2] {
		t.Errorf("trials drew the same duration %v: the index does not reach the generator", first[0])
	}
}

func TestTallyAddsUpRows(t *testing.T) {
	var ta Tally
	ta.Add(Row{Backend: "pg", Fault: "kill", Trials: 1, Faults: 1, MaxUnavailable: time.Second})
	ta.Add(Row{Backend: "pg", Fault: "kill", Trials: 1, Faults: 2, DuplicateEffects: 1, MaxUnavailable: 3 * time.Second})
	ta.Add(Row{Backend: "a", Fault: "kill", Trials: 1})
	rows := ta.Rows()
	if len(rows) != 2 || rows[0].Backend != "a" {
		t.Fatalf("rows = %+v, want 2 sorted by backend", rows)
	}
	if r := rows[1]; r.Trials != 2 || r.Faults != 3 || r.DuplicateEffects != 1 || r.MaxUnavailable != 3*time.Second {
		t.Errorf("pg row = %+v", r)
	}
}
