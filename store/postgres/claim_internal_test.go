package postgres

import (
	"math"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestReadRowJudgesByTheServerClock: the plain read's row is judged as
// claimSQL judges it, by the server's clock read with it: expiry (a
// tombstone's -infinity included), the lease, the caller's own token and
// fingerprint, and the time left on a lease.
func TestReadRowJudgesByTheServerClock(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) pgtype.Timestamptz { return pgtype.Timestamptz{Time: now.Add(d), Valid: true} }
	negInf := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	posInf := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	req := idempotency.ClaimRequest{Key: "k", Fingerprint: "fp", Token: "mine"}
	cases := []struct {
		name             string
		state, fp, token string
		lease, expires   pgtype.Timestamptz
		stale            bool
		retryMicros      int64
	}{
		{"completed, live", "completed", "fp", "other", at(-time.Second), at(time.Hour), false, 0},
		{"completed, expired", "completed", "fp", "other", at(-time.Hour), at(-time.Nanosecond * 1000), true, 0},
		{"completed, expiring now", "completed", "fp", "other", at(-time.Hour), at(0), true, 0},
		{"tombstone", "started", "fp", "other", negInf, negInf, true, 0},
		{"started by another, leased", "started", "fp", "other", at(1500 * time.Millisecond), at(time.Minute), false, 1_500_000},
		{"started by another, lease ended", "started", "fp", "other", at(0), at(time.Minute), true, 0},
		{"started by another, other fingerprint, lease ended", "started", "fp2", "other", at(-time.Second), at(time.Minute), false, 0},
		{"started by me, leased", "started", "fp", "mine", at(time.Second), at(time.Minute), true, 1_000_000},
		{"started by me, other fingerprint", "started", "fp2", "mine", at(time.Second), at(time.Minute), false, 1_000_000},
		{"lease at +infinity", "started", "fp", "other", posInf, posInf, false, math.MaxInt64},
	}
	for _, c := range cases {
		rr := readRow{fence: 3, attempt: 2, fingerprint: c.fp, state: c.state, token: c.token,
			leaseUntil: c.lease, expiresAt: c.expires, now: pgtype.Timestamptz{Time: now, Valid: true}, result: []byte("r")}
		got := rr.claimRow(req)
		if got.stale != c.stale || got.retryAfterMicros != c.retryMicros || got.fence != 3 || got.attempt != 2 ||
			*got.state != c.state || *got.fingerprint != c.fp || string(got.result) != "r" || got.acquired {
			t.Errorf("%s: %+v (state %q, fingerprint %q); want stale %v, %d µs left", c.name, got, *got.state, *got.fingerprint, c.stale, c.retryMicros)
		}
	}
}
