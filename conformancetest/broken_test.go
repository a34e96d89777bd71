package conformancetest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/memory"
)

// Testing the tester: each broken store below is the memory store with one
// deliberate fault, and the suite must fail it in the case written for
// that fault. TestBrokenStore runs the suite against the store named by
// brokenEnv; TestSuiteCatchesBrokenStores runs it in a subprocess per
// fault, since a failing subtest fails its whole test binary.

const brokenEnv = "CONFORMANCETEST_BROKEN_STORE"

// brokenStores maps each fault to the cases that must fail it.
var brokenStores = map[string][]string{
	// Read, then write: concurrent claims all see the key absent.
	"racy_claim": {"one_key_64_goroutines", "many_keys_8_goroutines"},
	// Complete ignores the token: a stale holder overwrites the new one.
	"unfenced_complete": {"stale_holder_changes_nothing", "repeated_operations"},
	// Release ignores the token: a stale holder deletes the new holder's record.
	"unfenced_release": {"stale_holder_changes_nothing", "release_then_reclaim"},
	// Records never expire (leases still end).
	"ignored_expiry": {"completed_expires_after_retention", "abandoned_started_expires", "sweep_removes_only_expired"},
	// A takeover keeps the old holder's fence.
	"takeover_keeps_fence": {"takeover_after_lease_expiry", "concurrent_takeover"},
	// Fences count per record and restart when a record is re-created.
	"fence_restarts": {"release_then_reclaim", "completed_expires_after_retention", "abandoned_started_expires"},
	// Renew answers success without extending anything.
	"renew_ignored": {"renew_extends", "stale_holder_changes_nothing"},
	// Replays hand out the caller's own slice given to Complete.
	"aliased_result": {"replay_exact_bytes"},
	// Operations go ahead with a canceled context.
	"context_ignored": {"canceled_context"},
	// Watch never wakes before its context ends.
	"deaf_watch": {"watch_wakes"},
	// Sweep deletes nothing.
	"sweep_noop": {"sweep_removes_only_expired"},
	// A different fingerprint is answered as in progress, not refused.
	"mismatch_as_in_progress": {"mismatch"},
	// RetryAfter is the whole lease, however much of it is left.
	"retry_after_full_lease": {"in_progress_retry_after"},
	// Keys are case-folded and trimmed, as some database collations do.
	"collapsing_keys": {"odd_keys"},
}

var brokenCaps = conformancetest.Capabilities{
	ControlledClock: true,
	Sweeper:         true,
	Watcher:         true,
	MaxValueSize:    memory.DefaultMaxValueSize,
}

// TestBrokenStore runs the suite against the broken store named by
// brokenEnv. Without it, it runs the suite against the same wrapper with no
// fault, showing that the failures come from the faults alone.
func TestBrokenStore(t *testing.T) {
	fault := os.Getenv(brokenEnv)
	if _, ok := brokenStores[fault]; !ok && fault != "" {
		t.Fatalf("%s=%q names no broken store", brokenEnv, fault)
	}
	conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
		return newFaulty(fault, clock)
	}, brokenCaps)
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
			cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=2m")
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

// faulty wraps the memory store with one fault (none for "").
type faulty struct {
	*memory.Store
	fault string

	mu         sync.Mutex
	seen       map[string]bool              // racy_claim: keys claimed before
	holder     map[string]idempotency.Token // the latest token acquiring each key
	firstFence map[string]int64             // takeover_keeps_fence
	lease      map[string]time.Duration     // retry_after_full_lease
	results    map[string][]byte            // aliased_result
}

func newFaulty(fault string, clock *conformancetest.Clock) *faulty {
	return &faulty{
		Store:      memory.New(&memory.Options{Now: clock.Now}),
		fault:      fault,
		seen:       map[string]bool{},
		holder:     map[string]idempotency.Token{},
		firstFence: map[string]int64{},
		lease:      map[string]time.Duration{},
		results:    map[string][]byte{},
	}
}

const forever = 50 * 365 * 24 * time.Hour

func (f *faulty) ctx(ctx context.Context) context.Context {
	if f.fault == "context_ignored" {
		return context.Background()
	}
	return ctx
}

func (f *faulty) key(key string) string {
	if f.fault == "collapsing_keys" {
		return strings.ToLower(strings.TrimSpace(key))
	}
	return key
}

func (f *faulty) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	r.Key = f.key(r.Key)
	if f.fault == "ignored_expiry" {
		r.Grace = forever
	}
	var seen bool
	if f.fault == "racy_claim" {
		f.mu.Lock()
		seen = f.seen[r.Key]
		f.mu.Unlock()
		time.Sleep(time.Millisecond) // between the read and the write
	}
	res, err := f.Store.Claim(f.ctx(ctx), r)
	if err != nil {
		return res, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.fault {
	case "racy_claim":
		if !seen && res.Outcome == idempotency.OutcomeInProgress {
			// The blind write of a read-then-write store overwrote the record.
			res = idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: res.Fence, Attempt: 1}
		}
		f.seen[r.Key] = true
	case "takeover_keeps_fence":
		if res.Outcome == idempotency.OutcomeAcquired {
			if res.Attempt == 1 {
				f.firstFence[r.Key] = res.Fence
			} else {
				res.Fence = f.firstFence[r.Key]
			}
		}
	case "fence_restarts":
		res.Fence = int64(res.Attempt)
	case "mismatch_as_in_progress":
		if res.Outcome == idempotency.OutcomeMismatch {
			res.Outcome, res.RetryAfter = idempotency.OutcomeInProgress, time.Second
		}
	case "retry_after_full_lease":
		if res.Outcome == idempotency.OutcomeAcquired {
			f.lease[r.Key] = r.Lease
		} else if res.Outcome == idempotency.OutcomeInProgress {
			res.RetryAfter = f.lease[r.Key]
		}
	case "aliased_result":
		if res.Outcome == idempotency.OutcomeReplay {
			res.Result = f.results[r.Key]
		}
	}
	if res.Outcome == idempotency.OutcomeAcquired {
		f.holder[r.Key] = r.Token
	}
	return res, nil
}

// latest returns the token of the key's latest acquirer, for faults that
// ignore the caller's token.
func (f *faulty) latest(key string, tok idempotency.Token) idempotency.Token {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h, ok := f.holder[key]; ok {
		return h
	}
	return tok
}

func (f *faulty) Renew(ctx context.Context, key string, tok idempotency.Token, lease time.Duration) error {
	if f.fault == "renew_ignored" {
		return nil
	}
	return f.Store.Renew(f.ctx(ctx), f.key(key), tok, lease)
}

func (f *faulty) Checkpoint(ctx context.Context, key string, tok idempotency.Token, name string, value []byte) error {
	return f.Store.Checkpoint(f.ctx(ctx), f.key(key), tok, name, value)
}

func (f *faulty) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, retention time.Duration) error {
	key = f.key(key)
	switch f.fault {
	case "unfenced_complete":
		tok = f.latest(key, tok)
	case "ignored_expiry":
		retention = forever
	}
	err := f.Store.Complete(f.ctx(ctx), key, tok, result, retention)
	if err == nil && f.fault == "aliased_result" {
		f.mu.Lock()
		if _, done := f.results[key]; !done {
			f.results[key] = result // kept without a copy
		}
		f.mu.Unlock()
	}
	return err
}

func (f *faulty) Release(ctx context.Context, key string, tok idempotency.Token) error {
	key = f.key(key)
	if f.fault == "unfenced_release" {
		tok = f.latest(key, tok)
	}
	return f.Store.Release(f.ctx(ctx), key, tok)
}

func (f *faulty) Sweep(ctx context.Context, limit int) (int, error) {
	if f.fault == "sweep_noop" {
		return 0, nil
	}
	return f.Store.Sweep(f.ctx(ctx), limit)
}

func (f *faulty) Watch(ctx context.Context, key string) error {
	if f.fault == "deaf_watch" {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.Store.Watch(f.ctx(ctx), f.key(key))
}
