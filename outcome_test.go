package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// faultyStore is a memory store whose claims or completions fail as told.
type faultyStore struct {
	*memory.Store
	claim    func(r idempotency.ClaimRequest) (idempotency.ClaimResult, error, bool)
	complete error
}

func (s *faultyStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if s.claim != nil {
		if res, err, ok := s.claim(r); ok {
			return res, err
		}
	}
	return s.Store.Claim(ctx, r)
}

func (s *faultyStore) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if s.complete != nil {
		return s.complete
	}
	return s.Store.Complete(ctx, key, token, result, retention)
}

// TestOutcomeOfAgreesWithDo: for every error Do returns of its own (not
// fn's), OutcomeOf reads from the error the outcome Do put in the Result,
// also through another layer of wrapping; nil and an error of fn's own
// are OutcomeUnknown.
func TestOutcomeOfAgreesWithDo(t *testing.T) {
	ctx := context.Background()
	ok := func(context.Context) (string, error) { return "v", nil }
	req := func(key, fp string) idempotency.Request {
		return idempotency.Request{Scope: []string{"t"}, Key: key, Fingerprint: idempotency.Fingerprint(fp)}
	}
	newRunner := func(s idempotency.Store, opts ...idempotency.Option) *idempotency.Runner {
		r, err := idempotency.New(s, append([]idempotency.Option{idempotency.WithStoreRetries(1, time.Millisecond)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// A call of Do: on runner, for request, running fn (nil: ok).
	type call struct {
		name    string
		want    idempotency.Outcome
		runner  *idempotency.Runner
		request idempotency.Request
		fn      func(context.Context) (string, error)
	}
	mem := newRunner(memStore(nil))
	if _, err := idempotency.Do(ctx, mem, req("done", "a"), ok); err != nil {
		t.Fatal(err)
	}
	declined := errors.New("card declined")
	if _, err := idempotency.Do(ctx, mem, req("declined", "a"), func(context.Context) (string, error) {
		return "", idempotency.Permanent(declined)
	}); !errors.Is(err, declined) {
		t.Fatalf("a permanent error: %v", err)
	}
	held := make(chan struct{})
	release := make(chan struct{})
	go func() {
		_, _ = idempotency.Do(ctx, mem, req("held", "a"), func(context.Context) (string, error) {
			close(held)
			<-release
			return "v", nil
		})
	}()
	<-held
	defer close(release)

	down := newRunner(&faultyStore{Store: memStore(nil), claim: func(idempotency.ClaimRequest) (idempotency.ClaimResult, error, bool) {
		return idempotency.ClaimResult{}, errors.New("connection refused"), true
	}})
	lost := newRunner(&faultyStore{Store: memStore(nil), complete: idempotency.ErrLeaseLost})
	garbled := newRunner(&faultyStore{Store: memStore(nil), claim: func(idempotency.ClaimRequest) (idempotency.ClaimResult, error, bool) {
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeReplay, Fence: 1, Attempt: 1, Result: []byte("\xffnot a stored answer")}, nil, true
	}})
	small := newRunner(memStore(&memory.Options{MaxValueSize: 16}))
	big := func(context.Context) (string, error) { return strings.Repeat("x", 100), nil }
	// A result above the store's limit: the caller gets it, the store a
	// marker that its repeats are told of.
	if res, err := idempotency.Do(ctx, small, req("big", "a"), big); err != nil || res.Outcome != idempotency.OutcomeCompleted || len(res.Value) != 100 {
		t.Fatalf("a result above the store's limit: %v, %v", res.Outcome, err)
	}

	for _, c := range []call{
		{"in progress", idempotency.OutcomeInProgress, mem, req("held", "a"), nil},
		{"mismatch", idempotency.OutcomeMismatch, mem, req("done", "b"), nil},
		{"invalid key", idempotency.OutcomeInvalidKey, mem, req("", "a"), nil},
		{"stored error replayed", idempotency.OutcomeReplay, mem, req("declined", "a"), nil},
		{"store down", idempotency.OutcomeStoreError, down, req("k", "a"), nil},
		{"lease lost", idempotency.OutcomeLeaseLost, lost, req("k", "a"), nil},
		{"corrupt record", idempotency.OutcomeCorrupt, garbled, req("k", "a"), nil},
		{"result not stored, replayed", idempotency.OutcomeResultNotStored, small, req("big", "a"), big},
	} {
		fn := c.fn
		if fn == nil {
			fn = ok
		}
		res, err := idempotency.Do(ctx, c.runner, c.request, fn)
		if err == nil || res.Outcome != c.want {
			t.Errorf("%s: Do gave %v, %v; want outcome %v and an error", c.name, res.Outcome, err, c.want)
			continue
		}
		if got := idempotency.OutcomeOf(err); got != c.want {
			t.Errorf("%s: OutcomeOf(%v) = %v, want %v (Do's Result.Outcome)", c.name, err, got, c.want)
		}
		if got := idempotency.OutcomeOf(errors.Join(errors.New("handler"), err)); got != c.want {
			t.Errorf("%s: OutcomeOf of the error wrapped again = %v, want %v", c.name, got, c.want)
		}
	}
	if got := idempotency.OutcomeOf(nil); got != idempotency.OutcomeUnknown {
		t.Errorf("OutcomeOf(nil) = %v, want unknown", got)
	}
	if got := idempotency.OutcomeOf(declined); got != idempotency.OutcomeUnknown {
		t.Errorf("OutcomeOf(an error of fn's own) = %v, want unknown", got)
	}
}

// TestRetryAfter: the one clamp of a retry hint every edge uses: the
// holder's lease for a key in progress, a second for a store failure
// before fn ran, never below MinRetryAfter nor above the limit, and no
// hint for any other answer.
func TestRetryAfter(t *testing.T) {
	type res = idempotency.Result[string]
	for _, c := range []struct {
		name  string
		res   res
		limit time.Duration
		want  time.Duration
	}{
		{"in progress: the lease left", res{Outcome: idempotency.OutcomeInProgress, RetryAfter: 3 * time.Second}, time.Minute, 3 * time.Second},
		{"in progress: capped", res{Outcome: idempotency.OutcomeInProgress, RetryAfter: time.Hour}, 30 * time.Second, 30 * time.Second},
		{"in progress: never zero", res{Outcome: idempotency.OutcomeInProgress}, time.Minute, idempotency.MinRetryAfter},
		{"in progress: a limit below the floor", res{Outcome: idempotency.OutcomeInProgress, RetryAfter: time.Second}, time.Millisecond, idempotency.MinRetryAfter},
		{"store error before fn", res{Outcome: idempotency.OutcomeStoreError}, time.Minute, time.Second},
		{"store error before fn: capped", res{Outcome: idempotency.OutcomeStoreError}, 200 * time.Millisecond, 200 * time.Millisecond},
		{"store error after fn ran", res{Outcome: idempotency.OutcomeStoreError, Ran: true}, time.Minute, 0},
		{"completed", res{Outcome: idempotency.OutcomeCompleted, Ran: true}, time.Minute, 0},
		{"replay", res{Outcome: idempotency.OutcomeReplay, Replayed: true}, time.Minute, 0},
		{"mismatch", res{Outcome: idempotency.OutcomeMismatch}, time.Minute, 0},
		{"invalid key", res{Outcome: idempotency.OutcomeInvalidKey}, time.Minute, 0},
		{"lease lost", res{Outcome: idempotency.OutcomeLeaseLost}, time.Minute, 0},
	} {
		if got := idempotency.RetryAfter(c.res, c.limit); got != c.want {
			t.Errorf("%s: RetryAfter = %v, want %v", c.name, got, c.want)
		}
	}
}
