package conformancetest_test

import (
	"context"
	"slices"
	"time"

	"github.com/exactlyonce/idempotency"
)

// The reference store's Batcher, item by item through its own calls, and
// the faults a batched store could have.
func init() {
	for fault, cases := range map[string][]string{
		// ClaimBatch answers the items in the wrong order.
		"batch_misaligned": {"batch_claims_as_claims"},
		// ClaimBatch checks that each key is absent, then creates its
		// record in a second step, as a batched read-then-insert would.
		"batch_racy_claims": {"batch_racing_single_claims"},
		// A repeated ClaimBatch takes its own record over, with a new
		// fence, as a batch that ignores the holder's token would.
		"batch_repeat_new_fence": {"batch_repeat_same_tokens"},
		// FinishBatch writes each record whatever its token.
		"batch_unfenced_finish": {"batch_finish_per_item"},
	} {
		brokenStores[fault] = cases
	}
}

func (s *refStore) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	res, errs := make([]idempotency.ClaimResult, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		switch s.fault {
		case "batch_racy_claims":
			key := s.key(r.Key)
			s.mu.Lock()
			absent := s.liveLocked(key, s.now()) == nil
			s.mu.Unlock()
			if absent {
				time.Sleep(time.Millisecond)
				s.mu.Lock()
				res[i] = s.createLocked(key, nil, r, s.now())
				s.mu.Unlock()
				continue
			}
		case "batch_repeat_new_fence":
			key := s.key(r.Key)
			s.mu.Lock()
			if rec := s.liveLocked(key, s.now()); rec != nil && !rec.completed && s.sameToken(rec.token, r.Token) {
				res[i] = s.takeoverLocked(rec, r, rec.attempt, s.now())
				s.mu.Unlock()
				continue
			}
			s.mu.Unlock()
		}
		res[i], errs[i] = s.Claim(ctx, r)
	}
	if s.fault == "batch_misaligned" && len(res) > 1 {
		slices.Reverse(res)
		slices.Reverse(errs)
	}
	return res, errs
}

func (s *refStore) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	errs := make([]error, len(items))
	for i, f := range items {
		if s.fault == "batch_unfenced_finish" {
			s.mu.Lock()
			if rec := s.recs[s.key(f.Key)]; rec != nil {
				if f.Release {
					delete(s.recs, s.key(f.Key))
				} else {
					rec.completed, rec.result, rec.expires = true, append([]byte(nil), f.Result...), s.now().Add(f.Retention)
				}
			}
			s.mu.Unlock()
			continue
		}
		if f.Release {
			errs[i] = s.Release(ctx, f.Key, f.Token)
		} else {
			errs[i] = s.Complete(ctx, f.Key, f.Token, f.Result, f.Retention)
		}
	}
	return errs
}
