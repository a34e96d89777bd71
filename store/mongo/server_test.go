package mongo_test

// The real-server suite: the conformance suite, 32 racers on one key, the
// server's clock in every deadline and fence, the documents as stored, the
// TTL index and monitor, size limits, odd keys, Watch, the example and the
// round trips, against the MongoDB at IDEM_MONGO_URI (see main_test.go).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

var (
	clientOnce sync.Once
	client     *mongo.Client
	clientErr  error
)

// server returns the client of the real server, or skips the test when
// none could be had (TestMain then says so loudly, or fails).
func server(t testing.TB) *mongo.Client {
	t.Helper()
	uri := os.Getenv(envURI)
	if uri == "" {
		reason := os.Getenv(envAbsent)
		if reason == "" {
			reason = envURI + " is not set: " + howTo
		}
		t.Skipf("MongoDB real-server test not run: %s", reason)
	}
	clientOnce.Do(func() {
		client, clientErr = mongo.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(200))
		if clientErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		clientErr = client.Ping(ctx, nil)
	})
	if clientErr != nil {
		t.Fatalf("MongoDB at %s=%s unreachable: %v (%s)", envURI, uri, clientErr, howTo)
	}
	return client
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freshCollection returns a collection of its own, dropped at the end.
func freshCollection(t testing.TB, c *mongo.Client) *mongo.Collection {
	t.Helper()
	coll := c.Database("idemtest").Collection("records_" + randomHex(6))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := coll.Drop(ctx); err != nil {
			t.Errorf("dropping %s: %v", coll.Name(), err)
		}
	})
	return coll
}

// newStore returns a set-up store on coll.
func newStore(t testing.TB, coll *mongo.Collection, opts *idemmongo.Options) *idemmongo.Store {
	t.Helper()
	s, err := idemmongo.New(coll, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// hello runs hello on the server.
func hello(t testing.TB, c *mongo.Client) bson.Raw {
	t.Helper()
	raw, err := c.Database("admin").RunCommand(context.Background(), bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// serverNow is the server's clock.
func serverNow(t testing.TB, c *mongo.Client) time.Time {
	t.Helper()
	now, ok := hello(t, c).Lookup("localTime").TimeOK()
	if !ok {
		t.Fatal("hello has no localTime")
	}
	return now
}

// replicated reports whether the deployment has change streams.
func replicated(t testing.TB, c *mongo.Client) bool {
	h := hello(t, c)
	_, rs := h.Lookup("setName").StringValueOK()
	msg, _ := h.Lookup("msg").StringValueOK()
	return rs || msg == "isdbgrid"
}

// rawDoc reads the stored document under key.
func rawDoc(t testing.TB, coll *mongo.Collection, key string) bson.Raw {
	t.Helper()
	raw, err := coll.FindOne(context.Background(), bson.D{{Key: "_id", Value: key}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func keys(d bson.Raw) []string {
	els, _ := d.Elements()
	var out []string
	for _, e := range els {
		out = append(out, e.Key())
	}
	return out
}

const maxValue = 64 << 10

func TestConformance(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	var caps conformancetest.Capabilities
	if !replicated(t, c) {
		caps.Skip = []string{"watcher"}
		t.Log("the server is a standalone: no change streams, so Watch is not checked (TestWatchStandalone checks that it says so)")
	}
	conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
		return newStore(t, coll, &idemmongo.Options{MaxValueSize: maxValue})
	}, caps)
}

func claim(t testing.TB, s idempotency.Store, key string, fp idempotency.Fingerprint, tok idempotency.Token, lease, grace time.Duration) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), idempotency.ClaimRequest{Key: key, Fingerprint: fp, Token: tok, Lease: lease, Grace: grace})
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", key, tok, err)
	}
	return res
}

// race starts n claims of key at once, each with its own token, and
// returns their results; an error fails the test (a lost upsert race must
// be decided, never an error or "not claimed").
func race(t *testing.T, s idempotency.Store, key string, n int, lease time.Duration) []idempotency.ClaimResult {
	t.Helper()
	results := make([]idempotency.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = s.Claim(context.Background(), idempotency.ClaimRequest{
				Key: key, Fingerprint: "fp", Token: idempotency.Token(fmt.Sprintf("racer-%02d-%s", i, randomHex(4))), Lease: lease, Grace: time.Hour,
			})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	return results
}

// TestRacers32 runs 32 concurrent claims of one key, 20 rounds of each
// kind: on an absent key (the upsert race: one inserts, 31 get E11000 and
// read the winner), on an expired lease (the takeover race) and on a
// completed record (all replay).
func TestRacers32(t *testing.T) {
	c := server(t)
	s := newStore(t, freshCollection(t, c), nil)
	const racers, rounds = 32, 20
	tally := func(results []idempotency.ClaimResult) map[idempotency.Outcome]int {
		m := map[idempotency.Outcome]int{}
		for _, r := range results {
			m[r.Outcome]++
		}
		return m
	}
	for round := range rounds {
		key := fmt.Sprintf("racers-%02d", round)
		res := race(t, s, key, racers, 300*time.Millisecond)
		got := tally(res)
		if got[idempotency.OutcomeAcquired] != 1 || got[idempotency.OutcomeInProgress] != racers-1 {
			t.Fatalf("round %d, absent key: outcomes %v, want 1 acquired and %d in progress", round, got, racers-1)
		}
		var first idempotency.ClaimResult
		for _, r := range res {
			if r.Outcome == idempotency.OutcomeAcquired {
				first = r
			} else if r.RetryAfter <= 0 || r.RetryAfter > 300*time.Millisecond {
				t.Fatalf("round %d: in progress with RetryAfter %v, want within (0, 300ms]", round, r.RetryAfter)
			}
		}
		time.Sleep(350 * time.Millisecond)
		res = race(t, s, key, racers, time.Hour)
		got = tally(res)
		if got[idempotency.OutcomeAcquired] != 1 || got[idempotency.OutcomeInProgress] != racers-1 {
			t.Fatalf("round %d, expired lease: outcomes %v, want 1 takeover and %d in progress", round, got, racers-1)
		}
		var holder idempotency.Token
		for i, r := range res {
			if r.Outcome == idempotency.OutcomeAcquired {
				if r.Attempt != 2 || r.Fence <= first.Fence {
					t.Fatalf("round %d: takeover attempt %d fence %d, want attempt 2 and a fence above %d", round, r.Attempt, r.Fence, first.Fence)
				}
				holder = idempotency.Token(fmt.Sprintf("racer-%02d", i))
			}
		}
		_ = holder
	}
	// Completed: everyone replays.
	tok := idempotency.Token("completer")
	claim(t, s, "racers-done", "fp", tok, time.Minute, time.Hour)
	if err := s.Complete(context.Background(), "racers-done", tok, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	got := tally(race(t, s, "racers-done", racers, time.Minute))
	if got[idempotency.OutcomeReplay] != racers {
		t.Fatalf("completed key: outcomes %v, want %d replays", got, racers)
	}
}

// TestServerClock checks that the stored deadlines and the fence come
// from one $$NOW on the server: fence = lease deadline - lease, expiry =
// lease deadline + grace, all within the server's clock around the call.
func TestServerClock(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	s := newStore(t, coll, nil)
	before := serverNow(t, c).UnixMilli()
	res := claim(t, s, "clock", "fp", "tok", 1500*time.Millisecond, 2500*time.Millisecond)
	after := serverNow(t, c).UnixMilli()
	d := rawDoc(t, coll, "clock")
	l := d.Lookup("l").DateTime()
	e := d.Lookup("e").DateTime()
	x := d.Lookup("x").DateTime()
	if res.Fence < before || res.Fence > after {
		t.Errorf("fence %d, want the server's clock in ms, within [%d, %d]", res.Fence, before, after)
	}
	if l-res.Fence != 1500 || e-l != 2500 || x != e {
		t.Errorf("fence %d lease %d expiry %d deletion %d: want lease = fence+1500, expiry = lease+2500, deletion = expiry", res.Fence, l, e, x)
	}
	if err := s.Renew(context.Background(), "clock", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	now := serverNow(t, c).UnixMilli()
	d = rawDoc(t, coll, "clock")
	if l := d.Lookup("l").DateTime(); l < after+60000 || l > now+60000 {
		t.Errorf("renewed lease %d, want the server's now + 60000 within [%d, %d]", l, after+60000, now+60000)
	}
	if e := d.Lookup("e").DateTime(); e-d.Lookup("l").DateTime() != 2500 {
		t.Errorf("renewed expiry %d, want lease + the grace of the claim (2500)", e)
	}
}

// TestDocuments checks the documents the pipelines write on the server,
// field by field: the layout the README documents (and the model in the
// unit tests produces).
func TestDocuments(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	s := newStore(t, coll, nil)
	ctx := context.Background()
	claim(t, s, "doc", idempotency.Fingerprint("sha256:"+strings.Repeat("ab", 32)), "tok", time.Minute, time.Minute)
	if got := keys(rawDoc(t, coll, "doc")); !slices.Equal(got, []string{"_id", "s", "f", "t", "n", "a", "l", "g", "e", "x"}) {
		t.Errorf("started record: fields %v", got)
	}
	if err := s.Checkpoint(ctx, "doc", "tok", "step.$1", []byte{0, 1}); err != nil {
		t.Fatal(err)
	}
	d := rawDoc(t, coll, "doc")
	cps, _ := d.Lookup("c").Array().Values()
	if len(cps) != 1 || cps[0].Document().Lookup("k").StringValue() != "step.$1" {
		t.Errorf("checkpoints %s", d.Lookup("c"))
	}
	if err := s.Complete(ctx, "doc", "tok", []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	d = rawDoc(t, coll, "doc")
	if got := keys(d); !slices.Equal(got, []string{"_id", "s", "f", "t", "n", "a", "r", "e", "x"}) {
		t.Errorf("completed record: fields %v", got)
	}
	if _, b, _ := d.Lookup("r").BinaryOK(); string(b) != "result" || d.Lookup("s").StringValue() != "completed" {
		t.Errorf("completed record %s", d)
	}
	t.Logf("completed record: %d bytes: %s", len(d), d)
	claim(t, s, "rel", "fp", "tok", time.Minute, time.Minute)
	if err := s.Release(ctx, "rel", "tok"); err != nil {
		t.Fatal(err)
	}
	d = rawDoc(t, coll, "rel")
	if got := keys(d); !slices.Equal(got, []string{"_id", "n", "e", "x"}) {
		t.Errorf("released record: fields %v", got)
	}
	if d.Lookup("x").DateTime() < d.Lookup("n").AsInt64()+1 {
		t.Errorf("released record deletion %d before the millisecond after its fence %d", d.Lookup("x").DateTime(), d.Lookup("n").AsInt64())
	}
}

// TestFences checks fences on the server: they grow across fast release
// and re-creation, a fence ahead of the clock still grows by one, and a
// released record whose fence is ahead of the clock is not swept.
func TestFences(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	s := newStore(t, coll, nil)
	ctx := context.Background()
	var last int64
	for i := range 50 {
		tok := idempotency.Token(fmt.Sprint("t", i))
		res := claim(t, s, "fast", "fp", tok, time.Minute, 0)
		if res.Fence <= last || res.Attempt != 1 {
			t.Fatalf("claim %d after release: fence %d attempt %d, want a fence above %d and attempt 1", i, res.Fence, res.Attempt, last)
		}
		last = res.Fence
		if err := s.Release(ctx, "fast", tok); err != nil {
			t.Fatal(err)
		}
	}
	// A fence an hour ahead of the server's clock.
	ahead := serverNow(t, c).UnixMilli() + 3600_000
	claim(t, s, "ahead", "fp", "a1", time.Millisecond, 0)
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "ahead"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: ahead}}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the record expired
	if res := claim(t, s, "ahead", "fp", "a2", time.Minute, 0); res.Fence != ahead+1 {
		t.Errorf("claim of an expired record with a fence ahead of the clock: fence %d, want %d", res.Fence, ahead+1)
	}
	if err := s.Release(ctx, "ahead", "a2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if rawDoc(t, coll, "ahead") == nil {
		t.Fatal("Sweep deleted a released record whose fence is ahead of the server's clock")
	}
	if res := claim(t, s, "ahead", "fp", "a3", time.Millisecond, time.Hour); res.Fence != ahead+2 {
		t.Errorf("claim after release: fence %d, want %d", res.Fence, ahead+2)
	}
	time.Sleep(20 * time.Millisecond)
	if res := claim(t, s, "ahead", "fp", "a4", time.Minute, 0); res.Fence != ahead+3 || res.Attempt != 2 {
		t.Errorf("takeover: fence %d attempt %d, want %d, 2", res.Fence, res.Attempt, ahead+3)
	}
}

// TestTTL checks the TTL index, and waits for the server's TTL monitor
// (every 60 seconds by default) to delete an expired record by itself.
func TestTTL(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	s := newStore(t, coll, nil)
	specs, err := coll.Indexes().ListSpecifications(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sp := range specs {
		if sp.Name == "idem_expiry" {
			found = true
			els, _ := sp.KeysDocument.Elements()
			if sp.ExpireAfterSeconds == nil || *sp.ExpireAfterSeconds != 0 || len(els) != 1 || els[0].Key() != "x" || els[0].Value().AsInt64() != 1 {
				t.Errorf("TTL index %+v, want {x: 1} expiring after 0 seconds", sp)
			}
		}
	}
	if !found {
		t.Fatalf("no TTL index idem_expiry among %v", specs)
	}
	if testing.Short() {
		t.Skip("-short: not waiting for the TTL monitor")
	}
	t.Parallel()
	claim(t, s, "ttl", "fp", "tok", time.Millisecond, 0)
	deadline := time.Now().Add(75 * time.Second)
	for rawDoc(t, coll, "ttl") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the TTL monitor did not delete an expired record within 75s (it runs every ttlMonitorSleepSecs, 60 by default)")
		}
		time.Sleep(time.Second)
	}
}

// TestOddValues runs lifecycles with keys, fingerprints, tokens and
// checkpoint names that would mean something else if the server read
// them as expressions, and keys of the maximum length.
func TestOddValues(t *testing.T) {
	c := server(t)
	s := newStore(t, freshCollection(t, c), nil)
	ctx := context.Background()
	odd := []string{"$", "$f", "$$NOW", "$$ROOT", "a.b", ".", "$.x", "{$gt: 1}", "ключ-鍵-🔑", strings.Repeat("$.", idempotency.MaxStorageKeyLen/2)}
	for i, v := range odd {
		key, fp, tok := v, idempotency.Fingerprint(v), idempotency.Token(v+fmt.Sprint(i))
		claim(t, s, key, fp, tok, time.Minute, time.Minute)
		if err := s.Checkpoint(ctx, key, tok, v, []byte(v)); err != nil {
			t.Fatalf("checkpoint %q: %v", v, err)
		}
		res := claim(t, s, key, fp, tok, time.Minute, time.Minute)
		if string(res.Checkpoints[v]) != v || len(res.Checkpoints) != 1 {
			t.Errorf("checkpoints under %q: %v", v, res.Checkpoints)
		}
		if r := claim(t, s, key, fp+"x", "other", time.Minute, 0); r.Outcome != idempotency.OutcomeMismatch {
			t.Errorf("key %q, other fingerprint: %v", v, r.Outcome)
		}
		if err := s.Complete(ctx, key, tok, []byte(v), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range odd {
		if r := claim(t, s, v, idempotency.Fingerprint(v), "other", time.Minute, 0); r.Outcome != idempotency.OutcomeReplay || string(r.Result) != v {
			t.Errorf("replay of key %q: %v %q", v, r.Outcome, r.Result)
		}
	}
}

// TestTooLarge checks the server's 16 MiB limit: checkpoints that would
// take the document over it get ErrTooLarge and leave the record as it
// was; a result at the highest limit fits.
func TestTooLarge(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	const limit = 4 << 20
	s := newStore(t, coll, &idemmongo.Options{MaxValueSize: limit})
	ctx := context.Background()
	claim(t, s, "big", "fp", "tok", time.Minute, time.Minute)
	var err error
	n := 0
	for ; n < 5; n++ {
		if err = s.Checkpoint(ctx, "big", "tok", fmt.Sprint("c", n), make([]byte, limit)); err != nil {
			break
		}
	}
	if n != 3 || !errors.Is(err, idempotency.ErrTooLarge) {
		t.Fatalf("checkpoint %d of 4 MiB: %v, want the 4th to get ErrTooLarge", n, err)
	}
	t.Logf("the server's refusal: %v", err)
	if res := claim(t, s, "big", "fp", "tok", time.Minute, time.Minute); len(res.Checkpoints) != 3 {
		t.Errorf("%d checkpoints after the refused one, want 3", len(res.Checkpoints))
	}
	if err := s.Complete(ctx, "big", "tok", make([]byte, limit+1), time.Minute); !errors.Is(err, idempotency.ErrTooLarge) {
		t.Errorf("result over the limit: %v", err)
	}

	s2 := newStore(t, coll, &idemmongo.Options{MaxValueSize: idemmongo.MaxValueLimit})
	key := strings.Repeat("k", idempotency.MaxStorageKeyLen)
	claim(t, s2, key, idempotency.Fingerprint(strings.Repeat("f", idempotency.MaxFingerprintLen)), "tok", time.Minute, time.Minute)
	if err := s2.Complete(ctx, key, "tok", make([]byte, idemmongo.MaxValueLimit), time.Minute); err != nil {
		t.Errorf("result of MaxValueLimit bytes under the longest key: %v", err)
	}
}

// TestWatchStandalone checks that a standalone server says it cannot
// watch (on a replica set, the conformance suite checks Watch).
func TestWatchStandalone(t *testing.T) {
	c := server(t)
	if replicated(t, c) {
		t.Skip("the server has change streams; the conformance suite checks Watch")
	}
	s := newStore(t, freshCollection(t, c), nil)
	err := s.Watch(context.Background(), "k")
	if err == nil || !strings.Contains(err.Error(), "standalone") {
		t.Errorf("Watch on a standalone: %v, want an error saying it cannot watch", err)
	}
}

// TestWatchTakeoverAndSpurious checks on a replica set that Watch wakes on
// a takeover too, and does not wake for a renewal or a checkpoint (which
// change neither state, holder nor fence).
func TestWatchTakeoverAndSpurious(t *testing.T) {
	c := server(t)
	if !replicated(t, c) {
		t.Skip("a standalone has no change streams")
	}
	s := newStore(t, freshCollection(t, c), nil)
	ctx := context.Background()
	claim(t, s, "w", "fp", "tok", 500*time.Millisecond, time.Hour)
	woke := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() { woke <- s.Watch(wctx, "w") }()
	time.Sleep(200 * time.Millisecond)
	if err := s.Renew(ctx, "w", "tok", 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, "w", "tok", "c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		t.Fatalf("Watch returned (%v) after a renewal and a checkpoint", err)
	case <-time.After(300 * time.Millisecond):
	}
	time.Sleep(600 * time.Millisecond)
	claim(t, s, "w", "fp", "taker", time.Minute, time.Hour)
	select {
	case err := <-woke:
		if err != nil {
			t.Errorf("Watch after a takeover: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return within 5s of a takeover")
	}
}

// TestRoundTrips counts the commands each path sends, with a command
// monitor on a client of its own.
func TestRoundTrips(t *testing.T) {
	s, _, since := monitored(t, nil)
	runner, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	do := func() {
		_, err := idempotency.Do(context.Background(), runner, idempotency.Request{Key: "rt"}, func(ctx context.Context) (int, error) { return 1, nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	since()
	for _, step := range []struct {
		name string
		want int
	}{{"fresh Do", 2}, {"replayed Do", 2}} {
		do()
		got := 0
		for _, n := range since() {
			got += n
		}
		if got != step.want {
			t.Errorf("%s: %d commands, want %d", step.name, got, step.want)
		}
	}
}

// TestExample runs ExampleNew against the server (go test only compiles
// it, as it has no output comment) and checks what it prints.
func TestExample(t *testing.T) {
	server(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		var buf strings.Builder
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			buf.Write(b[:n])
			if err != nil {
				break
			}
		}
		done <- []byte(buf.String())
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		ExampleNew()
	}()
	_ = w.Close()
	got := string(<-done)
	want := "pay_123 replayed: false\npay_123 replayed: true\ncharges: 1\n"
	if got != want {
		t.Errorf("ExampleNew printed\n%s\nwant\n%s", got, want)
	}
}
