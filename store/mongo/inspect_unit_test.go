package mongo

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestStuckQueryFitsTheIndex checks the query Stuck sends against the
// partial index Migrate creates: the index holds STARTED records only and
// the filter asks for exactly that state (so the server can use it), the
// sort is the index's key, and the lease deadline is bounded above by the
// server's now (so running leases are never read).
func TestStuckQueryFitsTheIndex(t *testing.T) {
	keys, partial := startedIndex()
	if !slices.Equal(fields(keys), []string{fieldLease, fieldID}) || len(partial) != 1 || partial[0].Key != fieldState || partial[0].Value != stateStarted {
		t.Fatalf("index %v partial on %v, want {l: 1, _id: 1} on STARTED records", keys, partial)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	paged := stuckFilter(now, stuckCursor{lease: 5, key: "k", set: true})
	if from := paged[1].Value.(bson.D)[0]; from.Key != "$gte" || from.Value != bson.DateTime(5) {
		t.Errorf("a later page's filter %v does not start the deadline's range at the cursor's", paged)
	}
	for _, f := range []bson.D{stuckFilter(now, stuckCursor{}), paged} {
		if f[0].Key != fieldState || f[0].Value != stateStarted {
			t.Errorf("filter %v does not start with the state equality of the partial index", f)
		}
		bounds := f[1].Value.(bson.D)
		if last := bounds[len(bounds)-1]; f[1].Key != fieldLease || last.Key != "$lte" || last.Value != bson.NewDateTimeFromTime(now) {
			t.Errorf("filter %v does not bound the lease deadline by now", f)
		}
	}
	s, m, _ := modelStore(t, nil)
	if err := s.Migrate(bg); err != nil || !m.started || !m.ttl {
		t.Errorf("Migrate: %v; the TTL index %v, the STARTED index %v", err, m.ttl, m.started)
	}
	s, m, _ = modelStore(t, &Options{SkipIndex: true})
	if err := s.Migrate(bg); err != nil || m.started || m.ttl {
		t.Errorf("Migrate with SkipIndex: %v; created the TTL index %v, the STARTED index %v", err, m.ttl, m.started)
	}
}

// TestStuckPages lists stuck records that share one lease deadline (to
// the millisecond), with keys stored as strings and as binary (not
// UTF-8), in pages of 1 to 4: each is listed once, in the index's order,
// and no live, completed, released or expired record is listed.
func TestStuckPages(t *testing.T) {
	s, _, clock := modelStore(t, nil)
	var want []string
	for i := range 6 {
		k := fmt.Sprintf("s-%d", i)
		want = append(want, k)
		claimOK(t, s, k, "fp", "tok", time.Second, time.Hour)
	}
	for i := range 3 {
		k := fmt.Sprintf("b-\xff%d", i) // not UTF-8: stored as binary
		want = append(want, k)
		claimOK(t, s, k, "fp", "tok", time.Second, time.Hour)
	}
	clock.Advance(time.Millisecond)
	late := "later"
	want = append(want, late)
	claimOK(t, s, late, "fp", "tok", time.Second, time.Hour)
	claimOK(t, s, "live", "fp", "tok", time.Hour, time.Hour)
	claimOK(t, s, "done", "fp", "tok", time.Second, time.Hour)
	if err := s.Complete(bg, "done", "tok", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	claimOK(t, s, "released", "fp", "tok", time.Second, time.Hour)
	if err := s.Release(bg, "released", "tok"); err != nil {
		t.Fatal(err)
	}
	claimOK(t, s, "expired", "fp", "tok", time.Second, 0)
	claimOK(t, s, "renewed", "fp", "tok", time.Second, time.Hour)
	clock.Advance(500 * time.Millisecond)
	if err := s.Renew(bg, "renewed", "tok", time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)

	for limit := 1; limit <= 4; limit++ {
		var got []string
		cursor := ""
		for page := 0; ; page++ {
			if page > 20 {
				t.Fatalf("limit %d: still listing after %d pages", limit, page)
			}
			infos, next, err := s.Stuck(bg, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(infos))
			}
			for _, info := range infos {
				got = append(got, info.Key)
				if info.State != idempotency.StateStarted || info.LeaseLeft != 0 || info.ExpiresIn <= 0 || info.Attempt != 1 || info.Fence == 0 {
					t.Errorf("listed %+v", info)
				}
			}
			if next == "" {
				break
			}
			cursor = next
		}
		// The index's order: deadline, then _id, strings before binary.
		wantOrder := append(slices.Sorted(slices.Values(want[:6])), want[6:]...)
		if !slices.Equal(got, wantOrder) {
			t.Errorf("limit %d: listed %q, want %q", limit, got, wantOrder)
		}
	}
	if _, _, err := s.Stuck(bg, "not a cursor", 1); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Stuck with a made-up cursor: %v, want ErrInvalidArgument", err)
	}
	if _, _, err := s.Stuck(bg, "", 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Stuck with limit 0: %v, want ErrInvalidArgument", err)
	}
}

// TestInspectAndPurge checks Inspect's reading of each state by the
// model's clock, and that Purge leaves a released record that keeps the
// fence growing: the next claim's fence is above the purged record's,
// even one ahead of the clock.
func TestInspectAndPurge(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	claimOK(t, s, "k", "fp", "t1", 10*time.Second, 5*time.Second)
	if err := s.Checkpoint(bg, "k", "t1", "step", []byte("one")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	info, err := s.Inspect(bg, "k")
	if err != nil || info.State != idempotency.StateStarted || info.LeaseLeft != 9*time.Second || info.ExpiresIn != 14*time.Second || string(info.Checkpoints["step"]) != "one" {
		t.Fatalf("Inspect of a STARTED record: %+v, %v", info, err)
	}
	if err := s.Complete(bg, "k", "t1", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	info, err = s.Inspect(bg, "k")
	if err != nil || info.State != idempotency.StateCompleted || string(info.Result) != "r" || info.LeaseLeft != 0 || info.ExpiresIn != time.Hour {
		t.Fatalf("Inspect of a COMPLETED record: %+v, %v", info, err)
	}
	// A fence ahead of the clock, as after takeovers within a millisecond.
	ahead := clock.ms() + 1000
	m.set("k", setField(m.doc("k"), fieldFence, ahead))
	if err := s.Purge(bg, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(bg, "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Inspect after Purge: %v, want ErrNotFound", err)
	}
	if err := s.Complete(bg, "k", "t1", []byte("again"), time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("the purged holder's Complete: %v, want ErrLeaseLost", err)
	}
	if res := claimOK(t, s, "k", "fp", "t2", time.Second, 0); res.Fence != ahead+1 || res.Attempt != 1 {
		t.Errorf("claim after Purge: fence %d attempt %d, want %d, 1", res.Fence, res.Attempt, ahead+1)
	}
	if err := s.Purge(bg, "absent"); err != nil || m.doc("absent") != nil {
		t.Errorf("Purge of an absent key: %v, left %v", err, m.doc("absent"))
	}
	m.set("odd", bson.D{{Key: fieldID, Value: "odd"}, {Key: fieldState, Value: "frozen"}, {Key: fieldExpires, Value: bson.NewDateTimeFromTime(clock.Now().Add(time.Hour))}})
	// A state the store never writes is not live, as a claim would find
	// (and overwrite) it.
	if _, err := s.Inspect(bg, "odd"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Inspect of a record of unknown state: %v, want ErrNotFound", err)
	}
}
