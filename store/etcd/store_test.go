package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

var fp = idempotency.FingerprintBytes([]byte(`{"amount":1000}`))

func tok(s string) idempotency.Token { return idempotency.Token(strings.Repeat(s, 32)[:32]) }

func claim(t *testing.T, s *idemetcd.Store, key string, tk idempotency.Token, lease, grace time.Duration) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tk, Lease: lease, Grace: grace})
	if err != nil {
		t.Fatalf("Claim(%s): %v", key, err)
	}
	return res
}

// TestNewRejects checks that New refuses what cannot work, with
// ErrInvalidArgument, and never panics.
func TestNewRejects(t *testing.T) {
	var nilClient *clientv3.Client
	for _, c := range []struct {
		name   string
		client idemetcd.Client
		opts   *idemetcd.Options
	}{
		{"nil client", nil, nil},
		{"typed nil client", nilClient, nil},
		{"negative MaxValueSize", newClient(t), &idemetcd.Options{MaxValueSize: -1}},
		{"too many checkpoints", newClient(t), &idemetcd.Options{MaxCheckpoints: 121}},
		{"negative MinLease", newClient(t), &idemetcd.Options{MinLease: -time.Second}},
	} {
		if _, err := idemetcd.New(c.client, c.opts); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("%s: New error %v, want ErrInvalidArgument", c.name, err)
		}
	}
}

// TestLimits checks that ServerMinLease reads the server's minimum lease
// TTL: 1s for the test server, whose election timeout is 500ms (the 3.6
// test checks 2s with etcd's defaults); that the store reports
// DefaultMinLease without asking the server, or Options.MinLease; and that
// idempotency.New applies it.
func TestLimits(t *testing.T) {
	c := newClient(t)
	if got, err := idemetcd.ServerMinLease(t.Context(), c); err != nil || got != time.Second {
		t.Errorf("ServerMinLease = %v, %v; want 1s (the server's --election-timeout is 500ms)", got, err)
	}
	s := newStore(t, c, nil)
	if got := s.Capabilities().Limits.MinLease; got != idemetcd.DefaultMinLease {
		t.Errorf("Capabilities().Limits.MinLease = %v, want DefaultMinLease", got)
	}
	s = newStore(t, newClient(t), &idemetcd.Options{MinLease: 3 * time.Second})
	if got := s.Capabilities().Limits.MinLease; got != 3*time.Second {
		t.Errorf("Capabilities().Limits.MinLease with Options.MinLease 3s = %v", got)
	}
	if _, err := idempotency.New(s, idempotency.WithLease(2*time.Second)); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("idempotency.New with a 2s lease on a store whose minimum is 3s: %v, want ErrInvalidArgument", err)
	}
}

// TestFencesAreRevisions checks that fences are etcd revisions: a fresh
// claim's is the revision that created the record, a repeat keeps it, a
// takeover's is above every revision before it, and a record deleted and
// created again gets a greater one.
func TestFencesAreRevisions(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	a := claim(t, s, "k", tok("a"), time.Second, time.Hour)
	kv, err := c.Get(ctx, s.Key("k"))
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatalf("reading the record key: %v %v", kv, err)
	}
	if a.Fence != kv.Kvs[0].CreateRevision {
		t.Errorf("fresh fence %d, want the record key's create revision %d", a.Fence, kv.Kvs[0].CreateRevision)
	}
	if again := claim(t, s, "k", tok("a"), time.Second, time.Hour); again.Fence != a.Fence {
		t.Errorf("repeated claim: fence %d, want %d", again.Fence, a.Fence)
	}
	if err := s.Checkpoint(ctx, "k", tok("a"), "step", []byte("1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the 1s lease ends and etcd revokes it
	before, err := c.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	b := claim(t, s, "k", tok("b"), time.Hour, time.Hour)
	if b.Outcome != idempotency.OutcomeAcquired || b.Attempt != 2 || b.Fence <= before.Header.Revision {
		t.Fatalf("takeover: %+v, want acquired, attempt 2, a fence above revision %d", b, before.Header.Revision)
	}
	if string(b.Checkpoints["step"]) != "1" {
		t.Errorf("takeover checkpoints %v", b.Checkpoints)
	}
	if err := s.Complete(ctx, "k", tok("b"), []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if r := claim(t, s, "k", tok("c"), time.Hour, 0); r.Outcome != idempotency.OutcomeReplay || r.Fence != b.Fence {
		t.Errorf("replay: %+v, want the holder's fence %d", r, b.Fence)
	}
	// Deleted (by anyone, here by hand) and created again: a greater fence.
	if _, err := c.Delete(ctx, strings.TrimSuffix(s.Key("k"), "h"), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if d := claim(t, s, "k", tok("d"), time.Hour, 0); d.Fence <= b.Fence || d.Attempt != 1 {
		t.Errorf("claim after deletion: %+v, want attempt 1 and a fence above %d", d, b.Fence)
	}
}

// TestDeadlinesAreLeases checks that every deadline is an etcd lease with
// the TTL asked for: the live marker's lease is the holder's, the record's
// and its checkpoints' lease plus grace, and the retention once completed.
func TestDeadlinesAreLeases(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	claim(t, s, "k", tok("a"), 5*time.Second, 10*time.Second)
	if err := s.Checkpoint(ctx, "k", tok("a"), "step", []byte("1")); err != nil {
		t.Fatal(err)
	}
	ttl := func(key string) int64 {
		t.Helper()
		kv, err := c.Get(ctx, key)
		if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].Lease == 0 {
			t.Fatalf("%q: %v %v, want a key with a lease", key, kv, err)
		}
		l, err := c.TimeToLive(ctx, clientv3.LeaseID(kv.Kvs[0].Lease))
		if err != nil {
			t.Fatal(err)
		}
		return l.GrantedTTL
	}
	base := strings.TrimSuffix(s.Key("k"), "h")
	if got := ttl(base + "l"); got != 5 {
		t.Errorf("live marker's lease TTL %d, want 5 (the lease)", got)
	}
	for _, k := range []string{"h", "c/step"} {
		if got := ttl(base + k); got != 15 {
			t.Errorf("%s's lease TTL %d, want 15 (lease plus grace)", k, got)
		}
	}
	if err := s.Renew(ctx, "k", tok("a"), 7*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := ttl(base + "l"); got != 7 {
		t.Errorf("live marker's lease TTL after Renew(7s) %d, want 7", got)
	}
	for _, k := range []string{"h", "c/step"} {
		if got := ttl(base + k); got != 17 {
			t.Errorf("%s's lease TTL after Renew(7s) %d, want 17 (the new lease plus grace)", k, got)
		}
	}
	if err := s.Complete(ctx, "k", tok("a"), []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	// 3600s plus at most the 5% window (3 minutes, capped at 1).
	if got := ttl(base + "h"); got < 3600 || got > 3660 {
		t.Errorf("the record's lease TTL once completed %d, want the retention, 3600 to 3660", got)
	}
	if kv, _ := c.Get(ctx, base+"c/", clientv3.WithPrefix()); len(kv.Kvs) != 0 {
		t.Error("a checkpoint survived Complete")
	}
}

// TestLeasesShared checks that claims with the same durations share leases:
// fifty fresh claims of 30s leases with an hour's grace, one after the
// other, use at most a few leases, each of which outlasts what it holds.
func TestLeasesShared(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	lives := map[int64]bool{}
	lifes := map[int64]bool{}
	for i := range 50 {
		key := "k" + string(rune('A'+i))
		claim(t, s, key, tok("a"), 30*time.Second, time.Hour)
		base := strings.TrimSuffix(s.Key(key), "h")
		l, _ := c.Get(ctx, base+"l")
		h, _ := c.Get(ctx, base+"h")
		lives[l.Kvs[0].Lease] = true
		lifes[h.Kvs[0].Lease] = true
	}
	if len(lives) > 3 || len(lifes) > 2 {
		t.Errorf("50 claims used %d live leases and %d life leases, want at most 3 and 2", len(lives), len(lifes))
	}
	for id := range lives {
		l, err := c.TimeToLive(ctx, clientv3.LeaseID(id))
		if err != nil || l.TTL < 29 || l.TTL > 31 {
			t.Errorf("shared live lease: %+v %v, want 29 to 31s left", l, err)
		}
	}
	t.Logf("50 claims: %d live leases, %d life leases", len(lives), len(lifes))
}

// counter counts the unary calls (transactions, lease grants, TimeToLive)
// a client makes: its round trips.
type counter struct{ n atomic.Int64 }

func (c *counter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.n.Add(1)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func countingClient(t *testing.T) (*clientv3.Client, *counter) {
	t.Helper()
	var n counter
	return interceptedClient(t, n.intercept), &n
}

// TestRoundTrips counts the round trips of Do: a fresh one makes 2 (claim
// and complete) once the store has leases to share, a replay 1, a
// duplicate in progress 2 (the claim, and the lease's time left).
func TestRoundTrips(t *testing.T) {
	c, n := countingClient(t)
	s := newStore(t, c, nil)
	r, err := idempotency.New(s, idempotency.WithRetention(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	do := func(key string, fn func(context.Context) (string, error)) (int64, error) {
		before := n.n.Load()
		_, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"t"}, Key: key, Fingerprint: fp}, fn)
		return n.n.Load() - before, err
	}
	ok := func(context.Context) (string, error) { return "ok", nil }
	first, err := do("warm", ok) // grants the leases the others share
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := do("fresh", ok)
	if err != nil || fresh != 2 {
		t.Errorf("fresh Do: %d round trips (%v), want 2", fresh, err)
	}
	replay, err := do("fresh", ok)
	if err != nil || replay != 1 {
		t.Errorf("replayed Do: %d round trips (%v), want 1", replay, err)
	}
	started := make(chan struct{})
	release := make(chan struct{})
	go func() {
		_, _ = do("busy", func(context.Context) (string, error) { close(started); <-release; return "ok", nil })
	}()
	<-started
	busy, err := do("busy", ok)
	close(release)
	if !errors.Is(err, idempotency.ErrInProgress) || busy != 2 {
		t.Errorf("Do of a key in progress: %d round trips (%v), want 2 and ErrInProgress", busy, err)
	}
	t.Logf("round trips: first Do %d (lease grants included), fresh %d, replay %d, in progress %d", first, fresh, replay, busy)
}

// TestNamespace checks a store on a namespaced client: its keys live under
// the namespace, and it works like any other.
func TestNamespace(t *testing.T) {
	c := newClient(t)
	ns := "ns-" + uniquePrefix()
	s := newStore(t, idemetcd.Namespace(c, ns), &idemetcd.Options{Prefix: "p/"})
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	req := idempotency.Request{Scope: []string{"tenant"}, Key: "order-1", Fingerprint: fp}
	runs := 0
	for range 2 {
		if _, err := idempotency.Do(ctx, r, req, func(context.Context) (int, error) { runs++; return 7, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 1 {
		t.Errorf("fn ran %d times", runs)
	}
	sk, _ := r.StorageKey(req)
	kv, err := c.Get(ctx, ns+s.Key(sk))
	if err != nil || len(kv.Kvs) != 1 || !bytes.HasPrefix(kv.Kvs[0].Value, []byte("c")) {
		t.Errorf("record key under the namespace: %v %v", kv, err)
	}
}
