package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/batchtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// calls counts a client's unary calls by method ("Txn", "LeaseGrant",
// ...), and those that failed.
type calls struct {
	mu     sync.Mutex
	n      map[string]int
	failed int
}

func (c *calls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[method[strings.LastIndexByte(method, '/')+1:]]++
	if err != nil {
		c.failed++
	}
	return err
}

// take returns the counts since the last take.
func (c *calls) take() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, failed := c.n, c.failed
	c.n, c.failed = map[string]int{}, 0
	return n, failed
}

func callCountingClient(t *testing.T) (*clientv3.Client, *calls) {
	t.Helper()
	n := &calls{n: map[string]int{}}
	return interceptedClient(t, n.intercept), n
}

func batchClaims(n int, tag string, lease time.Duration) []idempotency.ClaimRequest {
	reqs := make([]idempotency.ClaimRequest, n)
	for i := range reqs {
		key := fmt.Sprintf("%s-%04d", tag, i)
		reqs[i] = idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tok(key), Lease: lease, Grace: lease}
	}
	return reqs
}

// TestBatchRoundTrips counts the transactions of batches: a ClaimBatch of
// fresh keys, of replays, and a FinishBatch of completions or of releases
// are one transaction for every 125 items (etcd's default --max-txn-ops
// of 128 leaves 3 operations to each item's own), sent at once, with no
// lease grant once the store has leases to share (a lease of 10 minutes
// serves the claims of the 30 seconds after its grant), and nothing
// refused; a DoBatch of 100 fresh keys is two transactions.
func TestBatchRoundTrips(t *testing.T) {
	c, n := callCountingClient(t)
	s := newStore(t, c, nil)
	const lease = 10 * time.Minute
	batchtest.MustFinish(t, s, batchtest.Completions(mustClaimBatchReqs(t, s, batchClaims(2, "warm", lease)), lease))
	n.take()
	for _, size := range []int{1, 10, 125, 126, 300} {
		want := (size + 124) / 125
		reqs := batchClaims(size, fmt.Sprintf("rt%d", size), lease)
		check := func(what string) {
			t.Helper()
			got, failed := n.take()
			if got["Txn"] != want || len(got) != 1 || failed != 0 {
				t.Errorf("%s of %d items: calls %v (%d failed), want %d Txn and nothing else", what, size, got, failed, want)
			}
		}
		batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
		check("ClaimBatch")
		batchtest.MustFinish(t, s, batchtest.Completions(reqs, 10*time.Minute))
		check("FinishBatch")
		res := batchtest.MustClaim(t, s, batchClaims(size, fmt.Sprintf("rt%d", size), lease), idempotency.OutcomeReplay)
		check("ClaimBatch of replays")
		for i, r := range res {
			if string(r.Result) != "result of "+reqs[i].Key {
				t.Fatalf("replay %d: %q", i, r.Result)
			}
		}
		// Releases nest three transactions deep: they fit as well.
		rel := mustClaimBatchReqs(t, s, batchClaims(size, fmt.Sprintf("rel%d", size), lease))
		n.take()
		items := batchtest.Completions(rel, 10*time.Minute)
		for i := range items {
			items[i].Release = true
		}
		batchtest.MustFinish(t, s, items)
		check("FinishBatch of releases")
		batchtest.MustClaim(t, s, batchClaims(size, fmt.Sprintf("rel%d", size), lease)[:1], idempotency.OutcomeAcquired)
		n.take()
	}
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]idempotency.Request, 100)
	for i := range reqs {
		reqs[i] = idempotency.Request{Scope: []string{"tenant"}, Key: fmt.Sprintf("do-%d", i), Fingerprint: fp}
	}
	for i, res := range idempotency.DoBatch(t.Context(), r, reqs, func(_ context.Context, i int) (int, error) { return i, nil }) {
		if res.Err != nil || res.Outcome != idempotency.OutcomeCompleted || res.Value != i {
			t.Fatalf("DoBatch item %d: %+v", i, res)
		}
	}
	got, _ := n.take()
	t.Logf("DoBatch of 100 fresh keys, the runner's first: %v", got)
	if got["Txn"] != 2 {
		t.Errorf("DoBatch of 100 fresh keys: %d transactions, want 2", got["Txn"])
	}
}

func mustClaimBatchReqs(t *testing.T, s *idemetcd.Store, reqs []idempotency.ClaimRequest) []idempotency.ClaimRequest {
	t.Helper()
	batchtest.MustClaim(t, s, reqs, idempotency.OutcomeAcquired)
	return reqs
}

// TestBatchLargeResults: results that do not fit in one request together
// are sent in transactions of about a MiB each (etcd's default
// --max-request-bytes is 1.5 MiB), never refused.
func TestBatchLargeResults(t *testing.T) {
	c, n := callCountingClient(t)
	s := newStore(t, c, nil)
	reqs := mustClaimBatchReqs(t, s, batchClaims(5, "large", time.Minute))
	items := batchtest.Completions(reqs, 10*time.Minute)
	for i := range items {
		items[i].Result = bytes.Repeat([]byte{byte('a' + i)}, 700<<10)
	}
	items[4].Result = []byte("small")
	n.take()
	batchtest.MustFinish(t, s, items)
	got, failed := n.take()
	// 700 KiB each: one per transaction, the small one with the last.
	if got["Txn"] != 4 || failed != 0 {
		t.Errorf("FinishBatch of four 700 KiB results and a small one: calls %v (%d failed), want 4 Txn", got, failed)
	}
	for i, r := range batchtest.MustClaim(t, s, batchClaims(5, "large", time.Minute), idempotency.OutcomeReplay) {
		if !bytes.Equal(r.Result, items[i].Result) {
			t.Errorf("replay %d: %d bytes, want %d", i, len(r.Result), len(items[i].Result))
		}
	}
}

// TestBatchItemsApart: an item the store refuses (an invalid claim, a
// result above MaxValueSize, a token that lost its record) gets its own
// error, before anything is sent for it; the other items are applied. An
// item the store never saw claimed is completed as Complete would (read,
// then write). An empty batch and a canceled context send nothing.
func TestBatchItemsApart(t *testing.T) {
	c, n := callCountingClient(t)
	prefix := uniquePrefix()
	s := newStore(t, c, &idemetcd.Options{Prefix: prefix, MaxValueSize: 16})
	warm := mustClaimBatchReqs(t, s, batchClaims(1, "warm", time.Minute))
	batchtest.MustFinish(t, s, []idempotency.Finish{{Key: warm[0].Key, Token: warm[0].Token, Result: []byte("w"), Retention: time.Minute}})
	ctx := t.Context()

	n.take()
	if res, errs := s.ClaimBatch(ctx, nil); len(res) != 0 || len(errs) != 0 {
		t.Fatalf("empty ClaimBatch: %v %v", res, errs)
	}
	if errs := s.FinishBatch(ctx, nil); len(errs) != 0 {
		t.Fatalf("empty FinishBatch: %v", errs)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	reqs := batchClaims(4, "apart", time.Minute)
	_, errs := s.ClaimBatch(canceled, reqs)
	for i, err := range append(errs, s.FinishBatch(canceled, batchtest.Completions(reqs, 10*time.Minute))...) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("item %d under a canceled context: %v", i, err)
		}
	}
	if got, _ := n.take(); len(got) != 0 {
		t.Fatalf("empty and canceled batches sent %v", got)
	}

	bad := []idempotency.ClaimRequest{reqs[0], {Key: "", Fingerprint: fp, Token: tok("x"), Lease: time.Minute}, reqs[1], {Key: "no-lease", Fingerprint: fp, Token: tok("x")}, reqs[2], reqs[3]}
	res, errs := s.ClaimBatch(ctx, bad)
	for i := range bad {
		if i == 1 || i == 3 {
			if !errors.Is(errs[i], idempotency.ErrInvalidArgument) {
				t.Errorf("claim %d: %v, want ErrInvalidArgument", i, errs[i])
			}
			continue
		}
		if errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired {
			t.Errorf("claim %d beside refused ones: %+v, %v", i, res[i], errs[i])
		}
	}
	if got, _ := n.take(); got["Txn"] != 1 {
		t.Errorf("a batch with refused items: %v, want 1 Txn", got)
	}

	stale := idempotency.ClaimRequest{Key: "apart-stale", Fingerprint: fp, Token: tok("s"), Lease: time.Minute, Grace: time.Minute}
	batchtest.MustClaim(t, s, []idempotency.ClaimRequest{stale}, idempotency.OutcomeAcquired)
	if err := s.Release(ctx, stale.Key, stale.Token); err != nil {
		t.Fatal(err)
	}
	claim(t, s, stale.Key, tok("o"), time.Minute, time.Minute)
	// Another store on the same prefix never saw reqs[3] claimed.
	other := newStore(t, c, &idemetcd.Options{Prefix: prefix, MaxValueSize: 16})
	items := []idempotency.Finish{
		{Key: reqs[0].Key, Token: reqs[0].Token, Result: []byte("short"), Retention: time.Minute},
		{Key: reqs[1].Key, Token: reqs[1].Token, Result: []byte("seventeen bytes!!"), Retention: time.Minute},
		{Key: stale.Key, Token: stale.Token, Result: []byte("stale"), Retention: time.Minute},
		{Key: reqs[2].Key, Token: reqs[2].Token, Release: true},
		{Key: "no-retention", Token: tok("x"), Result: []byte("x")},
		{Key: reqs[3].Key, Token: reqs[3].Token, Result: []byte("other's"), Retention: time.Minute},
		{Key: "apart-absent", Token: tok("x"), Release: true},
	}
	errs = other.FinishBatch(ctx, items)
	for i, want := range []error{nil, idempotency.ErrTooLarge, idempotency.ErrLeaseLost, nil, idempotency.ErrInvalidArgument, nil, nil} {
		if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("FinishBatch item %d (%s): %v, want %v", i, items[i].Key, errs[i], want)
		}
	}
	// The same batch on the store that claimed them: all but the
	// refused ones done already, so success (ErrLeaseLost for the stale).
	errs = s.FinishBatch(ctx, items)
	for i, want := range []error{nil, idempotency.ErrTooLarge, idempotency.ErrLeaseLost, nil, idempotency.ErrInvalidArgument, nil, nil} {
		if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("repeated FinishBatch item %d (%s): %v, want %v", i, items[i].Key, errs[i], want)
		}
	}
	res, errs = s.ClaimBatch(ctx, []idempotency.ClaimRequest{
		{Key: reqs[0].Key, Fingerprint: fp, Token: tok("y"), Lease: time.Minute},
		{Key: reqs[1].Key, Fingerprint: fp, Token: tok("y"), Lease: time.Minute},
		{Key: stale.Key, Fingerprint: fp, Token: tok("y"), Lease: time.Minute},
		{Key: reqs[2].Key, Fingerprint: fp, Token: tok("y"), Lease: time.Minute},
		{Key: reqs[3].Key, Fingerprint: fp, Token: tok("y"), Lease: time.Minute},
	})
	for i, want := range []idempotency.Outcome{idempotency.OutcomeReplay, idempotency.OutcomeInProgress, idempotency.OutcomeInProgress, idempotency.OutcomeAcquired, idempotency.OutcomeReplay} {
		if errs[i] != nil || res[i].Outcome != want {
			t.Errorf("claim %d after the batch: %+v, %v; want %v", i, res[i], errs[i], want)
		}
	}
	if string(res[4].Result) != "other's" {
		t.Errorf("replay of the item the other store completed: %q", res[4].Result)
	}
}

// TestBatchRevokedLease: a batch whose shared lease the server no longer
// has (revoked, or lost in a restore) is refused whole, writing nothing;
// each item is then claimed, or completed, on its own with new leases.
func TestBatchRevokedLease(t *testing.T) {
	c, n := callCountingClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	first := mustClaimBatchReqs(t, s, batchClaims(2, "revoke-first", time.Minute))
	leaseOf := func(key string) clientv3.LeaseID {
		kv, err := c.Get(ctx, s.Key(key))
		if err != nil || len(kv.Kvs) != 1 {
			t.Fatalf("Get %s: %v %v", key, kv, err)
		}
		return clientv3.LeaseID(kv.Kvs[0].Lease)
	}
	if _, err := c.Revoke(ctx, leaseOf(first[0].Key)); err != nil {
		t.Fatal(err)
	}
	refused := func(what string) {
		t.Helper()
		if got, failed := n.take(); failed != 1 {
			t.Errorf("%s: calls %v, %d failed; want the batch's transaction refused", what, got, failed)
		}
	}
	n.take()
	reqs := mustClaimBatchReqs(t, s, batchClaims(10, "revoke", time.Minute))
	refused("ClaimBatch on a revoked lease")
	batchtest.MustFinish(t, s, batchtest.Completions(reqs[:5], 10*time.Minute))
	if _, err := c.Revoke(ctx, leaseOf(reqs[0].Key)); err != nil { // the retention lease
		t.Fatal(err)
	}
	n.take()
	batchtest.MustFinish(t, s, batchtest.Completions(reqs[5:], 10*time.Minute))
	refused("FinishBatch on a revoked lease")
	batchtest.MustClaim(t, s, batchClaims(10, "revoke", time.Minute)[5:], idempotency.OutcomeReplay)
}

// TestBatchNamespace: batches on a namespaced client (whose prefix goes
// into the nested transactions too) keep every key under the namespace.
func TestBatchNamespace(t *testing.T) {
	c := newClient(t)
	ns := "ns-" + uniquePrefix()
	s := newStore(t, idemetcd.Namespace(c, ns), &idemetcd.Options{Prefix: "p/"})
	reqs := mustClaimBatchReqs(t, s, batchClaims(20, "ns", time.Minute))
	items := batchtest.Completions(reqs, 10*time.Minute)
	items[0] = idempotency.Finish{Key: reqs[0].Key, Token: reqs[0].Token, Release: true}
	batchtest.MustFinish(t, s, items)
	res := batchtest.MustClaim(t, s, batchClaims(20, "ns", time.Minute)[1:], idempotency.OutcomeReplay)
	if string(res[0].Result) != "result of "+reqs[1].Key {
		t.Errorf("replay: %q", res[0].Result)
	}
	kv, err := c.Get(t.Context(), ns+s.Key(reqs[1].Key))
	if err != nil || len(kv.Kvs) != 1 || !bytes.HasPrefix(kv.Kvs[0].Value, []byte("c")) {
		t.Errorf("record under the namespace: %v %v", kv, err)
	}
	if kv, err := c.Get(t.Context(), ns+s.Key(reqs[0].Key)); err != nil || len(kv.Kvs) != 0 {
		t.Errorf("released record: %v %v", kv, err)
	}
}

// TestBatchBadInput: the bad input of a batch, at the store and through
// DoBatch. An empty batch sends nothing. Two items with one key in one
// batch (which etcd refuses in one transaction) are decided as two calls
// one after the other: the first in the batch's transaction, the second
// after it (the holder's repeat keeps its fence, another token's claim is
// in progress; a second completion is a repeat, another token's release
// is refused). A batch over etcd's operation limit is split, never
// refused. An invalid key in the middle fails its own item only.
func TestBatchBadInput(t *testing.T) {
	c, n := callCountingClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	batchtest.MustFinish(t, s, batchtest.Completions(mustClaimBatchReqs(t, s, batchClaims(1, "warm", time.Minute)), time.Minute))
	n.take()

	a, b := batchClaims(2, "dup", time.Minute)[0], batchClaims(2, "dup", time.Minute)[1]
	other := a
	other.Token = tok("o")
	res, errs := s.ClaimBatch(ctx, []idempotency.ClaimRequest{a, b, a, other})
	for i, want := range []idempotency.Outcome{idempotency.OutcomeAcquired, idempotency.OutcomeAcquired, idempotency.OutcomeAcquired, idempotency.OutcomeInProgress} {
		if errs[i] != nil || res[i].Outcome != want {
			t.Errorf("claim %d of a batch with a key thrice: %+v, %v; want %v", i, res[i], errs[i], want)
		}
	}
	if res[2].Fence != res[0].Fence || res[2].Fence == 0 {
		t.Errorf("the holder's repeat in the batch: fence %d, the claim's %d", res[2].Fence, res[0].Fence)
	}
	if got, failed := n.take(); failed != 0 || got["Txn"] < 2 {
		t.Errorf("a batch with a key thrice: calls %v, %d failed; want no refusal", got, failed)
	}
	done := batchtest.Completions([]idempotency.ClaimRequest{a, b}, 10*time.Minute)
	items := []idempotency.Finish{done[0], done[1], done[0], {Key: a.Key, Token: other.Token, Release: true}}
	errs = s.FinishBatch(ctx, items)
	for i, want := range []error{nil, nil, nil, idempotency.ErrLeaseLost} {
		if err := errs[i]; want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("finish %d of a batch with a key thrice: %v, want %v", i, err, want)
		}
	}
	for i, r := range batchtest.MustClaim(t, s, []idempotency.ClaimRequest{other, b}, idempotency.OutcomeReplay) {
		if want := "result of " + []string{a.Key, b.Key}[i]; string(r.Result) != want {
			t.Errorf("replay %d after the batch with a key thrice: %q, want %q", i, r.Result, want)
		}
	}

	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	var ran []int
	fn := func(_ context.Context, i int) (int, error) { ran = append(ran, i); return i, nil }
	n.take()
	if out := idempotency.DoBatch(ctx, r, nil, fn); len(out) != 0 {
		t.Fatalf("empty DoBatch: %v", out)
	}
	if got, _ := n.take(); len(got) != 0 {
		t.Errorf("empty DoBatch sent %v", got)
	}

	const size = 300 // over etcd's 128 operations of one transaction
	reqs := make([]idempotency.Request, size)
	for i := range reqs {
		reqs[i] = idempotency.Request{Scope: []string{"bad"}, Key: fmt.Sprintf("k-%03d", i), Fingerprint: fp}
	}
	reqs[7].Key = reqs[3].Key // a duplicate
	reqs[150].Key = ""        // an invalid key in the middle
	out := idempotency.DoBatch(ctx, r, reqs, fn)
	for i, x := range out {
		switch i {
		case 150:
			if !errors.Is(x.Err, idempotency.ErrInvalidKey) || x.Outcome != idempotency.OutcomeInvalidKey {
				t.Errorf("item %d, an invalid key: %v, %v", i, x.Outcome, x.Err)
			}
		case 7:
			if x.Err != nil || x.Outcome != idempotency.OutcomeReplay || x.Ran || x.Value != 3 {
				t.Errorf("item %d, a duplicate of item 3: %+v", i, x)
			}
		default:
			if x.Err != nil || x.Outcome != idempotency.OutcomeCompleted || !x.Ran || x.Value != i {
				t.Errorf("item %d: %+v", i, x)
			}
		}
	}
	if len(ran) != size-2 {
		t.Errorf("fn ran %d times for %d distinct valid keys", len(ran), size-2)
	}
	got, failed := n.take()
	t.Logf("DoBatch of %d items: %v", size, got)
	// 298 keys: 3 transactions of claims and 3 of completions.
	if got["Txn"] != 6 || failed != 0 {
		t.Errorf("DoBatch of %d items: calls %v, %d failed; want 6 Txn, none refused", size, got, failed)
	}
	for i, x := range idempotency.DoBatch(ctx, r, reqs, fn) {
		want := i
		if i == 7 {
			want = 3
		}
		if i != 150 && (x.Err != nil || x.Outcome != idempotency.OutcomeReplay || x.Value != want) {
			t.Errorf("repeated DoBatch item %d: %+v", i, x)
		}
	}
	if len(ran) != size-2 {
		t.Errorf("the repeated DoBatch ran fn %d more times", len(ran)-(size-2))
	}
}

// TestBatchTakeover: a batch whose holder stopped (a crash: claimed,
// never finished) is taken over by another process's batch once the
// leases end, each item once, with a greater fence and attempt 2, over
// more than one transaction's worth of items; the stopped holder's late
// completions are refused item by item (ErrLeaseLost) and change nothing,
// and the new holder's are applied.
func TestBatchTakeover(t *testing.T) {
	c := newClient(t)
	prefix := uniquePrefix()
	crashed := newStore(t, c, &idemetcd.Options{Prefix: prefix})
	const size = 200
	reqs := batchClaims(size, "takeover", time.Second)
	for i := range reqs {
		reqs[i].Grace = time.Minute // the record outlives its holder's lease
	}
	first := batchtest.MustClaim(t, crashed, reqs, idempotency.OutcomeAcquired)

	next := newStore(t, c, &idemetcd.Options{Prefix: prefix})
	again := make([]idempotency.ClaimRequest, size)
	for i, r := range reqs {
		again[i] = r
		again[i].Token = tok(fmt.Sprintf("n%d-", i))
		again[i].Lease = time.Minute
	}
	res := make([]idempotency.ClaimResult, size)
	taken := make([]int, size)
	pending := make([]int, size)
	for i := range pending {
		pending[i] = i
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		sub := make([]idempotency.ClaimRequest, len(pending))
		for j, i := range pending {
			sub[j] = again[i]
		}
		got, errs := next.ClaimBatch(t.Context(), sub)
		var still []int
		for j, i := range pending {
			switch {
			case errs[j] != nil:
				t.Fatalf("takeover claim %d: %v", i, errs[j])
			case got[j].Outcome == idempotency.OutcomeAcquired:
				res[i] = got[j]
				taken[i]++
			case got[j].Outcome == idempotency.OutcomeInProgress:
				still = append(still, i)
			default:
				t.Fatalf("takeover claim %d: %+v", i, got[j])
			}
		}
		pending = still
		if len(pending) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if len(pending) > 0 {
		t.Fatalf("%d of %d items not taken over 10 s after a lease of 1 s", len(pending), size)
	}
	for i, r := range res {
		if taken[i] != 1 || r.Fence <= first[i].Fence || r.Attempt != 2 {
			t.Errorf("item %d taken over %d times: fence %d (was %d), attempt %d", i, taken[i], r.Fence, first[i].Fence, r.Attempt)
		}
	}
	late := batchtest.Completions(reqs, time.Minute)
	for i, err := range crashed.FinishBatch(t.Context(), late) {
		if !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("the stopped holder's late completion %d: %v, want ErrLeaseLost", i, err)
		}
	}
	batchtest.MustFinish(t, next, batchtest.Completions(again, time.Minute))
	for i, r := range batchtest.MustClaim(t, crashed, reqs, idempotency.OutcomeReplay) {
		if r.Fence != res[i].Fence || string(r.Result) != "result of "+reqs[i].Key {
			t.Fatalf("replay %d: fence %d (the takeover's %d), %q", i, r.Fence, res[i].Fence, r.Result)
		}
	}
}
