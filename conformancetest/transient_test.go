package conformancetest_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/memory"
)

// flakyStore is the memory store whose calls on the keys of the burst
// cases fail now and then with an error that decides nothing, as a loaded
// server's do ("request timed out"): one call in eight before it reaches
// the store, one in eight after it applied (its reply lost). Rule 5 allows
// both, and rule 4 makes a repeat with the same token safe.
type flakyStore struct {
	*memory.Store
	calls, failed atomic.Int64
}

var errFlaky = errors.New("flaky: request timed out")

// burstKeys are the key names the burst cases use, after the case's prefix.
var burstKeys = []string{"one-key", "many-", "takeover-", "stale-race-"}

// fail says whether a call on key fails before or after it is applied.
func (s *flakyStore) fail(key string) (before, after bool) {
	_, name, _ := strings.Cut(key, "/")
	for _, k := range burstKeys {
		if strings.HasPrefix(name, k) {
			switch s.calls.Add(1) % 8 {
			case 1:
				s.failed.Add(1)
				return true, false
			case 2:
				s.failed.Add(1)
				return false, true
			}
		}
	}
	return false, false
}

// call runs f, which applies a call on key, with fail's errors.
func (s *flakyStore) call(key string, f func() error) error {
	before, after := s.fail(key)
	if before {
		return errFlaky
	}
	if err := f(); err != nil || !after {
		return err
	}
	return errFlaky
}

func (s *flakyStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var res idempotency.ClaimResult
	err := s.call(r.Key, func() (err error) {
		res, err = s.Store.Claim(ctx, r)
		return err
	})
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	return res, nil
}

func (s *flakyStore) Renew(ctx context.Context, key string, tok idempotency.Token, lease time.Duration) error {
	return s.call(key, func() error { return s.Store.Renew(ctx, key, tok, lease) })
}

func (s *flakyStore) Checkpoint(ctx context.Context, key string, tok idempotency.Token, name string, value []byte) error {
	return s.call(key, func() error { return s.Store.Checkpoint(ctx, key, tok, name, value) })
}

func (s *flakyStore) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, retention time.Duration) error {
	return s.call(key, func() error { return s.Store.Complete(ctx, key, tok, result, retention) })
}

func (s *flakyStore) Release(ctx context.Context, key string, tok idempotency.Token) error {
	return s.call(key, func() error { return s.Store.Release(ctx, key, tok) })
}

// The burst cases repeat a call that failed with a transient error under
// the same token, and judge the answer it finally gets: a store whose
// calls fail a quarter of the time, before or after they apply, passes.
func TestBurstsRepeatTransientErrors(t *testing.T) {
	conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
		s := &flakyStore{Store: memStore(&memory.Options{Now: clock.Now})}
		t.Cleanup(func() {
			for _, c := range []string{"one_key_64_goroutines", "many_keys_8_goroutines", "many_keys_takeover_8_goroutines", "stale_writes_race_takeovers"} {
				if strings.HasSuffix(t.Name(), "/"+c) && s.failed.Load() == 0 {
					t.Errorf("no call of %s failed: the test proves nothing", c)
				}
			}
		})
		return s
	}, conformancetest.Capabilities{ControlledClock: true})
}
