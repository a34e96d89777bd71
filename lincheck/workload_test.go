package lincheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/exactlyonce/idempotency"
)

// checkTimeout bounds porcupine's search. The workloads are sized so that a
// correct store's history is checked in well under a second; Unknown (the
// search timed out) fails the test like Illegal does.
const checkTimeout = 20 * time.Second

// workload says how many goroutines run how many random operations on how
// many keys.
type workload struct {
	Clients      int
	OpsPerClient int
	// KeysPerPhase keys are shared by every client during a phase of
	// PhaseLen operations of each client; then the clients move on to
	// fresh keys. A key that completes stays COMPLETED (nothing expires in
	// a run), so fresh keys keep claims, checkpoints and releases coming.
	KeysPerPhase int
	PhaseLen     int
	Seed         uint64
	// Gen makes client c's j-th call; nil means randomCall.
	Gen func(rng *rand.Rand, w workload, c, j int) input
	// Coverage lists the answers the run must have seen at least once,
	// so that a run which never reached a row of the contract (say, every
	// key completed at once) does not pass for a check of it. Nil means
	// randomCoverage.
	Coverage []string
}

// randomCoverage is what randomCall reaches.
var randomCoverage = []string{
	"claim:acquired", "claim:acquired+cps", "claim:in_progress", "claim:replayed", "claim:mismatch",
	"renew:ok", "renew:lost", "checkpoint:ok", "checkpoint:lost",
	"complete:ok", "complete:lost", "release:ok", "release:lost",
}

// history is a recorded run.
type history struct {
	ops    []porcupine.Operation
	counts map[string]int // answers by "kind:answer"
}

// record runs w against store and returns what every call returned, with
// its call and return times.
func record(t testing.TB, store idempotency.Store, w workload) history {
	t.Helper()
	if w.Gen == nil {
		w.Gen = randomCall
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	perClient := make([][]porcupine.Operation, w.Clients)
	start := time.Now()
	var ready, wg sync.WaitGroup
	begin := make(chan struct{})
	for c := range w.Clients {
		ready.Add(1)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w.Seed, uint64(c)))
			ops := make([]porcupine.Operation, 0, w.OpsPerClient)
			mine := map[string]int{} // key -> token this client last acquired it with
			ready.Done()
			<-begin
			for j := range w.OpsPerClient {
				in := w.Gen(rng, w, c, j)
				if tok, ok := mine[in.Key]; ok && in.Kind != opClaim && rng.IntN(4) > 0 {
					in.Token = tok // mostly, a holder works under its own lease
				}
				call := time.Since(start).Nanoseconds()
				out := do(ctx, store, in)
				ret := time.Since(start).Nanoseconds()
				if in.Kind == opClaim && out.Outcome == idempotency.OutcomeAcquired {
					mine[in.Key] = in.Token
				}
				if out.Unknown {
					// It may take effect at any time from its call on.
					ret = math.MaxInt64
				}
				ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
			}
			perClient[c] = ops
		})
	}
	ready.Wait()
	close(begin)
	wg.Wait()

	h := history{counts: map[string]int{}}
	for _, ops := range perClient {
		for _, op := range ops {
			h.ops = append(h.ops, op)
			h.counts[label(op.Input.(input), op.Output.(output))]++
		}
	}
	return h
}

// randomCall is a random call on one of the phase's keys by a random
// token.
func randomCall(rng *rand.Rand, w workload, c, j int) input {
	in := input{
		Key:   fmt.Sprintf("p%d.k%d", j/w.PhaseLen, rng.IntN(w.KeysPerPhase)),
		Token: rng.IntN(numTokens),
	}
	switch r := rng.IntN(100); {
	case r < 38:
		in.Kind = opClaim
		if rng.IntN(100) < 15 {
			in.Fp = 1
		}
	case r < 53:
		in.Kind = opCheckpoint
		in.Name = rng.IntN(numNames)
		in.Value = fmt.Sprintf("c%d.%d", c, j)
	case r < 63:
		in.Kind = opRenew
	case r < 70:
		in.Kind = opComplete
		in.Value = fmt.Sprintf("r%d.%d", c, j)
	default:
		in.Kind = opRelease
	}
	return in
}

// repeatCall makes every client play the same holder of a key, as [Do]'s
// retries after an ambiguous error do: on key "rep<round>" all clients
// claim with one token, checkpoint, then complete (even rounds) or release
// (odd rounds) with it, at about the same time. Every repeat must get the
// answer of the first call (rule 4).
func repeatCall(rng *rand.Rand, w workload, c, j int) input {
	round := j / 3
	in := input{Key: fmt.Sprintf("rep%d", round), Token: round % numTokens}
	switch j % 3 {
	case 0:
		in.Kind = opClaim
	case 1:
		in.Kind = opCheckpoint
		in.Name = rng.IntN(numNames)
		in.Value = fmt.Sprintf("c%d.%d", c, j)
	default:
		if round%2 == 0 {
			in.Kind = opComplete
			in.Value = fmt.Sprintf("r%d.%d", c, j)
		} else {
			in.Kind = opRelease
		}
	}
	return in
}

var repeatCoverage = []string{"claim:acquired", "checkpoint:ok", "complete:ok", "release:ok"}

// do calls the store. An error other than ErrLeaseLost is an Unknown
// output: the call may or may not have taken effect.
func do(ctx context.Context, store idempotency.Store, in input) output {
	tok := tokenOf(in.Token)
	var err error
	switch in.Kind {
	case opClaim:
		var res idempotency.ClaimResult
		res, err = store.Claim(ctx, idempotency.ClaimRequest{
			Key: in.Key, Fingerprint: fingerprints[in.Fp], Token: tok, Lease: lease, Grace: grace,
		})
		if err == nil {
			return claimOutput(res)
		}
	case opRenew:
		err = store.Renew(ctx, in.Key, tok, lease)
	case opCheckpoint:
		err = store.Checkpoint(ctx, in.Key, tok, nameOf(in.Name), []byte(in.Value))
	case opComplete:
		err = store.Complete(ctx, in.Key, tok, []byte(in.Value), retention)
	case opRelease:
		err = store.Release(ctx, in.Key, tok)
	}
	switch {
	case err == nil:
		return output{}
	case errors.Is(err, idempotency.ErrLeaseLost):
		return output{Lost: true}
	default:
		return output{Unknown: true, Err: err.Error()}
	}
}

func label(in input, out output) string {
	switch {
	case out.Unknown:
		return in.Kind.String() + ":error"
	case out.Lost:
		return in.Kind.String() + ":lost"
	case in.Kind != opClaim:
		return in.Kind.String() + ":ok"
	case out.Outcome == idempotency.OutcomeAcquired && hasCps(out):
		return "claim:acquired+cps"
	default:
		return "claim:" + out.Outcome.String()
	}
}

// overlap reports the share of operations that overlap in time another
// operation on the same key: how much the checker had to choose an order.
func (h history) overlap() float64 {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range h.ops {
		k := op.Input.(input).Key
		byKey[k] = append(byKey[k], op)
	}
	n := 0
	for _, ops := range byKey {
		slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		// An operation overlaps another when it was called before an
		// earlier-called one returned, or a later one was called before
		// it returned.
		maxRet := int64(math.MinInt64)
		for i, op := range ops {
			if op.Call <= maxRet || (i+1 < len(ops) && ops[i+1].Call <= op.Return) {
				n++
			}
			maxRet = max(maxRet, op.Return)
		}
	}
	return float64(n) / float64(max(1, len(h.ops)))
}

func (h history) summary() string {
	keys := make([]string, 0, len(h.counts))
	for k := range h.counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, h.counts[k])
	}
	return strings.Join(parts, " ")
}

// checkLinearizable runs w against store and fails t unless porcupine finds
// the history linearizable. On failure it writes porcupine's visualization
// of the history (an HTML file) and names it. A random workload on a store
// whose leases are seconds long (etcd) may miss a rare row of the contract
// (a takeover that hands over checkpoints) in one run: then it runs again,
// up to coverageRounds runs in all, on fresh keys with another seed, each
// run checked on its own, until every row was seen.
func checkLinearizable(t *testing.T, store idempotency.Store, w workload) {
	t.Helper()
	if w.Coverage == nil {
		w.Coverage = randomCoverage
	}
	seen := map[string]int{}
	for round := 1; ; round++ {
		s := store
		if round > 1 {
			s = prefixed{Store: store, prefix: fmt.Sprintf("round%d/", round)}
			w.Seed += 1000
		}
		for k, n := range checkRun(t, s, w) {
			seen[k] += n
		}
		var missing []string
		for _, want := range w.Coverage {
			if seen[want] == 0 {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			return
		}
		if round == coverageRounds {
			for _, want := range missing {
				t.Errorf("the workload never saw %s in %d runs: it does not exercise that row of the contract", want, round)
			}
			return
		}
		t.Logf("run %d never saw %v: one more run on fresh keys", round, missing)
	}
}

// coverageRounds is how many runs checkLinearizable makes at most.
const coverageRounds = 3

// checkRun runs w against store once, fails t unless porcupine finds the
// history linearizable, and returns what the calls answered (see label).
func checkRun(t *testing.T, store idempotency.Store, w workload) map[string]int {
	t.Helper()
	h := record(t, store, w)
	t.Logf("%d operations, %.0f%% overlapping another on their key: %s", len(h.ops), 100*h.overlap(), h.summary())

	unknown := 0
	for _, op := range h.ops {
		if out := op.Output.(output); out.Unknown {
			unknown++
			if unknown <= 5 {
				t.Logf("call failed, outcome unknown: %s", describeOp(op.Input.(input), out))
			}
		}
	}
	// A few failed calls are part of the model (they may or may not have
	// taken effect); many mean the server is not answering.
	if unknown*50 > len(h.ops) {
		t.Fatalf("%d of %d calls failed: the server is not answering properly", unknown, len(h.ops))
	}

	began := time.Now()
	res := porcupine.CheckOperationsTimeout(model, h.ops, checkTimeout)
	t.Logf("porcupine: %s in %v", res, time.Since(began).Round(time.Millisecond))
	if res != porcupine.Ok {
		logIllegalKeys(t, h.ops)
		path := visualize(t, h.ops)
		if res == porcupine.Unknown {
			t.Fatalf("porcupine did not decide within %v (make the workload smaller); visualization: %s", checkTimeout, path)
		}
		t.Fatalf("porcupine finds no order of the calls that the contract explains (Illegal); visualization: %s", path)
	}
	return h.counts
}

// prefixed is a store whose keys are store's under prefix: a run of its
// own on keys no earlier run touched.
type prefixed struct {
	idempotency.Store
	prefix string
}

func (p prefixed) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	r.Key = p.prefix + r.Key
	return p.Store.Claim(ctx, r)
}

func (p prefixed) Renew(ctx context.Context, key string, tok idempotency.Token, lease time.Duration) error {
	return p.Store.Renew(ctx, p.prefix+key, tok, lease)
}

func (p prefixed) Checkpoint(ctx context.Context, key string, tok idempotency.Token, name string, value []byte) error {
	return p.Store.Checkpoint(ctx, p.prefix+key, tok, name, value)
}

func (p prefixed) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, retention time.Duration) error {
	return p.Store.Complete(ctx, p.prefix+key, tok, result, retention)
}

func (p prefixed) Release(ctx context.Context, key string, tok idempotency.Token) error {
	return p.Store.Release(ctx, p.prefix+key, tok)
}

// visualize writes porcupine's visualization of ops to a temporary file
// that outlives the test, and returns its path.
func visualize(t testing.TB, ops []porcupine.Operation) string {
	t.Helper()
	_, info := porcupine.CheckOperationsVerbose(model, ops, checkTimeout)
	f, err := os.CreateTemp("", "lincheck-*.html")
	if err != nil {
		t.Errorf("creating the visualization file: %v", err)
		return "(none)"
	}
	defer f.Close()
	if err := porcupine.Visualize(model, info, f); err != nil {
		t.Errorf("writing the visualization: %v", err)
	}
	return f.Name()
}

// logIllegalKeys logs, for the first keys whose history porcupine does not
// find linearizable, that history in order of call, with times in µs from
// the key's first call and the longest order porcupine could explain.
func logIllegalKeys(t testing.TB, ops []porcupine.Operation) {
	t.Helper()
	shown := 0
	for _, part := range partitionByKey(ops) {
		res, info := porcupine.CheckOperationsVerbose(model, part, checkTimeout)
		if res == porcupine.Ok {
			continue
		}
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		t0 := part[0].Call
		var b strings.Builder
		fmt.Fprintf(&b, "key %q: %s; its %d operations (client [call, return] µs):\n",
			part[0].Input.(input).Key, res, len(part))
		for _, op := range part {
			ret := "∞"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprint((op.Return - t0) / 1000)
			}
			fmt.Fprintf(&b, "  c%-2d [%d, %s] %s\n", op.ClientId, (op.Call-t0)/1000, ret,
				describeOp(op.Input.(input), op.Output.(output)))
		}
		var longest []porcupine.Operation
		for _, lins := range info.PartialLinearizationsOperations() {
			for _, lin := range lins {
				if len(lin) > len(longest) {
					longest = lin
				}
			}
		}
		fmt.Fprintf(&b, "  longest explainable order (%d operations), ending:\n", len(longest))
		for _, op := range longest[max(0, len(longest)-8):] {
			fmt.Fprintf(&b, "    c%-2d %s\n", op.ClientId, describeOp(op.Input.(input), op.Output.(output)))
		}
		t.Log(b.String())
		if shown++; shown == 3 {
			return
		}
	}
}
