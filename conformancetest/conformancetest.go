// Package conformancetest checks that an [idempotency.Store] keeps the
// store contract: atomic claims, fenced writes, leases and takeovers,
// expiry, repeatable operations, odd keys and canceled contexts. An
// adapter proves itself with one call in its tests:
//
//	func TestConformance(t *testing.T) {
//		conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
//			return mystore.New(db, &mystore.Options{Now: clock.Now})
//		}, conformancetest.Capabilities{ControlledClock: true})
//	}
//
// The suite reads what the store can do beyond the baseline contract from
// the store itself ([idempotency.CapabilitiesOf]): the cases of a Watcher,
// an Inspector, a Sweeper and of the store's value limit run when the
// store has them; a test may narrow that ([Capabilities.Skip]). A store
// judged by a server's clock ignores the clock argument and leaves
// ControlledClock false: the suite then sleeps through short leases, sized
// from the store's [idempotency.Limits] Resolution, running those cases at
// the same time.
//
// Real-time cases measure time in units of LeaseResolution, at least
// 200ms; the longest takes about six units (1.2s for a millisecond store,
// 6s for a one-second one), and they run at the same time. Cases that start
// thousands of concurrent claims run alone first, so that they do not eat
// into the timing margins of the others; one of them waits once for the
// shortest lease the store honours to end.
//
// The cases are kept in one table, each with a one-line statement of the
// rule it checks, which a failing case prints. Every sentence of the
// contract in the idempotency package's store.go is mapped to the cases
// that check it by a table in this package's tests, which fail when a
// sentence has no case. Every case builds its keys under a random prefix,
// so stores that share one database (one server for the whole test binary)
// need no cleaning between cases. Two cases assume a little of the
// backend: the Sweep case expects the expired records it made to be deleted
// by Sweep, not by the backend's own TTL in the same instant, and the Watch
// case gives Watch 100ms to subscribe before it changes the record.
//
// Some of the contract cannot be seen through the Store interface: whether
// deadlines are judged by a server's clock rather than the client's, and
// how a store reports a connection cut after a write. The suite checks
// what it can (an injectable clock, contexts that end during calls); an
// adapter's own tests must do the rest.
//
// The package imports only the standard library and the idempotency
// package, so adopting it costs one import.
package conformancetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

// Capabilities says how the suite runs a store. The zero value is a store
// judged by real time, checked for everything it declares.
type Capabilities struct {
	// ControlledClock: newStore wires the *Clock it is given into the
	// store, so the suite advances it instead of sleeping. False: real
	// time, the clock argument is ignored.
	ControlledClock bool
	// Skip names optional parts the store declares that this run must not
	// check, such as the Watcher of a MongoDB store on a standalone server,
	// which has no change streams: any of "watcher", "inspector",
	// "sweeper", "batcher".
	Skip []string
}

// features are what a case may use of the store: its capabilities, less
// what the test skipped.
type features struct {
	watcher   idempotency.Watcher
	inspector idempotency.Inspector
	sweeper   idempotency.Sweeper
	batcher   idempotency.Batcher
	// maxValue is the store's declared value limit; zero means unknown,
	// at least 1 MiB.
	maxValue int
	// resolution is the store's lease resolution; zero means a
	// millisecond.
	resolution time.Duration
}

func featuresOf(s idempotency.Store, caps Capabilities) features {
	c := idempotency.CapabilitiesOf(s)
	f := features{watcher: c.Watcher, inspector: c.Inspector, sweeper: c.Sweeper, batcher: c.Batcher,
		maxValue: c.Limits.MaxValueSize, resolution: c.Limits.Resolution}
	for _, part := range caps.Skip {
		switch part {
		case "watcher":
			f.watcher = nil
		case "inspector":
			f.inspector = nil
		case "sweeper":
			f.sweeper = nil
		case "batcher":
			f.batcher = nil
		}
	}
	return f
}

// minRealUnit is the shortest time unit of real-time cases: long enough
// that a loaded machine running the race detector answers well within it.
const minRealUnit = 200 * time.Millisecond

// long is a lease or retention that never ends during a case.
const long = time.Hour

// testCase is one row of the suite.
type testCase struct {
	name string
	// rule is the one-line statement of the contract the case checks,
	// printed when it fails.
	rule string
	// together cases run at the same time as each other; cases that load
	// the machine (thousands of goroutines) run alone first, so that the
	// timing cases keep their margins.
	together bool
	// needs reports whether the store declares what the case checks.
	needs func(features) (bool, string)
	run   func(e *env)
}

// cases is the suite. Every case must be able to fail: conformancetest's
// own tests run it against deliberately broken stores.
var cases = []testCase{
	{name: "fresh_claim", together: true, run: testFreshClaim,
		rule: "a claim on an absent key acquires it with fence >= 1, attempt 1, no result and no checkpoints"},
	{name: "replay_exact_bytes", together: true, run: testReplayExactBytes,
		rule: "a completed record replays its result byte for byte (empty, binary, largest) and shares no memory with the caller"},
	{name: "checkpoints_copied", together: true, run: testCheckpointsCopied,
		rule: "checkpoint values handed to the store and the checkpoint maps it returns share no memory with the caller"},
	{name: "too_large", together: true, run: testTooLarge, needs: needsMaxValueSize,
		rule: "a result above the store's limit gives ErrTooLarge and writes nothing: the record stays STARTED for its holder"},
	{name: "mismatch", together: true, run: testMismatch,
		rule: "a fingerprint that differs in any byte gets Mismatch while started, after the lease ends and when completed; never a replay or a takeover"},
	{name: "in_progress_retry_after", together: true, run: testInProgress,
		rule: "a live lease held by another token gives InProgress with RetryAfter the time left on the lease, no more and no less, disturbing nothing"},
	{name: "one_key_64_goroutines", run: testOneKeyConcurrent,
		rule: "one atomic operation decides a claim: 64 concurrent claims of one key give exactly one Acquired, the rest InProgress"},
	{name: "many_keys_8_goroutines", run: testManyKeysConcurrent,
		rule: "one atomic operation decides a claim: 1,000 keys with 8 concurrent claims each give exactly one Acquired per key"},
	{name: "many_keys_takeover_8_goroutines", run: testManyKeysTakeover,
		rule: "one atomic operation decides a takeover: up to 16 rounds of 64 expired leases, 8 concurrent claims each, take each over once"},
	{name: "concurrent_takeover", together: true, run: testConcurrentTakeover,
		rule: "a takeover is atomic too: 32 concurrent claims of an expired lease give exactly one takeover"},
	{name: "takeover_after_lease_expiry", together: true, run: testTakeover,
		rule: "after the lease ends a claim takes over: new token, strictly greater fence, attempt+1, checkpoints handed over"},
	{name: "stale_holder_changes_nothing", together: true, run: testStaleHolder,
		rule: "after a takeover the old holder's Renew, Checkpoint, Complete and Release fail with ErrLeaseLost and change nothing; tokens compare exactly"},
	{name: "late_holder_keeps_record", together: true, run: testLateHolder,
		rule: "a holder whose lease ended without a takeover still holds the record: its repeated claim keeps the fence, its writes succeed"},
	{name: "renew_extends", together: true, run: testRenew,
		rule: "Renew sets the lease to end its length after now, not after the old deadline: later or sooner than before"},
	{name: "renew_keeps_grace", together: true, run: testRenewKeepsGrace,
		rule: "a renewed lease that runs out still keeps the record for its grace, with its checkpoints, for a takeover; then it expires"},
	{name: "repeated_claim_sets_grace", together: true, run: testRepeatedClaimGrace,
		rule: "a repeated claim sets lease and grace from its own request: the record expires its new lease plus its new grace after now"},
	{name: "checkpoint_replaces", together: true, run: testCheckpointReplaces,
		rule: "Checkpoint replaces the value of its name, keeps the other names, and leaves the lease where it was"},
	{name: "release_then_reclaim", together: true, run: testRelease,
		rule: "Release deletes the holder's record; the next claim acquires afresh with a strictly greater fence; releasing again succeeds"},
	{name: "repeated_operations", together: true, run: testRepeated,
		rule: "repeating Claim, Complete or Release with the same token is safe: same fence, success, no change"},
	{name: "completed_expires_after_retention", together: true, run: testCompletedExpires,
		rule: "a completed record replays until its retention, counted from Complete and not extended by a repeat, ends; then it is absent"},
	{name: "complete_drops_checkpoints", together: true, run: testCompleteDropsCheckpoints,
		rule: "Complete drops the checkpoints: no replay returns them, nor any claim after the record expires"},
	{name: "abandoned_started_expires", together: true, run: testAbandonedExpires,
		rule: "an abandoned STARTED record keeps its checkpoints for takeover until lease plus grace, then expires"},
	{name: "expired_is_absent", together: true, run: testExpiredIsAbsent,
		rule: "an expired record is absent for every operation: writes get ErrLeaseLost, Release succeeds, any claim acquires afresh"},
	{name: "sweep_removes_only_expired", together: true, run: testSweep, needs: needsSweeper,
		rule: "Sweep deletes expired records, at most its limit and at least one a call, also concurrently, and never a live one"},
	{name: "odd_keys", together: true, run: testOddKeys,
		rule: "keys are opaque: unicode, braces, slashes, colons, spaces, case, 1024 bytes and mutual prefixes are all distinct keys"},
	{name: "scope_isolation", together: true, run: testScopeIsolation,
		rule: "storage keys built by StorageKey for different scopes and the same client key never see each other's records"},
	{name: "canceled_context", together: true, run: testCanceledContext,
		rule: "a canceled context returns the context's error and changes nothing"},
	{name: "deadline_during_operation", together: true, run: testDeadlineDuringOperation,
		rule: "an operation whose context ends while it runs returns its true outcome or an error, never a refusal of what it may have done"},
	{name: "watch_wakes", together: true, run: testWatch, needs: needsWatcher,
		rule: "Watch returns after the record completes or is released, and with the context's error when its context ends"},
	{name: "inspect_describes", together: true, run: testInspect, needs: needsInspector,
		rule: "Inspect describes a live record as its claims and writes left it (state, fingerprint, fence, lease and expiry left, result, checkpoints, in copies), and an absent or expired one as ErrNotFound"},
	{name: "purge_deletes", together: true, run: testPurge, needs: needsInspector,
		rule: "Purge deletes a record in any state: its holder's writes get ErrLeaseLost, the next claim acquires afresh with a greater fence; purging an absent key succeeds"},
	{name: "stuck_lists_ended_leases", together: true, run: testStuck, needs: needsInspector,
		rule: "Stuck lists, page by page within the limit, each STARTED record whose lease ended and which has not expired, once; never a live, renewed, taken over, completed or expired one"},
}

func needsMaxValueSize(f features) (bool, string) {
	return f.maxValue > 0, "the store declares no Limits.MaxValueSize: its limit is unknown"
}

func needsSweeper(f features) (bool, string) {
	return f.sweeper != nil, "the store has no Sweeper (or the test skips it)"
}

func needsWatcher(f features) (bool, string) {
	return f.watcher != nil, "the store has no Watcher (or the test skips it)"
}

// Run checks newStore's stores against the store contract, one subtest per
// case with a fresh store from newStore each. newStore receives the
// subtest's t (register cleanups on it) and a manual clock, which it wires
// into the store when caps.ControlledClock is set and ignores otherwise.
//
// Cases that depend on time advance the clock under ControlledClock and
// sleep otherwise. The cases that start thousands of claims run first, one
// at a time; then all the others run at once (Run returns when all are
// done), so newStore is called from several goroutines at once and must be
// safe for that. Cases for optional behaviour the store does not declare in
// (idempotency.CapabilitiesOf), or that caps.Skip names, are skipped.
//
// In real time (without caps.ControlledClock), a case of that second group
// whose first attempt fails while it ran more than half its time unit
// (200 ms) behind its planned waits, because the machine or the store
// stalled, has proved nothing: its failure is logged and the case runs
// again, alone, after the others; only that run counts. A failure without
// such a stall counts at once.
func Run(t *testing.T, newStore func(t *testing.T, clock *Clock) idempotency.Store, caps Capabilities) {
	t.Helper()
	if newStore == nil {
		t.Fatal("conformancetest: newStore is nil")
	}
	for _, part := range caps.Skip {
		if part != "watcher" && part != "inspector" && part != "sweeper" && part != "batcher" {
			t.Fatalf("conformancetest: Capabilities.Skip names %q, not one of watcher, inspector, sweeper, batcher", part)
		}
	}
	// Under real time, a together case's first attempt reports to a
	// recorder; see rerunIfDisturbed.
	var firstAttempts sync.WaitGroup
	batchDone := make(chan struct{})
	var alone sync.Mutex
	// run runs c; first, when not nil, is called once c's first attempt
	// is over (or c did not run: skipped, or filtered out by -run).
	run := func(c testCase, first func()) {
		if first != nil {
			defer first()
		}
		t.Run(c.name, func(t *testing.T) {
			if first != nil {
				defer first()
			}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("%s checks: %s", c.name, c.rule)
					if caps.ControlledClock {
						t.Log("Capabilities.ControlledClock is set: the store must judge every deadline by the clock newStore was given")
					}
				}
			})
			e := newEnv(t, newStore, caps)
			if c.needs != nil {
				if ok, why := c.needs(e.feat); !ok {
					t.Skip(why)
				}
			}
			if first == nil || caps.ControlledClock {
				c.run(e)
				return
			}
			if !rerunIfDisturbed(t, c, e) {
				return
			}
			first()
			<-batchDone
			alone.Lock()
			defer alone.Unlock()
			c.run(newEnv(t, newStore, caps))
		})
	}
	for _, c := range cases {
		if !c.together {
			run(c, nil)
		}
	}
	// The other cases mostly sleep (in real time): they run all at once,
	// from goroutines rather than with t.Parallel, whose limit of
	// GOMAXPROCS cases at a time would make the suite last several times
	// longer on a small machine.
	var wg sync.WaitGroup
	for _, c := range cases {
		if c.together {
			firstAttempts.Add(1)
			wg.Go(func() { run(c, sync.OnceFunc(firstAttempts.Done)) })
		}
	}
	go func() {
		firstAttempts.Wait()
		close(batchDone)
	}()
	wg.Wait()
}

// rerunIfDisturbed runs a real-time case's first attempt, with its
// reports recorded rather than sent to t. A case that passes, or fails
// while its own calls and waits took no longer than planned (within half
// a time unit), reports to t, and rerunIfDisturbed returns false. A case
// that fails after the machine or the store stalled for longer proved
// nothing either way (its deadlines were judged at other times than it
// meant): rerunIfDisturbed logs the failure and returns true, and the
// case runs again, alone, once every first attempt is done; only that
// run's result counts.
func rerunIfDisturbed(t *testing.T, c testCase, e *env) bool {
	rec := &recorder{}
	e.t = rec
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(e)
	}()
	<-done
	msgs := rec.messages()
	if len(msgs) == 0 {
		return false
	}
	late := time.Since(start) - time.Duration(e.waited.Load())
	if late <= e.unit/2 {
		for _, m := range msgs {
			t.Error(m)
		}
		return false
	}
	t.Logf("first attempt failed with the case %v behind its planned waits (more than half its %v time unit), so its deadlines were not judged when it meant; running it again alone. It reported:\n%s",
		late.Round(time.Millisecond), e.unit, strings.Join(msgs, "\n"))
	return true
}

// reporter is what a case reports to: the subtest's *testing.T, or a
// recorder for a real-time first attempt.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
}

// recorder keeps a first attempt's reports. Fatalf ends the calling
// goroutine, as testing.T's does.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Failed() bool { return len(r.messages()) > 0 }

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// env is what a case works with: a fresh store, its clock and helpers.
type env struct {
	t      reporter
	ctx    context.Context
	s      idempotency.Store
	caps   Capabilities
	feat   features
	clock  *Clock
	prefix string
	// unit is the time unit of leases and waits: a whole number of the
	// store's resolution, long enough for real-time stores.
	unit time.Duration
	// tol is the rounding a store may apply to a duration it reports.
	tol time.Duration
	// slack is added to a wait meant to pass a deadline.
	slack time.Duration
	// waited is the sum of the case's waits (pass) in real time, in ns.
	waited atomic.Int64
}

func newEnv(t *testing.T, newStore func(*testing.T, *Clock) idempotency.Store, caps Capabilities) *env {
	t.Helper()
	clock := NewClock(time.Now().UTC().Truncate(time.Second))
	s := newStore(t, clock)
	if s == nil {
		t.Fatal("conformancetest: newStore returned nil")
	}
	feat := featuresOf(s, caps)
	res := max(feat.resolution, time.Millisecond)
	e := &env{
		t:      t,
		ctx:    t.Context(),
		s:      s,
		caps:   caps,
		feat:   feat,
		clock:  clock,
		prefix: "ct-" + randomHex(8) + "/",
		tol:    res,
	}
	if caps.ControlledClock {
		e.unit = max(feat.resolution, time.Second)
		e.slack = res
	} else {
		e.unit = max(feat.resolution, minRealUnit)
		e.slack = e.unit
	}
	return e
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails
	return hex.EncodeToString(b)
}

var (
	fpA = idempotency.FingerprintBytes([]byte("conformancetest request A"))
	fpB = idempotency.FingerprintBytes([]byte("conformancetest request B"))
)

// key returns a storage key unique to this case.
func (e *env) key(name string) string { return e.prefix + name }

// token returns a fresh token shaped like the ones Do makes.
func (e *env) token() idempotency.Token { return idempotency.Token(randomHex(16)) }

// pass lets d go by: the controlled clock is advanced, or the case sleeps.
func (e *env) pass(d time.Duration) {
	if e.caps.ControlledClock {
		e.clock.Advance(d)
		return
	}
	e.waited.Add(int64(d))
	time.Sleep(d)
}

// passBeyond lets d and a margin go by, so that a deadline d from an
// earlier call has surely passed as the store judges it.
func (e *env) passBeyond(d time.Duration) { e.pass(d + e.slack) }

func (e *env) claim(key string, fp idempotency.Fingerprint, tok idempotency.Token, lease, grace time.Duration) idempotency.ClaimResult {
	e.t.Helper()
	res, err := e.s.Claim(e.ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tok, Lease: lease, Grace: grace})
	if err != nil {
		e.t.Fatalf("Claim(%s, token %.8s): unexpected error: %v", short(key), tok, err)
	}
	return res
}

// expect fails the case unless res has the outcome want.
func (e *env) expect(res idempotency.ClaimResult, want idempotency.Outcome, what string) {
	e.t.Helper()
	if res.Outcome != want {
		e.t.Fatalf("%s: outcome %v (fence %d, attempt %d, retry after %v), want %v",
			what, res.Outcome, res.Fence, res.Attempt, res.RetryAfter, want)
	}
}

// acquire claims key afresh and checks that it was acquired as a new record.
func (e *env) acquire(key string, fp idempotency.Fingerprint, tok idempotency.Token, lease, grace time.Duration) idempotency.ClaimResult {
	e.t.Helper()
	res := e.claim(key, fp, tok, lease, grace)
	e.expect(res, idempotency.OutcomeAcquired, "claim of absent key "+short(key))
	if res.Attempt != 1 {
		e.t.Errorf("claim of absent key %s: attempt %d, want 1", short(key), res.Attempt)
	}
	if res.Fence < 1 {
		e.t.Errorf("claim of absent key %s: fence %d, want >= 1", short(key), res.Fence)
	}
	return res
}

// replay claims key with a fresh token, expects a replay and returns it.
func (e *env) replay(key string, fp idempotency.Fingerprint, what string) idempotency.ClaimResult {
	e.t.Helper()
	res := e.claim(key, fp, e.token(), long, 0)
	e.expect(res, idempotency.OutcomeReplay, what)
	return res
}

// replayEquals checks that key replays want.
func (e *env) replayEquals(key string, fp idempotency.Fingerprint, want []byte, what string) {
	e.t.Helper()
	res := e.replay(key, fp, what)
	if !bytes.Equal(res.Result, want) {
		e.t.Errorf("%s: replayed %s, want %s", what, describe(res.Result), describe(want))
	}
}

// inProgress checks that another token finds key in progress.
func (e *env) inProgress(key string, what string) idempotency.ClaimResult {
	e.t.Helper()
	res := e.claim(key, fpA, e.token(), long, 0)
	e.expect(res, idempotency.OutcomeInProgress, what)
	return res
}

// noErr fails the case when err is not nil.
func (e *env) noErr(err error, what string) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

// isErr fails the case unless errors.Is(err, target).
func (e *env) isErr(err, target error, what string) {
	e.t.Helper()
	if !errors.Is(err, target) {
		e.t.Errorf("%s: error %v, want one matching %v", what, err, target)
	}
}

func (e *env) complete(key string, tok idempotency.Token, result []byte, retention time.Duration) {
	e.t.Helper()
	e.noErr(e.s.Complete(e.ctx, key, tok, result, retention), "Complete("+short(key)+")")
}

func (e *env) checkpoint(key string, tok idempotency.Token, name string, value []byte) {
	e.t.Helper()
	e.noErr(e.s.Checkpoint(e.ctx, key, tok, name, value), "Checkpoint("+short(key)+", "+name+")")
}

// checkpointsEqual compares checkpoint maps: the same names with the same
// bytes (nil and empty values are equal).
func (e *env) checkpointsEqual(got, want map[string][]byte, what string) {
	e.t.Helper()
	ok := len(got) == len(want)
	for name, w := range want {
		g, found := got[name]
		if !found || !bytes.Equal(g, w) {
			ok = false
		}
	}
	if !ok {
		e.t.Errorf("%s: checkpoints %s, want %s", what, describeMap(got), describeMap(want))
	}
}

// short shortens a key for messages.
func short(key string) string {
	if len(key) > 60 {
		return fmt.Sprintf("%q...(%d bytes)", key[:60], len(key))
	}
	return fmt.Sprintf("%q", key)
}

// describe renders a value for messages without printing a megabyte.
func describe(b []byte) string {
	if b == nil {
		return "nil"
	}
	if len(b) > 32 {
		return fmt.Sprintf("%d bytes %x...", len(b), b[:32])
	}
	return fmt.Sprintf("%d bytes %q", len(b), b)
}

func describeMap(m map[string][]byte) string {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			buf.WriteString(", ")
		}
		fmt.Fprintf(&buf, "%q: %s", k, describe(m[k]))
	}
	buf.WriteByte('}')
	return buf.String()
}
