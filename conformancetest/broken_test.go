package conformancetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
)

// Testing the tester: refStore below is a small store written for these
// tests alone (not store/memory), and each fault switches on one
// deliberate bug in it. The suite must fail the store in the cases written
// for that bug. TestBrokenStore runs the suite against the store with the
// fault named by brokenEnv (with none, it must pass everything);
// TestSuiteCatchesBrokenStores runs it in a subprocess per fault, since a
// failing subtest fails its whole test binary.

const brokenEnv = "CONFORMANCETEST_BROKEN_STORE"

// brokenStores maps each fault to the cases that must fail it. Every case
// but fresh_claim, the control that a broken store otherwise works, is
// listed for at least one fault.
var brokenStores = map[string][]string{
	// Read, then write: concurrent claims all see the key absent.
	"racy_claim": {"one_key_64_goroutines", "many_keys_8_goroutines"},
	// A takeover reads the expired lease, then writes without condition:
	// claims that read before the first write all take over. Between the
	// two steps it only decodes and encodes the record (microseconds), so
	// one burst on one key (concurrent_takeover) rarely catches it.
	"racy_takeover": {"many_keys_takeover_8_goroutines"},
	// Complete ignores the token: a stale holder overwrites the new one.
	"unfenced_complete": {"stale_holder_changes_nothing", "repeated_operations"},
	// Release ignores the token: a stale holder deletes the new holder's record.
	"unfenced_release": {"stale_holder_changes_nothing", "release_then_reclaim"},
	// Tokens compare case-insensitively, as some database collations do.
	"token_folded": {"stale_holder_changes_nothing"},
	// Records never expire (leases still end).
	"ignored_expiry": {"completed_expires_after_retention", "abandoned_started_expires", "sweep_removes_only_expired", "expired_is_absent"},
	// Writes under a lease do not check expiry: an expired record comes back.
	"expired_writes_land": {"expired_is_absent", "abandoned_started_expires"},
	// Release checks token and state before expiry: an expired record
	// another held, or a COMPLETED one, refuses to be released.
	"expired_release_refused": {"expired_is_absent"},
	// A claim matches the token before it checks expiry: the expired
	// holder's claim repeats instead of acquiring afresh.
	"expired_old_token_repeats": {"expired_is_absent"},
	// A takeover keeps the old holder's fence.
	"takeover_keeps_fence": {"takeover_after_lease_expiry", "concurrent_takeover", "many_keys_takeover_8_goroutines"},
	// Fences count per record and restart when a record is re-created.
	"fence_restarts": {"release_then_reclaim", "completed_expires_after_retention", "abandoned_started_expires"},
	// Leases last three quarters of what was asked.
	"short_lease": {"in_progress_retry_after"},
	// Deadlines are judged by the wall clock, not the clock the store was given.
	"wall_clock": {"in_progress_retry_after", "takeover_after_lease_expiry"},
	// The holder's claim after its lease ended is a takeover of its own record.
	"late_repeat_takes_over": {"late_holder_keeps_record"},
	// Writes after the end of the lease fail, though nobody took over.
	"late_writes_refused": {"late_holder_keeps_record"},
	// Renew answers success without extending anything.
	"renew_ignored": {"renew_extends", "stale_holder_changes_nothing"},
	// Renew adds the new lease to the old deadline instead of to now.
	"renew_from_deadline": {"renew_extends"},
	// Renew never moves a deadline earlier.
	"renew_only_extends": {"renew_extends"},
	// Renew sets the record to expire with its lease, forgetting the grace.
	"renew_drops_grace": {"renew_keeps_grace"},
	// A repeated claim keeps the grace of the first.
	"repeat_keeps_grace": {"repeated_claim_sets_grace"},
	// Checkpoint keeps the first value of a name (an insert that ignores conflicts).
	"checkpoint_keeps_first": {"checkpoint_replaces"},
	// Checkpoint sets the lease anew, like a Renew.
	"checkpoint_extends_lease": {"checkpoint_replaces"},
	// Checkpoint keeps the caller's slice.
	"aliased_checkpoint_in": {"checkpoints_copied"},
	// Claims hand out the store's own checkpoint map and values.
	"aliased_checkpoints_out": {"checkpoints_copied"},
	// Replays hand out the caller's own slice given to Complete.
	"aliased_result": {"replay_exact_bytes"},
	// A result over the limit is cut to the limit and stored, then refused.
	"too_large_writes": {"too_large"},
	// Retention is counted from the claim, not from Complete.
	"retention_from_claim": {"completed_expires_after_retention"},
	// A repeated Complete sets the retention anew.
	"repeat_complete_extends": {"completed_expires_after_retention"},
	// Complete leaves the checkpoints, and re-creating the record over a
	// COMPLETED one keeps them.
	"complete_keeps_checkpoints": {"complete_drops_checkpoints"},
	// Operations go ahead with a canceled context.
	"context_ignored": {"canceled_context"},
	// A reply lost to the context's end is reported as a refusal
	// (ErrLeaseLost, or InProgress for a claim) though the write landed.
	"reply_lost_as_refusal": {"deadline_during_operation"},
	// Watch never wakes before its context ends.
	"deaf_watch": {"watch_wakes"},
	// Sweep deletes nothing.
	"sweep_noop": {"sweep_removes_only_expired"},
	// Sweep deletes every expired record, whatever the limit.
	"sweep_over_limit": {"sweep_removes_only_expired"},
	// Sweep deletes STARTED records whose lease ended, ignoring the grace.
	"sweep_ignores_grace": {"sweep_removes_only_expired"},
	// Sweep judges records by the expiry their acquiring claim set,
	// ignoring Renew, repeated claims and Complete.
	"sweep_claim_expiry": {"sweep_removes_only_expired"},
	// A different fingerprint is answered as in progress, not refused.
	"mismatch_as_in_progress": {"mismatch"},
	// Fingerprints compare case-insensitively and trimmed, as some collations do.
	"fingerprint_folded": {"mismatch"},
	// RetryAfter is the whole lease, however much of it is left.
	"retry_after_full_lease": {"in_progress_retry_after"},
	// Keys are case-folded and trimmed, as some database collations do.
	"collapsing_keys": {"odd_keys"},
	// Keys are cut to what follows their last colon, as a store that
	// parses "prefix:id" keys might.
	"last_colon_part": {"scope_isolation", "odd_keys"},
	// Inspect shows expired records, as a store that forgets to filter
	// its read by expiry would.
	"inspect_shows_expired": {"inspect_describes"},
	// Inspect hands out the store's own checkpoint map and result.
	"inspect_aliases": {"inspect_describes"},
	// Purge deletes the record, and the fence counter with it: the next
	// claim gets the purged record's fence again.
	"purge_reuses_fence": {"purge_deletes"},
	// Purge deletes only COMPLETED records, as a "delete where state =
	// completed" might.
	"purge_completed_only": {"purge_deletes"},
	// Stuck lists STARTED records whatever their lease.
	"stuck_includes_live": {"stuck_lists_ended_leases"},
	// Stuck looks only at records about to expire (a sweep-style query
	// by expiry), and misses the stuck ones with a long grace.
	"stuck_by_expiry": {"stuck_lists_ended_leases"},
	// Stuck's cursor is the first key of the page, so pages overlap.
	"stuck_cursor_repeats": {"stuck_lists_ended_leases"},
	// Stuck returns everything in one page, whatever the limit.
	"stuck_ignores_limit": {"stuck_lists_ended_leases"},
}

// probabilistic faults are caught in most runs, not all: their subprocess
// runs the suite three times, and one failure of each case is enough.
var probabilistic = map[string]bool{"racy_claim": true, "racy_takeover": true, "batch_racy_claims": true}

const refMaxValue = 64 << 10

var refCaps = conformancetest.Capabilities{ControlledClock: true}

// Capabilities declares the reference store's parts (all of them) and its
// value limit, which the suite reads.
func (s *refStore) Capabilities() idempotency.Capabilities {
	return idempotency.Capabilities{Watcher: s, Inspector: s, Sweeper: s, Batcher: s,
		Limits: idempotency.Limits{MaxValueSize: refMaxValue}}
}

// TestBrokenStore runs the suite against the store with the fault named by
// brokenEnv. Without it, it runs the suite against the store with no
// fault, showing that the failures come from the faults alone.
func TestBrokenStore(t *testing.T) {
	fault := os.Getenv(brokenEnv)
	if _, ok := brokenStores[fault]; !ok && fault != "" {
		t.Fatalf("%s=%q names no broken store", brokenEnv, fault)
	}
	conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
		return newRefStore(fault, clock)
	}, refCaps)
}

func TestSuiteCatchesBrokenStores(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("inside a broken-store subprocess")
	}
	sem := make(chan struct{}, 4) // subprocesses at once
	for fault, want := range brokenStores {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			// Run the cases meant to catch the fault, and fresh_claim as a
			// control that the broken store otherwise works.
			pattern := "^TestBrokenStore$/^(fresh_claim|" + strings.Join(want, "|") + ")$"
			count := 1
			if probabilistic[fault] {
				count = 3
			}
			cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.v", fmt.Sprintf("-test.count=%d", count), "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+fault)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed the %s store, want it to fail; output:\n%s", fault, out)
			}
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("running the %s store's suite: %v", fault, err)
			}
			for _, c := range want {
				if !regexp.MustCompile(`(?m)^\s*--- FAIL: TestBrokenStore/` + c + ` `).Match(out) {
					t.Errorf("case %s did not fail against the %s store; output:\n%s", c, fault, out)
				}
			}
			if !regexp.MustCompile(`(?m)^\s*--- PASS: TestBrokenStore/fresh_claim `).Match(out) {
				t.Errorf("control case fresh_claim did not pass against the %s store; output:\n%s", fault, out)
			}
		})
	}
}

// Every case can fail: some broken store is listed as failing it.
func TestEveryCaseHasABrokenStore(t *testing.T) {
	names, _ := conformancetest.CaseNames()
	caught := map[string]bool{}
	for _, want := range brokenStores {
		for _, c := range want {
			caught[c] = true
		}
	}
	for _, name := range names {
		if !caught[name] && name != "fresh_claim" {
			t.Errorf("case %s fails no broken store in brokenStores: add a store with the fault it exists to catch", name)
		}
	}
	for c := range caught {
		if !slices.Contains(names, c) {
			t.Errorf("brokenStores names case %s, which the suite does not have", c)
		}
	}
}

// refStore is a store kept as plain as possible: one mutex, one map,
// expiry judged on every access, fences from one counter. Its faults are
// written where the bug they stand for would live in a real adapter.
type refStore struct {
	fault string
	clock *conformancetest.Clock

	mu      sync.Mutex
	recs    map[string]*refRecord
	fence   int64
	changed chan struct{} // closed and replaced on every change, for Watch
}

type refRecord struct {
	fp        idempotency.Fingerprint
	completed bool
	token     idempotency.Token
	fence     int64
	attempt   int
	acquired  time.Time     // when the holder acquired it (retention_from_claim)
	leaseLen  time.Duration // the lease asked for (checkpoint_extends_lease, retry_after_full_lease)
	leaseEnd  time.Time
	grace     time.Duration
	expires   time.Time
	claimExp  time.Time // the expiry set by the acquiring claim (sweep_claim_expiry)
	cps       map[string][]byte
	result    []byte
}

func newRefStore(fault string, clock *conformancetest.Clock) *refStore {
	return &refStore{fault: fault, clock: clock, recs: map[string]*refRecord{}, changed: make(chan struct{})}
}

const forever = 50 * 365 * 24 * time.Hour

// replyDelay is how long a reply takes to come back in reply_lost_as_refusal.
const replyDelay = 300 * time.Microsecond

func (s *refStore) now() time.Time {
	if s.fault == "wall_clock" {
		return time.Now()
	}
	return s.clock.Now()
}

func (s *refStore) ctxErr(ctx context.Context) error {
	if s.fault == "context_ignored" {
		return nil
	}
	return ctx.Err()
}

func (s *refStore) key(key string) string {
	switch s.fault {
	case "collapsing_keys":
		return strings.ToLower(strings.TrimSpace(key))
	case "last_colon_part":
		return key[strings.LastIndexByte(key, ':')+1:]
	}
	return key
}

func (s *refStore) sameToken(a, b idempotency.Token) bool {
	if s.fault == "token_folded" {
		return strings.EqualFold(string(a), string(b))
	}
	return a == b
}

func (s *refStore) sameFingerprint(a, b idempotency.Fingerprint) bool {
	if s.fault == "fingerprint_folded" {
		return strings.EqualFold(strings.TrimSpace(string(a)), strings.TrimSpace(string(b)))
	}
	return a == b
}

// notifyLocked wakes every Watch.
func (s *refStore) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// liveLocked returns the record under key unless it is absent or expired.
func (s *refStore) liveLocked(key string, now time.Time) *refRecord {
	rec := s.recs[key]
	if rec == nil || !now.Before(rec.expires) {
		return nil
	}
	return rec
}

// leaseLocked starts rec's lease, as a claim does.
func (s *refStore) leaseLocked(rec *refRecord, now time.Time, lease, grace time.Duration) {
	if s.fault == "short_lease" {
		lease = lease * 3 / 4
	}
	rec.leaseLen, rec.leaseEnd, rec.grace = lease, now.Add(lease), grace
	rec.expires = s.expiry(rec.leaseEnd.Add(grace))
}

func (s *refStore) expiry(t time.Time) time.Time {
	if s.fault == "ignored_expiry" {
		return t.Add(forever)
	}
	return t
}

func (s *refStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := s.ctxErr(ctx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	key := s.key(r.Key)
	switch s.fault {
	case "racy_claim":
		if res, ok := s.racyClaim(key, r); ok {
			return res, nil
		}
	case "racy_takeover":
		if res, ok := s.racyTakeover(key, r); ok {
			return res, nil
		}
	}
	s.mu.Lock()
	res := s.claimLocked(key, r, s.now())
	s.mu.Unlock()
	if s.fault == "reply_lost_as_refusal" && s.replyLost(ctx) {
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeInProgress, RetryAfter: time.Second}, nil
	}
	return res, nil
}

func (s *refStore) claimLocked(key string, r idempotency.ClaimRequest, now time.Time) idempotency.ClaimResult {
	rec := s.recs[key]
	expired := rec != nil && !now.Before(rec.expires)
	if expired && s.fault == "expired_old_token_repeats" && !rec.completed && s.sameToken(rec.token, r.Token) {
		expired = false
	}
	if rec == nil || expired {
		return s.createLocked(key, rec, r, now)
	}
	res := idempotency.ClaimResult{Fence: rec.fence, Attempt: rec.attempt}
	switch {
	case !s.sameFingerprint(rec.fp, r.Fingerprint):
		res.Outcome = idempotency.OutcomeMismatch
		if s.fault == "mismatch_as_in_progress" {
			res.Outcome, res.RetryAfter = idempotency.OutcomeInProgress, time.Second
		}
	case rec.completed:
		res.Outcome, res.Result = idempotency.OutcomeReplay, clone(rec.result)
		if s.fault == "aliased_result" {
			res.Result = rec.result
		}
	case s.sameToken(rec.token, r.Token) && !(s.fault == "late_repeat_takes_over" && !now.Before(rec.leaseEnd)):
		grace := r.Grace
		if s.fault == "repeat_keeps_grace" {
			grace = rec.grace
		}
		s.leaseLocked(rec, now, r.Lease, grace)
		res.Outcome, res.Checkpoints = idempotency.OutcomeAcquired, s.cpsOut(rec)
	case now.Before(rec.leaseEnd):
		res.Outcome, res.RetryAfter = idempotency.OutcomeInProgress, rec.leaseEnd.Sub(now)
		if s.fault == "retry_after_full_lease" {
			res.RetryAfter = rec.leaseLen
		}
	default:
		return s.takeoverLocked(rec, r, rec.attempt, now)
	}
	return res
}

// createLocked makes a fresh record under key, over old if it expired.
func (s *refStore) createLocked(key string, old *refRecord, r idempotency.ClaimRequest, now time.Time) idempotency.ClaimResult {
	s.fence++
	rec := &refRecord{fp: r.Fingerprint, token: r.Token, fence: s.fence, attempt: 1, acquired: now}
	if s.fault == "fence_restarts" {
		rec.fence = 1
	}
	if s.fault == "complete_keeps_checkpoints" && old != nil && old.completed {
		rec.cps = old.cps // an upsert that clears checkpoints of STARTED rows only
	}
	s.leaseLocked(rec, now, r.Lease, r.Grace)
	rec.claimExp = rec.expires
	s.recs[key] = rec
	res := idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: rec.fence, Attempt: 1}
	if len(rec.cps) > 0 {
		res.Checkpoints = s.cpsOut(rec)
	}
	return res
}

// takeoverLocked hands rec to r.Token as attempt+1.
func (s *refStore) takeoverLocked(rec *refRecord, r idempotency.ClaimRequest, attempt int, now time.Time) idempotency.ClaimResult {
	s.fence++
	switch s.fault {
	case "takeover_keeps_fence":
	case "fence_restarts":
		rec.fence++
	default:
		rec.fence = s.fence
	}
	rec.token, rec.attempt, rec.acquired = r.Token, attempt+1, now
	s.leaseLocked(rec, now, r.Lease, r.Grace)
	rec.claimExp = rec.expires
	s.notifyLocked()
	cps := s.cpsOut(rec)
	if cps == nil {
		cps = map[string][]byte{}
	}
	return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: rec.fence, Attempt: rec.attempt, Checkpoints: cps}
}

// racyClaim creates an absent key's record in two steps: a read, then a
// blind write a millisecond later.
func (s *refStore) racyClaim(key string, r idempotency.ClaimRequest) (idempotency.ClaimResult, bool) {
	s.mu.Lock()
	absent := s.liveLocked(key, s.now()) == nil
	s.mu.Unlock()
	if !absent {
		return idempotency.ClaimResult{}, false
	}
	time.Sleep(time.Millisecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.createLocked(key, nil, r, s.now()), true
}

// racyTakeover takes over an expired lease in two steps, as a store that
// keeps records encoded might: a read that finds the lease ended, then,
// with the new record decoded and encoded in between, a write with no
// condition.
func (s *refStore) racyTakeover(key string, r idempotency.ClaimRequest) (idempotency.ClaimResult, bool) {
	s.mu.Lock()
	now := s.now()
	rec := s.liveLocked(key, now)
	ended := rec != nil && !rec.completed && rec.fp == r.Fingerprint && rec.token != r.Token && !now.Before(rec.leaseEnd)
	var wire refWire
	if ended {
		wire = refWire{Token: rec.token, Fence: rec.fence, Attempt: rec.attempt, LeaseEnd: rec.leaseEnd}
	}
	s.mu.Unlock()
	if !ended {
		return idempotency.ClaimResult{}, false
	}
	b, _ := json.Marshal(wire)
	_ = json.Unmarshal(b, &wire)
	wire.Token, wire.Attempt, wire.LeaseEnd = r.Token, wire.Attempt+1, now.Add(r.Lease)
	if _, err := json.Marshal(wire); err != nil {
		panic(err)
	}
	attempt := wire.Attempt - 1
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.takeoverLocked(rec, r, attempt, now), true
}

func (s *refStore) cpsOut(rec *refRecord) map[string][]byte {
	if s.fault == "aliased_checkpoints_out" {
		return rec.cps
	}
	if rec.cps == nil {
		return nil
	}
	m := maps.Clone(rec.cps)
	for name, v := range m {
		m[name] = clone(v)
	}
	return m
}

// replyLost, for reply_lost_as_refusal, lets the reply travel back and
// reports whether the context ended meanwhile.
func (s *refStore) replyLost(ctx context.Context) bool {
	time.Sleep(replyDelay)
	return ctx.Err() != nil
}

var errLost = fmt.Errorf("%w: refStore", idempotency.ErrLeaseLost)

// heldLocked returns the STARTED record under key held under token.
func (s *refStore) heldLocked(key string, token idempotency.Token, now time.Time) (*refRecord, error) {
	rec := s.recs[key]
	if rec == nil || !now.Before(rec.expires) && s.fault != "expired_writes_land" ||
		rec.completed || !s.sameToken(rec.token, token) ||
		s.fault == "late_writes_refused" && !now.Before(rec.leaseEnd) {
		return nil, errLost
	}
	return rec, nil
}

// write runs a write under the lease, with reply_lost_as_refusal's fault.
func (s *refStore) write(ctx context.Context, f func(now time.Time) error) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	err := f(s.now())
	s.mu.Unlock()
	if err == nil && s.fault == "reply_lost_as_refusal" && s.replyLost(ctx) {
		return errLost
	}
	return err
}

func (s *refStore) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if s.fault == "renew_ignored" {
		return nil
	}
	return s.write(ctx, func(now time.Time) error {
		rec, err := s.heldLocked(s.key(key), token, now)
		if err != nil {
			return err
		}
		end, grace := now.Add(lease), rec.grace
		switch s.fault {
		case "renew_from_deadline":
			end = rec.leaseEnd.Add(lease)
		case "renew_only_extends":
			if end.Before(rec.leaseEnd) {
				end = rec.leaseEnd
			}
		case "renew_drops_grace":
			grace = 0
		}
		rec.leaseEnd, rec.expires = end, s.expiry(end.Add(grace))
		return nil
	})
}

func (s *refStore) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if len(value) > refMaxValue {
		return fmt.Errorf("%w: refStore: checkpoint of %d bytes", idempotency.ErrTooLarge, len(value))
	}
	return s.write(ctx, func(now time.Time) error {
		rec, err := s.heldLocked(s.key(key), token, now)
		if err != nil {
			return err
		}
		if _, ok := rec.cps[name]; ok && s.fault == "checkpoint_keeps_first" {
			return nil
		}
		if rec.cps == nil {
			rec.cps = map[string][]byte{}
		}
		rec.cps[name] = clone(value)
		if s.fault == "aliased_checkpoint_in" {
			rec.cps[name] = value
		}
		if s.fault == "checkpoint_extends_lease" {
			rec.leaseEnd = now.Add(rec.leaseLen)
			rec.expires = s.expiry(rec.leaseEnd.Add(rec.grace))
		}
		return nil
	})
}

func (s *refStore) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	var tooLarge error
	if len(result) > refMaxValue {
		tooLarge = fmt.Errorf("%w: refStore: result of %d bytes", idempotency.ErrTooLarge, len(result))
		if s.fault != "too_large_writes" {
			return tooLarge
		}
		result = result[:refMaxValue]
	}
	err := s.write(ctx, func(now time.Time) error {
		rec := s.recs[s.key(key)]
		switch {
		case rec == nil || !now.Before(rec.expires) && s.fault != "expired_writes_land":
			return errLost
		case s.fault != "unfenced_complete" && !s.sameToken(rec.token, token):
			return errLost
		case rec.completed:
			if s.fault == "repeat_complete_extends" {
				rec.expires = s.expiry(now.Add(retention))
			}
			return nil // a repeated Complete that already landed
		case s.fault == "late_writes_refused" && !now.Before(rec.leaseEnd):
			return errLost
		}
		from := now
		if s.fault == "retention_from_claim" {
			from = rec.acquired
		}
		rec.completed, rec.result, rec.expires = true, clone(result), s.expiry(from.Add(retention))
		if s.fault == "aliased_result" {
			rec.result = result
		}
		if s.fault != "complete_keeps_checkpoints" {
			rec.cps = nil
		}
		s.notifyLocked()
		return nil
	})
	if err == nil {
		err = tooLarge
	}
	return err
}

func (s *refStore) Release(ctx context.Context, key string, token idempotency.Token) error {
	return s.write(ctx, func(now time.Time) error {
		key := s.key(key)
		rec := s.recs[key]
		switch {
		case rec == nil || !now.Before(rec.expires) && s.fault != "expired_release_refused":
			return nil // absent or expired
		case s.fault != "unfenced_release" && !s.sameToken(rec.token, token), rec.completed:
			return errLost
		case s.fault == "late_writes_refused" && !now.Before(rec.leaseEnd):
			return errLost
		}
		delete(s.recs, key)
		s.notifyLocked()
		return nil
	})
}

func (s *refStore) Sweep(ctx context.Context, limit int) (int, error) {
	if err := s.ctxErr(ctx); err != nil {
		return 0, err
	}
	if s.fault == "sweep_noop" {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for key, rec := range s.recs {
		if limit > 0 && n >= limit && s.fault != "sweep_over_limit" {
			break
		}
		dead := !now.Before(rec.expires)
		switch s.fault {
		case "sweep_ignores_grace":
			dead = dead || !rec.completed && !now.Before(rec.leaseEnd)
		case "sweep_claim_expiry":
			dead = !now.Before(rec.claimExp)
		}
		if dead {
			delete(s.recs, key)
			n++
		}
	}
	return n, nil
}

func (s *refStore) Watch(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.fault == "deaf_watch" {
		<-ctx.Done()
		return ctx.Err()
	}
	s.mu.Lock()
	changed := s.changed
	s.mu.Unlock()
	select {
	case <-changed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// refWire is a record as racy_takeover encodes it.
type refWire struct {
	Token    idempotency.Token
	Fence    int64
	Attempt  int
	LeaseEnd time.Time
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

func (s *refStore) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	if err := s.ctxErr(ctx); err != nil {
		return idempotency.RecordInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	rec := s.liveLocked(s.key(key), now)
	if s.fault == "inspect_shows_expired" {
		rec = s.recs[s.key(key)]
	}
	if rec == nil {
		return idempotency.RecordInfo{}, idempotency.ErrNotFound
	}
	return s.infoLocked(key, rec, now), nil
}

func (s *refStore) infoLocked(key string, rec *refRecord, now time.Time) idempotency.RecordInfo {
	info := idempotency.RecordInfo{Key: key, State: idempotency.StateStarted, Fingerprint: rec.fp,
		Fence: rec.fence, Attempt: rec.attempt, ExpiresIn: rec.expires.Sub(now),
		Result: clone(rec.result), Checkpoints: s.cpsOut(rec)}
	if rec.completed {
		info.State = idempotency.StateCompleted
	} else {
		info.LeaseLeft = max(rec.leaseEnd.Sub(now), 0)
	}
	if s.fault == "inspect_aliases" {
		info.Result, info.Checkpoints = rec.result, rec.cps
	}
	return info
}

func (s *refStore) Purge(ctx context.Context, key string) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.liveLocked(s.key(key), s.now())
	switch {
	case rec == nil:
		return nil
	case s.fault == "purge_completed_only" && !rec.completed:
		return nil
	case s.fault == "purge_reuses_fence" && rec.fence == s.fence:
		s.fence--
	}
	delete(s.recs, s.key(key))
	s.notifyLocked()
	return nil
}

func (s *refStore) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if err := s.ctxErr(ctx); err != nil {
		return nil, "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var keys []string
	for k, rec := range s.recs {
		stuck := !rec.completed && !now.Before(rec.leaseEnd) && now.Before(rec.expires)
		switch s.fault {
		case "stuck_includes_live":
			stuck = !rec.completed && now.Before(rec.expires)
		case "stuck_by_expiry":
			stuck = !rec.completed && !now.Before(rec.leaseEnd) && rec.expires.Sub(now) < time.Minute
		}
		if stuck && k > cursor {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	next := ""
	if len(keys) > limit && s.fault != "stuck_ignores_limit" {
		keys = keys[:limit]
		next = keys[limit-1]
		if s.fault == "stuck_cursor_repeats" {
			next = keys[0]
		}
	}
	infos := make([]idempotency.RecordInfo, len(keys))
	for i, k := range keys {
		infos[i] = s.infoLocked(k, s.recs[k], now)
	}
	return infos, next, nil
}

var (
	_ idempotency.Store     = (*refStore)(nil)
	_ idempotency.Sweeper   = (*refStore)(nil)
	_ idempotency.Watcher   = (*refStore)(nil)
	_ idempotency.Inspector = (*refStore)(nil)
)
