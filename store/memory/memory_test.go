package memory_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/memory"
)

func TestConformance(t *testing.T) {
	var caps conformancetest.Capabilities
	t.Run("controlled_clock", func(t *testing.T) {
		caps := caps
		caps.ControlledClock = true
		conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
			return memStore(&memory.Options{Now: clock.Now})
		}, caps)
	})
	t.Run("colliding_hashes", func(t *testing.T) {
		// Every key under one of two hashes: records share chains, which
		// every operation must walk and unlink from correctly.
		caps := caps
		caps.ControlledClock = true
		conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
			return memory.NewWithHash(&memory.Options{Now: clock.Now}, func(key string) uint64 { return uint64(len(key) % 2) })
		}, caps)
	})
	t.Run("real_time", func(t *testing.T) {
		conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
			return memStore(nil)
		}, caps)
	})
	t.Run("one_second_resolution", func(t *testing.T) {
		// A store whose leases count in whole seconds, as etcd's do: the
		// suite sizes its real-time cases from the Resolution it declares.
		conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
			return secondStore{memStore(nil)}
		}, caps)
	})
	t.Run("small_limit", func(t *testing.T) {
		caps := caps
		caps.ControlledClock = true
		conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
			return memStore(&memory.Options{Now: clock.Now, MaxValueSize: 1000})
		}, caps)
	})
}

// secondStore rounds every duration up to whole seconds, and says so.
type secondStore struct{ *memory.Store }

func (s secondStore) Capabilities() idempotency.Capabilities {
	c := s.Store.Capabilities()
	c.Limits.Resolution = time.Second
	return c
}

func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}

func (s secondStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	r.Lease, r.Grace = ceilSecond(r.Lease), ceilSecond(r.Grace)
	return s.Store.Claim(ctx, r)
}

func (s secondStore) Renew(ctx context.Context, key string, tok idempotency.Token, lease time.Duration) error {
	return s.Store.Renew(ctx, key, tok, ceilSecond(lease))
}

func (s secondStore) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, retention time.Duration) error {
	return s.Store.Complete(ctx, key, tok, result, ceilSecond(retention))
}

func BenchmarkStore(b *testing.B) {
	conformancetest.Benchmark(b, func(b *testing.B) idempotency.Store { return memStore(nil) })
}

var ctx = context.Background()

func claim(t *testing.T, s *memory.Store, key string, tok idempotency.Token, lease, grace time.Duration) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: tok, Lease: lease, Grace: grace})
	if err != nil {
		t.Fatalf("Claim(%s): %v", key, err)
	}
	return res
}

// Expired records are deleted by later operations, without Sweep and
// without a background goroutine, so a long-running process stays bounded.
func TestMemoryStaysBoundedWithoutSweep(t *testing.T) {
	clock := conformancetest.NewClock(time.Unix(1e9, 0))
	s := memStore(&memory.Options{Now: clock.Now})
	const n = 1000
	for i := range n {
		key := fmt.Sprint("started-", i)
		claim(t, s, key, "t", time.Second, time.Second)
		if i%2 == 0 { // half of them completed, kept for a minute
			if err := s.Complete(ctx, key, "t", []byte("result"), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.Len() != n {
		t.Fatalf("Len() = %d after %d claims, want %d", s.Len(), n, n)
	}
	clock.Advance(2 * time.Second) // the started half expires, the completed half stays
	for i := range 150 {
		claim(t, s, fmt.Sprint("new-", i), "t", time.Hour, 0)
	}
	// Each operation deletes up to 4 expired records: 150 claims delete the
	// 500 expired ones and add 150.
	if got, want := s.Len(), n/2+150; got != want {
		t.Fatalf("Len() = %d after expiry and 150 more claims, want %d (expired records not deleted)", got, want)
	}
	clock.Advance(time.Minute) // now the completed half expires too
	for i := range 200 {
		// Replays and in-progress answers delete expired records as well.
		res := claim(t, s, fmt.Sprint("new-", i%150), "other", time.Hour, 0)
		if res.Outcome != idempotency.OutcomeInProgress {
			t.Fatalf("claim of held key: %v", res.Outcome)
		}
	}
	if got := s.Len(); got != 150 {
		t.Fatalf("Len() = %d after 200 more operations, want 150 live records", got)
	}
}

// Bytes passed in and handed out are copies: callers may reuse their
// buffers and change what they got without touching the store.
// Completed records wait for their expiry in a queue, where a deleted
// one leaves its entry until it comes up; a long-running holder stays in
// the heap of started records. Neither grows beyond what the retention
// holds, with keys that share hashes.
func TestMemoryExpiryEntriesStayBounded(t *testing.T) {
	clock := conformancetest.NewClock(time.Unix(1e9, 0))
	s := memory.NewWithHash(&memory.Options{Now: clock.Now}, func(key string) uint64 { return uint64(len(key) % 3) })
	claim(t, s, "renewed", "t", time.Second, time.Second)
	for i := range 20000 {
		clock.Advance(time.Millisecond)
		if err := s.Renew(ctx, "renewed", "t", time.Second); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprint("done-", i)
		claim(t, s, key, "t", time.Second, 0)
		retention := 100 * time.Millisecond
		if i%10 == 0 {
			retention = 50 * time.Millisecond // out of order: in the heap
		}
		if err := s.Complete(ctx, key, "t", []byte("r"), retention); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Purge(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The last 100 ms completed 100 records; half of them were purged.
	if got := s.ExpiryEntries(); got > 150 {
		t.Fatalf("%d expiry entries after 20,000 completions: entries of expired or purged records are not dropped", got)
	}
	if got := s.Len(); got > 60 {
		t.Fatalf("Len() = %d, want the unpurged records of the last 100 ms and the renewed one", got)
	}
	if _, err := s.Inspect(ctx, "renewed"); err != nil {
		t.Fatalf("the renewed record: %v", err)
	}
	clock.Advance(3 * time.Second)
	if n, err := s.Sweep(ctx, 0); err != nil || n == 0 || s.Len() != 0 || s.ExpiryEntries() != 0 {
		t.Fatalf("Sweep = %d, %v; left %d records, %d entries", n, err, s.Len(), s.ExpiryEntries())
	}
}

func TestMemoryDoesNotAlias(t *testing.T) {
	s := memStore(nil)
	claim(t, s, "k", "t", time.Second, time.Hour)
	cp := []byte("checkpoint")
	if err := s.Checkpoint(ctx, "k", "t", "step", cp); err != nil {
		t.Fatal(err)
	}
	cp[0] = 'X'
	res := claim(t, s, "k", "t", time.Second, time.Hour) // repeated claim
	if got := string(res.Checkpoints["step"]); got != "checkpoint" {
		t.Fatalf("checkpoint changed by the caller's buffer: %q", got)
	}
	res.Checkpoints["step"][0] = 'Y'
	res.Checkpoints["other"] = []byte("added")
	res = claim(t, s, "k", "t", time.Second, time.Hour)
	if got := string(res.Checkpoints["step"]); got != "checkpoint" || len(res.Checkpoints) != 1 {
		t.Fatalf("checkpoints changed through a returned map: %q", res.Checkpoints)
	}

	result := []byte("result")
	if err := s.Complete(ctx, "k", "t", result, time.Hour); err != nil {
		t.Fatal(err)
	}
	result[0] = 'X'
	res = claim(t, s, "k", "u", time.Second, 0)
	if !bytes.Equal(res.Result, []byte("result")) {
		t.Fatalf("result changed by the caller's buffer: %q", res.Result)
	}
	res.Result[0] = 'Y'
	if res = claim(t, s, "k", "u", time.Second, 0); !bytes.Equal(res.Result, []byte("result")) {
		t.Fatalf("result changed through an earlier replay: %q", res.Result)
	}
}

func TestMemoryOptions(t *testing.T) {
	var nilOpts *memory.Options
	for name, s := range map[string]*memory.Store{"nil": memStore(nil), "typed nil": memStore(nilOpts), "zero": memStore(&memory.Options{})} {
		res := claim(t, s, "k", "t", time.Second, 0)
		if res.Outcome != idempotency.OutcomeAcquired {
			t.Fatalf("%s options: %v", name, res.Outcome)
		}
		big := make([]byte, memory.DefaultMaxValueSize+1)
		if err := s.Complete(ctx, "k", "t", big, time.Hour); !errors.Is(err, idempotency.ErrTooLarge) {
			t.Fatalf("%s options: Complete above DefaultMaxValueSize: %v, want ErrTooLarge", name, err)
		}
		if err := s.Complete(ctx, "k", "t", big[:memory.DefaultMaxValueSize], time.Hour); err != nil {
			t.Fatalf("%s options: Complete of DefaultMaxValueSize: %v", name, err)
		}
	}

	unlimited := memStore(&memory.Options{MaxValueSize: math.MaxInt})
	claim(t, unlimited, "k", "t", time.Second, 0)
	if err := unlimited.Complete(ctx, "k", "t", make([]byte, memory.DefaultMaxValueSize+1), time.Hour); err != nil {
		t.Fatalf("MaxValueSize math.MaxInt (no limit): %v", err)
	}
	if _, err := memory.New(&memory.Options{MaxValueSize: -1}); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "MaxValueSize") {
		t.Fatalf("negative MaxValueSize: %v, want ErrInvalidArgument naming the option", err)
	}
}

func TestMemoryInvalidArguments(t *testing.T) {
	s := memStore(nil)
	for name, r := range map[string]idempotency.ClaimRequest{
		"empty key":      {Key: "", Token: "t", Lease: time.Second},
		"zero lease":     {Key: "k", Token: "t"},
		"negative lease": {Key: "k", Token: "t", Lease: -time.Second},
		"negative grace": {Key: "k", Token: "t", Lease: time.Second, Grace: -1},
	} {
		if _, err := s.Claim(ctx, r); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("Claim with %s: %v, want ErrInvalidArgument", name, err)
		}
	}
	claim(t, s, "k", "t", time.Second, 0)
	if err := s.Renew(ctx, "k", "t", 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Renew with zero lease: %v, want ErrInvalidArgument", err)
	}
	if err := s.Complete(ctx, "k", "t", nil, 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Complete with zero retention: %v, want ErrInvalidArgument", err)
	}
	if s.Len() != 1 {
		t.Errorf("Len() = %d after refused calls, want 1", s.Len())
	}
	// The record is untouched: still STARTED under t.
	if err := s.Complete(ctx, "k", "t", []byte("ok"), time.Hour); err != nil {
		t.Errorf("Complete after refused calls: %v", err)
	}
}

// A waiter on a crashed holder's record wakes when the lease ends, on the
// real clock, so it can take over without polling.
func TestMemoryWatchWakesAtLeaseEnd(t *testing.T) {
	s := memStore(nil)
	claim(t, s, "k", "crashed", 100*time.Millisecond, time.Hour)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.Watch(wctx, "k"); err != nil {
		t.Fatalf("Watch: %v, want a wake-up at the end of the lease", err)
	}
	res := claim(t, s, "k", "waiter", time.Second, 0)
	if res.Outcome != idempotency.OutcomeAcquired || res.Attempt != 2 {
		t.Fatalf("claim after the wake-up: %v attempt %d, want a takeover", res.Outcome, res.Attempt)
	}
	// Nothing to wait for on a completed or absent record.
	if err := s.Watch(ctx, "absent"); err != nil {
		t.Fatalf("Watch of an absent key: %v", err)
	}
}

func Example() {
	clock := conformancetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memory.New(&memory.Options{Now: clock.Now})
	ctx := context.Background()
	req := idempotency.ClaimRequest{
		Key:         "order-42",
		Fingerprint: idempotency.FingerprintBytes([]byte(`{"amount":1000}`)),
		Token:       "first-holder",
		Lease:       10 * time.Second,
		Grace:       time.Minute,
	}

	res, _ := store.Claim(ctx, req)
	fmt.Println(res.Outcome, "fence", res.Fence)

	retry := req
	retry.Token = "retry"
	res, _ = store.Claim(ctx, retry)
	fmt.Println(res.Outcome, "for", res.RetryAfter)

	_ = store.Complete(ctx, "order-42", "first-holder", []byte("charged"), 24*time.Hour)
	res, _ = store.Claim(ctx, retry)
	fmt.Println(res.Outcome, string(res.Result))

	clock.Advance(25 * time.Hour) // retention over: the key is free again
	res, _ = store.Claim(ctx, retry)
	fmt.Println(res.Outcome, "fence", res.Fence)
	// Output:
	// acquired fence 1
	// in_progress for 10s
	// replayed charged
	// acquired fence 2
}

// TestConcurrentReplays: replays under the read lock, beside claims,
// completions and purges of other keys, all get the stored result.
func TestConcurrentReplays(t *testing.T) {
	ctx := context.Background()
	s := memStore(nil)
	want := []byte("stored")
	if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", "t", want, time.Hour); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				if g%4 == 0 { // a writer of other keys
					key := "w" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
					tok := idempotency.Token("t" + key)
					if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "f", Token: tok, Lease: time.Minute}); err != nil {
						errs <- err.Error()
						return
					}
					if err := s.Complete(ctx, key, tok, []byte(key), time.Hour); err != nil {
						errs <- err.Error()
						return
					}
					s.Purge(ctx, key)
					continue
				}
				res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: idempotency.Token("r" + strconv.Itoa(i)), Lease: time.Minute})
				if err != nil || res.Outcome != idempotency.OutcomeReplay || string(res.Result) != string(want) {
					errs <- fmt.Sprintf("%+v, %v", res, err)
					return
				}
				res.Result[0] = 'X' // the caller's copy
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if res, _ := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "other", Token: "x", Lease: time.Minute}); res.Outcome != idempotency.OutcomeMismatch {
		t.Errorf("another fingerprint: %v, want mismatch", res.Outcome)
	}
}
