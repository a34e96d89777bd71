package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// updates returns how many rows of table the transaction tx has updated so
// far, and how many of those updates were HOT (no new index entry).
func updates(t *testing.T, tx pgx.Tx, table string) (all, hot int64) {
	t.Helper()
	err := tx.QueryRow(t.Context(), "SELECT pg_stat_get_xact_tuples_updated($1::regclass), pg_stat_get_xact_tuples_hot_updated($1::regclass)",
		testSchema+"."+table).Scan(&all, &hot)
	if err != nil {
		t.Fatal(err)
	}
	return all, hot
}

// TestHotPathUpdatesAreHOT checks the schema's promise that a renewal, a
// checkpoint and a completion move no indexed column, so that PostgreSQL
// makes them HOT updates (a new version of the row on its page, no index
// entry): with the default grace (the retention) and with none, in Do's
// statements and in the transactional mode's. A completion with a retention
// shorter than the grace is the one exception the schema documents: it
// lowers sweep_at, an indexed column.
func TestHotPathUpdatesAreHOT(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	table := "hot_" + randomHex(6)
	newStore(t, pool, &postgres.Options{Table: table})

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	s, err := postgres.New(tx, &postgres.Options{Schema: testSchema, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string, wantHot bool, f func() error) {
		t.Helper()
		all0, hot0 := updates(t, tx, table)
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		all, hot := updates(t, tx, table)
		if all-all0 != 1 {
			t.Fatalf("%s updated %d rows, want 1", what, all-all0)
		}
		if got := hot-hot0 == 1; got != wantHot {
			t.Errorf("%s: HOT update %v, want %v", what, got, wantHot)
		}
	}
	for _, grace := range []time.Duration{time.Hour, 0} {
		key, tok := "k-"+grace.String(), idempotency.Token("tok-"+grace.String())
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "f", Token: tok, Lease: time.Minute, Grace: grace}); err != nil {
			t.Fatal(err)
		}
		step("Renew, grace "+grace.String(), true, func() error { return s.Renew(ctx, key, tok, time.Minute) })
		step("Checkpoint, grace "+grace.String(), true, func() error { return s.Checkpoint(ctx, key, tok, "step", []byte("v")) })
		step("Complete, grace "+grace.String(), true, func() error { return s.Complete(ctx, key, tok, []byte("result"), time.Hour) })
	}
	key, tok := "short-retention", idempotency.Token("tok")
	if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "f", Token: tok, Lease: time.Minute, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	step("Complete with a retention shorter than the grace", false, func() error { return s.Complete(ctx, key, tok, []byte("r"), time.Minute) })

	// The transactional mode: its claim inserts, its completion is HOT.
	onPool, err := postgres.New(pool, &postgres.Options{Schema: testSchema, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	r, err := idempotency.New(onPool)
	if err != nil {
		t.Fatal(err)
	}
	all0, hot0 := updates(t, tx, table)
	res, err := postgres.DoTx(ctx, r, tx, idempotency.Request{Key: "tx"}, func(context.Context, pgx.Tx) (string, error) { return "done", nil })
	if err != nil || res.Outcome != idempotency.OutcomeCompleted {
		t.Fatalf("DoTx: %+v, %v", res, err)
	}
	if all, hot := updates(t, tx, table); all-all0 != 1 || hot-hot0 != 1 {
		t.Errorf("DoTx: %d updates, %d of them HOT; want 1 HOT update (the completion)", all-all0, hot-hot0)
	}
}

// TestStuckPagesThroughTheTable lists, one block of the table per call,
// a table of 400 records of which every 41st and ten in a row are stuck:
// each stuck one exactly once, none else, over pages that list none, some,
// or the limit.
func TestStuckPagesThroughTheTable(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	s := newStore(t, pool, nil)
	postgres.SetStuckScan(s, 1)
	want := map[string]bool{}
	for i := range 400 {
		key, tok := fmt.Sprintf("k-%03d", i), idempotency.Token(fmt.Sprintf("tok-%03d", i))
		lease := time.Hour
		if i%41 == 0 || i >= 200 && i < 210 {
			lease, want[key] = time.Millisecond, true
		}
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "f", Token: tok, Lease: lease, Grace: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if i%7 == 3 && !want[key] {
			if err := s.Complete(ctx, key, tok, []byte("done"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(10 * time.Millisecond) // the stuck ones' leases end
	seen := map[string]int{}
	cursor, pages, empty, full := "", 0, 0, 0
	for {
		infos, next, err := s.Stuck(ctx, cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		switch len(infos) {
		case 0:
			empty++
		case 3:
			full++
		}
		for _, info := range infos {
			seen[info.Key]++
		}
		if next == "" {
			break
		}
		if next == cursor || pages > 1000 {
			t.Fatalf("the cursor does not move on: %q after %d pages", next, pages)
		}
		cursor = next
	}
	for k, n := range seen {
		if !want[k] || n != 1 {
			t.Errorf("Stuck listed %s %d times; stuck: %v", k, n, want[k])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("Stuck listed %d records, want the %d stuck ones", len(seen), len(want))
	}
	if empty == 0 || full < 2 || pages < 6 {
		t.Errorf("%d pages, %d of them empty, %d full: the listing did not page through the blocks one at a time", pages, empty, full)
	}
	if _, _, err := s.Stuck(ctx, "k-007", 3); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Stuck with a cursor it did not return: %v, want ErrInvalidArgument", err)
	}
	t.Logf("%d stuck records in %d pages, %d empty, %d full", len(seen), pages, empty, full)
}
