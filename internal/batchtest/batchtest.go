// Package batchtest gives the adapters' tests of an idempotency.Batcher
// the calls they all make: a batch whose every item must succeed, and the
// completions of a batch of claims.
package batchtest

import (
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

// Completions completes every item of reqs with "result of <key>" as its
// result, kept for retention.
func Completions(reqs []idempotency.ClaimRequest, retention time.Duration) []idempotency.Finish {
	items := make([]idempotency.Finish, len(reqs))
	for i, r := range reqs {
		items[i] = idempotency.Finish{Key: r.Key, Token: r.Token, Result: []byte("result of " + r.Key), Retention: retention}
	}
	return items
}

// MustClaim runs b's ClaimBatch of reqs and fails the test unless it
// answered each item, every one without error and with outcome want.
func MustClaim(tb testing.TB, b idempotency.Batcher, reqs []idempotency.ClaimRequest, want idempotency.Outcome) []idempotency.ClaimResult {
	tb.Helper()
	res, errs := b.ClaimBatch(tb.Context(), reqs)
	if len(res) != len(reqs) || len(errs) != len(reqs) {
		tb.Fatalf("ClaimBatch of %d: %d results, %d errors", len(reqs), len(res), len(errs))
	}
	for i := range reqs {
		if errs[i] != nil || res[i].Outcome != want {
			tb.Fatalf("ClaimBatch item %d (%s): %+v, %v; want %v", i, reqs[i].Key, res[i], errs[i], want)
		}
	}
	return res
}

// MustFinish runs b's FinishBatch of items and fails the test unless it
// answered each item, every one without error.
func MustFinish(tb testing.TB, b idempotency.Batcher, items []idempotency.Finish) {
	tb.Helper()
	errs := b.FinishBatch(tb.Context(), items)
	if len(errs) != len(items) {
		tb.Fatalf("FinishBatch of %d: %d errors", len(items), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("FinishBatch item %d (%s): %v", i, items[i].Key, err)
		}
	}
}
