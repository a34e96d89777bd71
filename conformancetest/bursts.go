package conformancetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
)

// Transient errors in bursts. A burst sends thousands of calls at once, and
// a store may answer some of them with an error that decides nothing: a
// server that timed the request out or shed load ("request timed out",
// "too many requests"). Rule 5 allows that: an error is never a definite
// answer. So a burst does what Do does: it repeats the call with the same
// token, which rule 4 makes safe (a repeated Claim that landed returns the
// same acquisition), after a backoff with full jitter, until the store
// answers or burstPatience has passed; each call's decision is the answer
// it finally gets. The first calls go all at once, which is the burst;
// the repeats go at most maxRepeating at a time in a case, so that they
// do not keep an overloaded server overloaded. Which errors are worth a
// repeat is what Do decides (idempotency.Retryable): a definite answer
// (ErrLeaseLost, ErrTooLarge, ...) never is. A burst logs how many calls
// it repeated.
const (
	burstPatience = 2 * time.Minute
	firstBackoff  = 10 * time.Millisecond
	maxBackoff    = 5 * time.Second
	maxRepeating  = 32
)

// answer is what a call repeated by persist was told.
type answer struct {
	err   error // the last call's error; nil for success
	calls int   // how many calls were made
	first error // the first transient error, nil if there was none
}

// persist calls f until it returns nil or an error not worth a repeat,
// the case ends, or burstPatience has passed, and returns the last answer. Calls after
// the first wait for one of the case's maxRepeating turns.
func (e *env) persist(f func() error) answer {
	deadline := time.Now().Add(burstPatience)
	backoff := firstBackoff
	a := answer{calls: 1, err: f()}
	for a.err != nil && idempotency.Retryable(e.ctx, a.err) && time.Now().Before(deadline) {
		if a.first == nil {
			a.first = a.err
		}
		t := time.NewTimer(rand.N(backoff + 1))
		select {
		case <-e.ctx.Done():
			t.Stop()
			return a
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
		a.calls++
		a.err = e.repeat(f)
	}
	return a
}

// repeat calls f in one of the case's maxRepeating turns.
func (e *env) repeat(f func() error) error {
	select {
	case e.repeating <- struct{}{}:
	case <-e.ctx.Done():
		return e.ctx.Err()
	}
	defer func() { <-e.repeating }()
	return f()
}

// claimPersist is Claim, repeated after transient errors.
func (e *env) claimPersist(r idempotency.ClaimRequest) (idempotency.ClaimResult, answer) {
	var res idempotency.ClaimResult
	a := e.persist(func() error {
		var err error
		res, err = e.s.Claim(e.ctx, r)
		return err
	})
	return res, a
}

// String describes an answer's error for messages.
func (a answer) String() string {
	if a.calls > 1 {
		return fmt.Sprintf("%v (after %d calls, the first failing with %v)", a.err, a.calls, a.first)
	}
	return fmt.Sprint(a.err)
}

// logRepeats logs how many of a burst's answers took more than one call.
func (e *env) logRepeats(what string, answers []answer) {
	e.t.Helper()
	n, example := 0, error(nil)
	for _, a := range answers {
		if a.first != nil {
			n++
			example = a.first
		}
	}
	if n > 0 {
		e.t.Logf("%s: %d of %d calls were repeated under the same token after a transient error (rule 4 makes that safe), e.g. %v",
			what, n, len(answers), example)
	}
}

// race runs f(0), ..., f(n-1) on n goroutines released at once, and waits
// for them all.
func race(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

// burst claims every key from per goroutines at once, with distinct tokens
// and the given lease, all released together, and returns the acquisitions
// of each key. Errors that remain after the repeats of persist, and
// outcomes other than Acquired and InProgress with a positive RetryAfter,
// fail the case.
func (e *env) burst(keys []string, per int, lease time.Duration) [][]idempotency.ClaimResult {
	e.t.Helper()
	results := make([]idempotency.ClaimResult, len(keys)*per)
	answers := make([]answer, len(keys)*per)
	toks := make([]idempotency.Token, len(keys)*per)
	for i := range toks {
		toks[i] = e.token()
	}
	race(len(toks), func(i int) {
		results[i], answers[i] = e.claimPersist(idempotency.ClaimRequest{
			Key: keys[i/per], Fingerprint: fpA, Token: toks[i], Lease: lease, Grace: long,
		})
	})
	e.logRepeats(fmt.Sprintf("%d concurrent claims", len(toks)), answers)

	acquired := make([][]idempotency.ClaimResult, len(keys))
	var bad []string
	for i, res := range results {
		key := keys[i/per]
		switch {
		case answers[i].err != nil:
			bad = append(bad, fmt.Sprintf("claim of %s: %v", short(key), answers[i]))
		case res.Outcome == idempotency.OutcomeAcquired:
			acquired[i/per] = append(acquired[i/per], res)
		case res.Outcome != idempotency.OutcomeInProgress:
			bad = append(bad, fmt.Sprintf("claim of %s: outcome %v, want acquired or in_progress", short(key), res.Outcome))
		case res.RetryAfter <= 0:
			bad = append(bad, fmt.Sprintf("claim of %s: in_progress with RetryAfter %v, want > 0", short(key), res.RetryAfter))
		}
	}
	if len(bad) > 0 {
		e.t.Errorf("%d of %d concurrent claims failed or had unexpected outcomes, e.g. %s",
			len(bad), len(toks), strings.Join(bad[:min(5, len(bad))], "; "))
	}
	return acquired
}

// onceEach fails the case unless every key was acquired exactly once, as
// attempt and with a fence greater than first's (when first is given).
func (e *env) onceEach(keys []string, acquired [][]idempotency.ClaimResult, attempt int, first []idempotency.ClaimResult, what string) {
	e.t.Helper()
	var wrong []string
	total := 0
	for i, acq := range acquired {
		total += len(acq)
		switch {
		case len(acq) != 1:
			wrong = append(wrong, fmt.Sprintf("%s acquired %d times", short(keys[i]), len(acq)))
		case acq[0].Attempt != attempt:
			wrong = append(wrong, fmt.Sprintf("%s acquired as attempt %d, want %d", short(keys[i]), acq[0].Attempt, attempt))
		case first != nil && acq[0].Fence <= first[i].Fence:
			wrong = append(wrong, fmt.Sprintf("%s acquired with fence %d, want above %d", short(keys[i]), acq[0].Fence, first[i].Fence))
		}
	}
	if len(wrong) > 0 {
		e.t.Errorf("%s: %d of %d keys were not acquired exactly once (%d acquisitions in all), e.g. %s",
			what, len(wrong), len(keys), total, strings.Join(wrong[:min(5, len(wrong))], "; "))
	}
}

// staleOps are the writes under a lease that stale_writes_race_takeovers
// races against takeovers.
var staleOps = []string{"Renew", "Checkpoint", "Complete", "Release"}

// staleResult is what a stale holder's Complete stores.
var staleResult = []byte("the stale holder's result")

// staleKey is one key of a round of stale_writes_race_takeovers: its
// holder A, whose lease ended, writes (op) while claimers take over.
type staleKey struct {
	op     string
	key    string
	holder idempotency.Token
	first  idempotency.ClaimResult // A's acquisition
	write  answer                  // what A's write was told
	toks   []idempotency.Token     // the claimers'
	claims []idempotency.ClaimResult
	ans    []answer
}

// testStaleWritesRace races, on many keys at once, a stale holder's write
// against claims that take its ended lease over. A write under a lease
// that checks the holder and then writes without a condition (two steps,
// not one atomic conditional write) lets a takeover land between them: the
// stale value then reaches the new holder, or the new holder's record is
// completed or deleted under it. Each round shows on its own key, for each
// of the four writes, which took effect first: either the write failed
// with ErrLeaseLost and the claims took over a record it did not change,
// or the write landed first and the claims saw it (a renewed lease, the
// new checkpoint handed over, the stale result replayed, a fresh record
// after the release). As in many_keys_takeover_8_goroutines, the window of
// a store in the process is microseconds, so the case runs 32 rounds of 64
// keys, or more, or fewer (see moreStaleRounds). Keys
// are acquired a batch of rounds at a time, with the shortest lease the
// store keeps, and the case waits once a batch for those leases to end.
func testStaleWritesRace(e *env) {
	const rounds, minRounds, batch, perOp, claimers = 32, 4, 4, 16, 3
	perRound := perOp * len(staleOps)
	start := time.Now()
	r := 0
	var answers []answer
	defer func() { e.logRepeats(fmt.Sprintf("%d rounds of %d keys", r, perRound), answers) }()
	for ; e.moreStaleRounds(start, r, minRounds, rounds); r += batch {
		ks := e.staleKeys(r*perRound, batch*perRound, claimers)
		if e.t.Failed() {
			return
		}
		e.passBeyond(e.short)
		for b := range batch {
			answers = append(answers, e.staleRound(ks[b*perRound:(b+1)*perRound], fmt.Sprintf("round %d of %d", r+b+1, rounds))...)
			if e.t.Failed() {
				return
			}
		}
	}
	e.t.Logf("%d rounds of %d keys in %v", r, perRound, time.Since(start).Round(time.Millisecond))
}

// moreStaleRounds reports whether stale_writes_race_takeovers, which began
// its rounds at start and has run r of them, runs more. On the controlled
// clock it runs all rounds (see moreRounds), and more while they have
// taken less than staleTime, up to 16 times as many: on a fast machine
// (no race detector) a round costs microseconds, and each has less chance
// to land a claim in a write's window. In real time it stops as
// moreRounds does, and after rounds.
func (e *env) moreStaleRounds(start time.Time, r, minRounds, rounds int) bool {
	if e.caps.ControlledClock {
		return r < rounds || r < 16*rounds && time.Since(start) < staleTime
	}
	return r < rounds && e.moreRounds(start, r, minRounds)
}

// staleTime is how long, at least, stale_writes_race_takeovers runs rounds
// on the controlled clock.
const staleTime = time.Second

// staleKeys acquires n keys, from the first'th on, for
// stale_writes_race_takeovers, each for the shortest lease the store keeps
// and with the ops in turn.
func (e *env) staleKeys(first, n, claimers int) []staleKey {
	e.t.Helper()
	ks := make([]staleKey, n)
	for i := range ks {
		k := &ks[i]
		k.op, k.key, k.holder = staleOps[i%len(staleOps)], e.key(fmt.Sprintf("stale-race-%04d", first+i)), e.token()
		for range claimers {
			k.toks = append(k.toks, e.token())
		}
		k.claims, k.ans = make([]idempotency.ClaimResult, claimers), make([]answer, claimers)
	}
	bad := make([]string, len(ks))
	race(len(ks), func(i int) {
		k := &ks[i]
		res, a := e.claimPersist(idempotency.ClaimRequest{Key: k.key, Fingerprint: fpA, Token: k.holder, Lease: e.short, Grace: long})
		switch {
		case a.err != nil:
			bad[i] = fmt.Sprintf("claim of absent key %s: %v", short(k.key), a)
		case res.Outcome != idempotency.OutcomeAcquired || res.Attempt != 1 || res.Fence < 1:
			bad[i] = fmt.Sprintf("claim of absent key %s: outcome %v, attempt %d, fence %d; want acquired, attempt 1, fence >= 1", short(k.key), res.Outcome, res.Attempt, res.Fence)
		}
		k.first = res
	})
	if bad := nonEmpty(bad); len(bad) > 0 {
		e.t.Errorf("acquiring %d keys: %d failed, e.g. %s", len(ks), len(bad), strings.Join(bad[:min(5, len(bad))], "; "))
	}
	return ks
}

// staleRound starts, for every key at once, its holder's write and its
// claims, then judges what each key shows, and checks that the record
// stays as its claims were told. It returns the answers of the writes and
// claims.
func (e *env) staleRound(ks []staleKey, what string) []answer {
	e.t.Helper()
	per := 1 + len(ks[0].toks)
	race(len(ks)*per, func(i int) {
		k, c := &ks[i/per], i%per-1
		if c < 0 {
			k.write = e.persist(func() error { return e.staleWrite(k) })
			return
		}
		k.claims[c], k.ans[c] = e.claimPersist(idempotency.ClaimRequest{Key: k.key, Fingerprint: fpA, Token: k.toks[c], Lease: long, Grace: long})
	})
	var answers []answer
	for _, k := range ks {
		answers = append(append(answers, k.write), k.ans...)
	}

	wrong := make([]string, len(ks))
	acquirers := make([]int, len(ks))
	for i := range ks {
		acquirers[i], wrong[i] = judgeStale(&ks[i])
	}
	race(len(ks), func(i int) {
		if wrong[i] == "" {
			wrong[i] = e.staleAfter(&ks[i], acquirers[i])
		}
	})
	for i, w := range wrong {
		if w != "" {
			wrong[i] = fmt.Sprintf("%s (stale %s of %s)", w, ks[i].op, short(ks[i].key))
		}
	}
	if bad := nonEmpty(wrong); len(bad) > 0 {
		e.t.Errorf("%s: on %d of %d keys a stale holder's write raced takeovers of its ended lease with a result no order of the calls explains; rule 2: every write under a lease is conditional on the token, atomically, and a holder whose lease was taken over gets ErrLeaseLost and changes nothing. E.g. %s",
			what, len(bad), len(ks), strings.Join(bad[:min(5, len(bad))], "; "))
	}
	return answers
}

func (e *env) staleWrite(k *staleKey) error {
	switch k.op {
	case "Renew":
		return e.s.Renew(e.ctx, k.key, k.holder, long)
	case "Checkpoint":
		return e.s.Checkpoint(e.ctx, k.key, k.holder, "s", []byte("A2"))
	case "Complete":
		return e.s.Complete(e.ctx, k.key, k.holder, staleResult, long)
	default:
		return e.s.Release(e.ctx, k.key, k.holder)
	}
}

// judgeStale finds which claim of k acquired (-1 for none) and what is
// wrong with the answers of k's round ("" for nothing): they must tell
// one of two stories. Either a claim took the record over first (attempt
// one more, a greater fence, no checkpoints), the
// other claims found it in progress, and the stale write failed with
// ErrLeaseLost; or the write landed first and the claims saw it: after a
// Renew, no claim acquires (the lease lives on); after a Checkpoint, the
// takeover hands over "s" = "A2"; after a Complete, every claim replays
// the stale result; after a Release, one claim acquires a fresh record
// (attempt 1, a greater fence, no checkpoints). A write whose first call
// failed with a transient error may have landed and then been refused on
// its repeat: it may end in ErrLeaseLost in the second story too.
func judgeStale(k *staleKey) (int, string) {
	acq := -1
	for c, res := range k.claims {
		switch {
		case k.ans[c].err != nil:
			return -1, fmt.Sprintf("a claim failed: %v", k.ans[c])
		case res.Outcome != idempotency.OutcomeAcquired:
		case acq >= 0:
			return -1, fmt.Sprintf("two claims acquired the key (fences %d and %d, attempts %d and %d): one atomic operation decides a claim (rule 1)",
				k.claims[acq].Fence, res.Fence, k.claims[acq].Attempt, res.Attempt)
		default:
			acq = c
		}
	}
	w := k.write
	if w.err != nil && !errors.Is(w.err, idempotency.ErrLeaseLost) {
		return acq, fmt.Sprintf("the stale %s failed: %v, want success or ErrLeaseLost", k.op, w)
	}
	// Every claim but the acquirer's must find want.
	want := idempotency.OutcomeInProgress
	var landed bool // the claims saw the write land first
	if acq < 0 {
		switch k.op {
		case "Renew":
		case "Complete":
			want = idempotency.OutcomeReplay
		default:
			return acq, fmt.Sprintf("no claim acquired the ended lease, which only a Renew or a Complete landing first explains; the claims got %s", outcomes(k.claims))
		}
		landed = true
	} else {
		a := k.claims[acq]
		takeover := a.Attempt == k.first.Attempt+1 && a.Fence > k.first.Fence
		switch {
		case takeover && len(a.Checkpoints) == 0:
		case takeover && k.op == "Checkpoint" && equalMaps(a.Checkpoints, map[string][]byte{"s": []byte("A2")}):
			landed = true
		case takeover:
			return acq, fmt.Sprintf("the takeover handed over checkpoints %s, want none (or {\"s\": \"A2\"} after a stale Checkpoint that landed first)", describeMap(a.Checkpoints))
		case k.op == "Release" && a.Attempt == 1 && a.Fence > k.first.Fence && len(a.Checkpoints) == 0 && len(a.Result) == 0:
			landed = true
		default:
			return acq, fmt.Sprintf("a claim acquired with attempt %d, fence %d, checkpoints %s, result %s; want a takeover of the holder's record (attempt %d, a fence above %d)%s",
				a.Attempt, a.Fence, describeMap(a.Checkpoints), describe(a.Result), k.first.Attempt+1, k.first.Fence,
				map[bool]string{true: " or, after the Release, a fresh record (attempt 1, no checkpoints)"}[k.op == "Release"])
		}
	}
	for c, res := range k.claims {
		switch {
		case c == acq:
		case res.Outcome != want:
			return acq, fmt.Sprintf("the claims got %s: with %s, every claim but one that acquired must get %v", outcomes(k.claims), story(landed, k.op), want)
		case want == idempotency.OutcomeInProgress && res.RetryAfter <= 0:
			return acq, fmt.Sprintf("a claim got in_progress with RetryAfter %v, want > 0", res.RetryAfter)
		case want == idempotency.OutcomeReplay && !equalBytes(res.Result, staleResult):
			return acq, fmt.Sprintf("a claim replayed %s after the stale Complete, want %s", describe(res.Result), describe(staleResult))
		}
	}
	switch {
	case !landed && w.err == nil:
		return acq, fmt.Sprintf("the stale %s succeeded, yet a claim had taken the record over before it (attempt %d, fence %d, checkpoints %s): the write must fail with ErrLeaseLost and change nothing",
			k.op, k.claims[acq].Attempt, k.claims[acq].Fence, describeMap(k.claims[acq].Checkpoints))
	case landed && w.err != nil && w.first == nil:
		return acq, fmt.Sprintf("the claims saw the stale %s land first (%s), yet it answered %v: a refused write changes nothing", k.op, outcomes(k.claims), w.err)
	}
	return acq, ""
}

// story names the order of a round's calls for messages.
func story(landed bool, op string) string {
	if landed {
		return "the stale " + op + " first"
	}
	return "a takeover first"
}

// staleAfter checks, after a round, that the record is as the round's
// answers left it: the acquirer's repeated claim gets the same fence,
// attempt and checkpoints (nothing changed the new holder's record after
// it was told); with no acquirer, the renewed lease still holds, or the
// stale result is replayed.
func (e *env) staleAfter(k *staleKey, acq int) string {
	switch {
	case acq >= 0:
		a := k.claims[acq]
		res, ans := e.claimPersist(idempotency.ClaimRequest{Key: k.key, Fingerprint: fpA, Token: k.toks[acq], Lease: long, Grace: long})
		switch {
		case ans.err != nil:
			return fmt.Sprintf("the new holder's repeated claim failed: %v", ans)
		case res.Outcome != idempotency.OutcomeAcquired || res.Fence != a.Fence || res.Attempt != a.Attempt || !equalMaps(res.Checkpoints, a.Checkpoints):
			return fmt.Sprintf("the new holder acquired with fence %d, attempt %d, checkpoints %s, but its repeated claim after the race got %v, fence %d, attempt %d, checkpoints %s: the stale write changed the new holder's record",
				a.Fence, a.Attempt, describeMap(a.Checkpoints), res.Outcome, res.Fence, res.Attempt, describeMap(res.Checkpoints))
		}
	case k.op == "Renew":
		res, ans := e.claimPersist(idempotency.ClaimRequest{Key: k.key, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long})
		if ans.err != nil || res.Outcome != idempotency.OutcomeInProgress {
			return fmt.Sprintf("after a Renew the claims saw land first, another token's claim got %v (%v), want in_progress", res.Outcome, ans)
		}
	case k.op == "Complete":
		res, ans := e.claimPersist(idempotency.ClaimRequest{Key: k.key, Fingerprint: fpA, Token: e.token(), Lease: long, Grace: long})
		if ans.err != nil || res.Outcome != idempotency.OutcomeReplay || !equalBytes(res.Result, staleResult) {
			return fmt.Sprintf("after a Complete the claims saw land first, another token's claim got %v with %s (%v), want a replay of %s",
				res.Outcome, describe(res.Result), ans, describe(staleResult))
		}
	}
	return ""
}

// outcomes lists the outcomes of claims for messages.
func outcomes(claims []idempotency.ClaimResult) string {
	var b strings.Builder
	for i, c := range claims {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%v (attempt %d, fence %d)", c.Outcome, c.Attempt, c.Fence)
	}
	return b.String()
}

// equalMaps compares checkpoint maps as checkpointsEqual does.
func equalMaps(got, want map[string][]byte) bool {
	if len(got) != len(want) {
		return false
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || !bytes.Equal(g, w) {
			return false
		}
	}
	return true
}

// nonEmpty returns the non-empty strings of ss.
func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}
