package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestUnknownStateIsCorrupt: the table has no CHECK on state (see
// schema.sql), so a row written by hand, or by another program, may hold
// any state. Such a row is reported as corrupt by every operation that
// reads it, in both claim orders, and never acted on: Claim and Inspect
// give ErrCorrupt naming the key and the state, Complete, Renew and Release find no
// record they hold, and the row is left as it was.
func TestUnknownStateIsCorrupt(t *testing.T) {
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("readFirst=%v", readFirst), func(t *testing.T) {
			pool, s, qualified := pinnedStore(t, "state_", readFirst)
			ctx := t.Context()

			req := idempotency.ClaimRequest{Key: "k", Fingerprint: "fp", Token: "t1", Lease: time.Minute, Grace: time.Minute}
			if res, err := s.Claim(ctx, req); err != nil || res.Outcome != idempotency.OutcomeAcquired {
				t.Fatalf("claim: %+v, %v", res, err)
			}
			if _, err := pool.Exec(ctx, "UPDATE "+qualified+" SET state = 'paused' WHERE key = 'k'"); err != nil {
				t.Fatal(err)
			}
			row := func() string {
				var v string
				if err := pool.QueryRow(ctx, "SELECT state || '/' || token || '/' || fence FROM "+qualified+" WHERE key = 'k'").Scan(&v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			before := row()

			for _, tok := range []idempotency.Token{"t1", "t2"} {
				req.Token = tok
				res, err := s.Claim(ctx, req)
				if !errors.Is(err, idempotency.ErrCorrupt) || !containsAll(err.Error(), `"k"`, `"paused"`) {
					t.Errorf("claim under %s: %+v, %v; want ErrCorrupt naming the key and the state", tok, res, err)
				}
			}
			if info, err := s.Inspect(ctx, "k"); !errors.Is(err, idempotency.ErrCorrupt) || !containsAll(err.Error(), `"k"`, `"paused"`) {
				t.Errorf("inspect: %+v, %v; want ErrCorrupt naming the key and the state", info, err)
			}
			if err := s.Complete(ctx, "k", "t1", []byte("r"), time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("complete: %v, want ErrLeaseLost", err)
			}
			if err := s.Renew(ctx, "k", "t1", time.Minute); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("renew: %v, want ErrLeaseLost", err)
			}
			if err := s.Release(ctx, "k", "t1"); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("release: %v, want ErrLeaseLost", err)
			}
			if after := row(); after != before {
				t.Errorf("the row changed from %s to %s", before, after)
			}
		})
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// pinnedStore returns a pool, a store on a new table named prefix and
// random hex digits, whose claims start with the read when readFirst (see
// postgres.PinClaimOrder), and the table's quoted, qualified name.
func pinnedStore(t *testing.T, prefix string, readFirst bool) (*pgxpool.Pool, *postgres.Store, string) {
	t.Helper()
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	table := prefix + randomHex(4)
	s := newStore(t, pool, &postgres.Options{Table: table})
	postgres.PinClaimOrder(s, readFirst)
	return pool, s, pgx.Identifier{testSchema, table}.Sanitize()
}
