package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStartedIndex checks the index of STARTED records through a record's
// life: the claim writes the entry on the record's lease, a renewal and a
// takeover move it with the record, and a completion, a release and a
// purge delete it in the same transaction.
func TestStartedIndex(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	// entry returns the lease of key's index entry and of its record, or
	// ok false when the entry is absent.
	entry := func(key string) (entryLease, recordLease int64, ok bool) {
		t.Helper()
		e, err := c.Get(ctx, s.StartedKey(key))
		if err != nil {
			t.Fatal(err)
		}
		h, err := c.Get(ctx, s.Key(key))
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Kvs) == 1 {
			recordLease = h.Kvs[0].Lease
		}
		if len(e.Kvs) == 0 {
			return 0, recordLease, false
		}
		return e.Kvs[0].Lease, recordLease, true
	}
	same := func(what, key string) {
		t.Helper()
		e, h, ok := entry(key)
		if !ok || e != h || e == 0 {
			t.Errorf("%s: index entry present %v on lease %x, record on lease %x; want an entry on the record's lease", what, ok, e, h)
		}
	}
	gone := func(what, key string) {
		t.Helper()
		if _, _, ok := entry(key); ok {
			t.Errorf("%s: the index entry is still there", what)
		}
	}

	claim(t, s, "a", tok("a"), 3*time.Second, time.Minute)
	same("fresh claim", "a")
	if err := s.Renew(ctx, "a", tok("a"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	same("renewal to another lease", "a")
	if err := s.Checkpoint(ctx, "a", tok("a"), "step", []byte("1")); err != nil {
		t.Fatal(err)
	}
	same("checkpoint", "a")
	if err := s.Complete(ctx, "a", tok("a"), []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	gone("completion", "a")

	claim(t, s, "b", tok("b"), time.Second, 30*time.Second)
	if err := s.Release(ctx, "b", tok("b")); err != nil {
		t.Fatal(err)
	}
	gone("release", "b")

	claim(t, s, "c", tok("c"), time.Second, 30*time.Second)
	time.Sleep(2500 * time.Millisecond) // the live marker's lease ends
	if res := claim(t, s, "c", tok("d"), 4*time.Second, 40*time.Second); res.Attempt != 2 {
		t.Fatalf("takeover: %+v", res)
	}
	same("takeover", "c")
	if err := s.Purge(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	gone("purge", "c")
	if err := s.Renew(ctx, "c", tok("d"), time.Minute); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("the purged holder's Renew: %v, want ErrLeaseLost", err)
	}
}

// TestStuckAmongLiveHolders lists a few stuck records among more live
// holders than a page looks at, in pages of 7: every stuck record is
// listed once, no live or completed one is, some pages come back short
// with a cursor to go on from, and the pass reads no record that is
// COMPLETED.
func TestStuckAmongLiveHolders(t *testing.T) {
	c, n := countingClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	const live, stuck, completed = 1700, 25, 300
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	work := make(chan func() error)
	for range 16 {
		wg.Go(func() {
			for f := range work {
				if err := f(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	claimOne := func(key string, lease time.Duration) func() error {
		return func() error {
			_, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tok("x"), Lease: lease, Grace: time.Hour})
			return err
		}
	}
	// Most stuck records sort before the live ones, a few after them, so
	// that a page runs into more live holders than it looks at.
	want := map[string]bool{}
	for i := range stuck {
		k := fmt.Sprintf("a-%02d", i)
		if i >= stuck-5 {
			k = fmt.Sprintf("z-%02d", i)
		}
		want[k] = true
		work <- claimOne(k, time.Second)
	}
	for i := range live {
		work <- claimOne(fmt.Sprintf("m-%04d", i), time.Hour)
	}
	for i := range completed {
		k := fmt.Sprintf("done-%03d", i)
		work <- func() error {
			if err := claimOne(k, time.Second)(); err != nil {
				return err
			}
			return s.Complete(ctx, k, tok("x"), []byte("r"), time.Hour)
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	time.Sleep(2500 * time.Millisecond) // the stuck ones' leases end

	seen := map[string]int{}
	cursor, pages, short := "", 0, 0
	before := n.n.Load()
	for {
		infos, next, err := s.Stuck(ctx, cursor, 7)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(infos) > 7 {
			t.Fatalf("a page of %d", len(infos))
		}
		if len(infos) < 7 && next != "" {
			short++
		}
		for _, info := range infos {
			seen[info.Key]++
			if !want[info.Key] || info.State != idempotency.StateStarted || info.LeaseLeft != 0 || info.ExpiresIn <= 0 || info.Attempt != 1 || info.Fence <= 0 {
				t.Errorf("listed %+v", info)
			}
		}
		if next == "" {
			break
		}
		if next <= cursor {
			t.Fatalf("cursor %q after %q", next, cursor)
		}
		cursor = next
	}
	trips := n.n.Load() - before
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("%s listed %d times, want once", k, seen[k])
		}
	}
	if short == 0 {
		t.Errorf("no page stopped short of its limit among %d live holders", live)
	}
	// Each 500 index entries cost a range and five keys-only
	// transactions, each page a read of its candidates' records and a
	// TimeToLive of their shared life lease: the completed records cost
	// nothing.
	if most := int64(6*((live+stuck)/500+pages) + 2*pages); trips > most {
		t.Errorf("a pass took %d round trips in %d pages, want at most %d", trips, pages, most)
	}
	t.Logf("%d stuck among %d live and %d completed: %d pages (%d short), %d round trips", stuck, live, completed, pages, short, trips)
}

// TestStuckDropsStaleEntries checks entries that outlived their record
// (deleted behind the store's back, or completed by a store that did not
// keep the index): Stuck lists nothing for them and deletes them.
func TestStuckDropsStaleEntries(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	claim(t, s, "deleted", tok("a"), time.Hour, time.Hour)
	base := strings.TrimSuffix(s.Key("deleted"), "h")
	if _, err := c.Delete(ctx, base, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	claim(t, s, "done", tok("b"), time.Second, time.Hour)
	if err := s.Complete(ctx, "done", tok("b"), []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, s.StartedKey("done"), ""); err != nil {
		t.Fatal(err)
	}
	// A COMPLETED record keeps its live marker until the holder's lease
	// ends, and Stuck passes over entries with one: wait for it.
	time.Sleep(2500 * time.Millisecond)
	infos, next, err := s.Stuck(ctx, "", 10)
	if err != nil || len(infos) != 0 || next != "" {
		t.Fatalf("Stuck: %v %q %v; want nothing", infos, next, err)
	}
	for _, k := range []string{"deleted", "done"} {
		if resp, err := c.Get(ctx, s.StartedKey(k)); err != nil || len(resp.Kvs) != 0 {
			t.Errorf("the stale entry of %q: %v %v; want it deleted", k, resp.Kvs, err)
		}
	}
	if info, err := s.Inspect(ctx, "done"); err != nil || info.State != idempotency.StateCompleted {
		t.Errorf("the completed record after Stuck: %+v %v", info, err)
	}
}

// TestInspectLeases checks the times Inspect reports against the leases
// etcd holds, with leases long enough to be shared and padded: LeaseLeft
// never above the lease asked, ExpiresIn never above the lease left plus
// the grace, nor above the retention once completed.
func TestInspectLeases(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	claim(t, s, "k", tok("a"), time.Minute, 24*time.Hour)
	info, err := s.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.LeaseLeft > time.Minute || info.LeaseLeft < 58*time.Second || info.ExpiresIn > info.LeaseLeft+24*time.Hour || info.ExpiresIn < 24*time.Hour {
		t.Errorf("STARTED: LeaseLeft %v, ExpiresIn %v; want a minute and a day after it", info.LeaseLeft, info.ExpiresIn)
	}
	if err := s.Complete(ctx, "k", tok("a"), []byte("r"), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	info, err = s.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.TimeToLive(context.Background(), clientv3.LeaseID(leaseOf(t, c, s.Key("k"))))
	if err != nil {
		t.Fatal(err)
	}
	if info.ExpiresIn != 2*time.Hour || resp.TTL <= 2*3600 {
		t.Errorf("COMPLETED: ExpiresIn %v with a lease of %d s left; want the retention asked, 2h, below the padded lease", info.ExpiresIn, resp.TTL)
	}
	if _, err := s.Inspect(ctx, "absent"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Inspect of an absent key: %v", err)
	}
}

func leaseOf(t *testing.T, c *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := c.Get(t.Context(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get %q: %v %v", key, resp, err)
	}
	return resp.Kvs[0].Lease
}

var _ idempotency.Inspector = (*idemetcd.Store)(nil)
