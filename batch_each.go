package idempotency

import "context"

// ClaimEach claims each request with s.Claim, one call per item: the
// [Batcher] of a store with no round trip to save, and the form of a
// batch in a transaction of the caller's, where each item is one call.
func ClaimEach(ctx context.Context, s Store, reqs []ClaimRequest) ([]ClaimResult, []error) {
	results, errs := make([]ClaimResult, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		results[i], errs[i] = s.Claim(ctx, r)
	}
	return results, errs
}

// FinishEach completes or releases each item with s.Complete or
// s.Release, one call per item, as [ClaimEach] claims.
func FinishEach(ctx context.Context, s Store, items []Finish) []error {
	errs := make([]error, len(items))
	for i, f := range items {
		if f.Release {
			errs[i] = s.Release(ctx, f.Key, f.Token)
		} else {
			errs[i] = s.Complete(ctx, f.Key, f.Token, f.Result, f.Retention)
		}
	}
	return errs
}
