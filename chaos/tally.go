package chaos

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// A Row is what one backend and fault kind gave over a run: one row of the
// README's "Reliability, measured" table.
type Row struct {
	Backend string // "postgres (DoTx)", "redis (Replicas: 1)", ...
	Fault   string // "SIGKILL after effect", "reset mid-query", ...
	Trials  int
	Faults  int // faults actually injected (a trial may inject none or several)
	// DuplicateEffects counts effects applied more than once for one
	// intent. It must be 0 wherever the README promises exactly-once
	// effects.
	DuplicateEffects int
	// LostAcks counts writes the store acknowledged (a claim or a
	// completion that returned success) that were gone afterwards.
	LostAcks int
	// MaxUnavailable is the longest time a key could be neither replayed
	// nor claimed again after a fault.
	MaxUnavailable time.Duration
}

// A Tally adds up rows by backend and fault kind. It is safe for
// concurrent use.
type Tally struct {
	mu   sync.Mutex
	rows map[[2]string]*Row
}

// Add adds one trial's figures to its row.
func (ta *Tally) Add(r Row) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.rows == nil {
		ta.rows = make(map[[2]string]*Row)
	}
	k := [2]string{r.Backend, r.Fault}
	cur := ta.rows[k]
	if cur == nil {
		cur = &Row{Backend: r.Backend, Fault: r.Fault}
		ta.rows[k] = cur
	}
	cur.Trials += r.Trials
	cur.Faults += r.Faults
	cur.DuplicateEffects += r.DuplicateEffects
	cur.LostAcks += r.LostAcks
	cur.MaxUnavailable = max(cur.MaxUnavailable, r.MaxUnavailable)
}

// Rows returns the rows, sorted by backend and fault.
func (ta *Tally) Rows() []Row {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	out := make([]Row, 0, len(ta.rows))
	for _, r := range ta.rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Backend != out[j].Backend {
			return out[i].Backend < out[j].Backend
		}
		return out[i].Fault < out[j].Fault
	})
	return out
}

// Table renders the rows as the README's Markdown table.
func (ta *Tally) Table() string {
	var b strings.Builder
	b.WriteString("| backend | fault | trials | faults injected | duplicate effects | acknowledged writes lost | longest unavailable |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range ta.Rows() {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %v |\n", r.Backend, r.Fault, r.Trials, r.Faults,
			r.DuplicateEffects, r.LostAcks, r.MaxUnavailable.Round(time.Millisecond))
	}
	return b.String()
}

// Report logs the table and, when CHAOS_REPORT names a file, appends the
// table to it.
func (ta *Tally) Report(t testing.TB) {
	t.Helper()
	table := ta.Table()
	t.Logf("reliability, measured:\n%s", table)
	if p := os.Getenv("CHAOS_REPORT"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("CHAOS_REPORT: %v", err)
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "<!-- %s -->\n%s\n", t.Name(), table)
	}
}
