package mongo

// Unit tests: no server. They assert on what the store would send (let
// documents, filters, pipelines), run those on the model of MongoDB
// (model_test.go) to check the documents they produce, and check the
// store's reading of replies and errors.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
)

// manualClock is a clock that moves only when told.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *manualClock) ms() int64 { return c.Now().UnixMilli() }

// modelStore returns a store on a fresh model with the clock.
func modelStore(t testing.TB, opts *Options) (*Store, *model, *manualClock) {
	t.Helper()
	clock := newManualClock()
	m := newModel(clock.Now)
	return newStore(m, mustOptions(t, opts)), m, clock
}

var bg = context.Background()

func claimOK(t testing.TB, s *Store, key, fp, tok string, lease, grace time.Duration) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(bg, idempotency.ClaimRequest{Key: key, Fingerprint: idempotency.Fingerprint(fp), Token: idempotency.Token(tok), Lease: lease, Grace: grace})
	if err != nil {
		t.Fatalf("Claim(%q, %q, %q): %v", key, fp, tok, err)
	}
	return res
}

// fields lists a document's field names in order.
func fields(d bson.D) []string {
	var out []string
	for _, e := range d {
		out = append(out, e.Key)
	}
	return out
}

func dateMS(t testing.TB, d bson.D, name string) int64 {
	t.Helper()
	v, ok := lookup(d, name).(bson.DateTime)
	if !ok {
		t.Fatalf("field %s of %v is not a date", name, d)
	}
	return int64(v)
}

func longOf(t testing.TB, d bson.D, name string) int64 {
	t.Helper()
	v, ok := lookup(d, name).(int64)
	if !ok {
		t.Fatalf("field %s of %v is not a long", name, d)
	}
	return v
}

// TestLetValuesAreLiterals checks that every value sent in a let document
// is wrapped in $literal, and that no user string appears anywhere in a
// filter or pipeline except as the _id of a filter (query language, where
// a string is always a literal): a fingerprint "$f" or a checkpoint name
// "$$NOW" is never read as a field or a variable.
func TestLetValuesAreLiterals(t *testing.T) {
	const key, fp, tok, name = "$key.with.dots", "$fp.x", "$$tok2", "$$name2.y"
	lets := map[string]bson.D{
		"claim":      claimLet(fp, tok, time.Second, time.Minute),
		"renew":      letDoc(varToken, encodeString(tok), varLease, int64(1000)),
		"checkpoint": letDoc(varToken, encodeString(tok), varName, encodeString(name), varValue, binary([]byte("$v"))),
		"complete":   letDoc(varToken, encodeString(tok), varRetention, int64(1000), varResult, binary([]byte("$r"))),
		"release":    letDoc(varToken, encodeString(tok)),
	}
	for op, let := range lets {
		for _, e := range let {
			lit, ok := e.Value.(bson.D)
			if !ok || len(lit) != 1 || lit[0].Key != "$literal" {
				t.Errorf("%s: let variable %s = %v, want {$literal: ...}", op, e.Key, e.Value)
			}
			if e.Key == "" || e.Key[0] < 'a' || e.Key[0] > 'z' {
				t.Errorf("%s: let variable %q must start with a lowercase letter", op, e.Key)
			}
		}
	}
	known := map[string]bool{}
	for _, f := range []string{fieldID, fieldState, fieldFingerprint, fieldToken, fieldFence, fieldAttempt, fieldLease, fieldGrace, fieldCheckpoints, fieldResult, fieldExpires, fieldDelete} {
		known["$"+f] = true
	}
	for _, v := range []string{varFingerprint, varToken, varLease, varGrace, varRetention, varResult, varName, varValue, "NOW", "ROOT", "this.k", "fence", "leaseend", "expires"} {
		known["$$"+v] = true
	}
	sent := map[string]any{
		"claim filter":        claimFilter(key)[1:], // without the _id equality
		"claim pipeline":      claimPipeline(),
		"held filter":         heldFilter(key)[1:],
		"complete filter":     completeFilter(key)[1:],
		"renew pipeline":      renewPipeline(),
		"checkpoint pipeline": checkpointPipeline(),
		"complete pipeline":   completePipeline(),
		"release pipeline":    releasePipeline(),
		"read projection":     readProjection(),
	}
	for what, v := range sent {
		walk(v, func(s string) {
			switch {
			case s == key || s == fp || s == tok || s == name:
				t.Errorf("%s holds the user value %q outside a let variable", what, s)
			case strings.HasPrefix(s, "$") && !known[s]:
				t.Errorf("%s reads %q, which is neither a record field nor a let variable", what, s)
			}
		})
	}
	for what, f := range map[string]bson.D{"claim": claimFilter(key), "held": heldFilter(key), "complete": completeFilter(key), "key": keyFilter(key)} {
		if f[0].Key != fieldID || f[0].Value != key {
			t.Errorf("%s filter starts with %v, want the _id equality %q", what, f[0], key)
		}
	}
}

// walk calls fn on every string value (not key) in v.
func walk(v any, fn func(string)) {
	switch v := v.(type) {
	case string:
		fn(v)
	case bson.D:
		for _, e := range v {
			walk(e.Value, fn)
		}
	case bson.A:
		for _, x := range v {
			walk(x, fn)
		}
	}
}

// TestOddValues runs whole lifecycles on the model with keys,
// fingerprints, tokens and checkpoint names that would mean something
// else if read as expressions, or that are not valid UTF-8.
func TestOddValues(t *testing.T) {
	odd := []string{"$", "$f", "$$NOW", "$$ROOT", "$$REMOVE", "a.b", ".", "$.x", "{$gt: 1}", "\xff\xfe", "ключ", "x\x00y"}
	s, _, _ := modelStore(t, nil)
	for i, v := range odd {
		key, fp, tok := "k"+v, v, v+fmt.Sprint(i)
		res := claimOK(t, s, key, fp, tok, time.Minute, time.Minute)
		if res.Outcome != idempotency.OutcomeAcquired || res.Attempt != 1 {
			t.Fatalf("claim %q: %+v", v, res)
		}
		if err := s.Checkpoint(bg, key, idempotency.Token(tok), v, []byte(v)); err != nil {
			t.Fatalf("checkpoint %q: %v", v, err)
		}
		if err := s.Checkpoint(bg, key, idempotency.Token(tok), v+"2", []byte("other")); err != nil {
			t.Fatalf("checkpoint %q: %v", v, err)
		}
		again := claimOK(t, s, key, fp, tok, time.Minute, time.Minute)
		if again.Outcome != idempotency.OutcomeAcquired || string(again.Checkpoints[v]) != v || string(again.Checkpoints[v+"2"]) != "other" || len(again.Checkpoints) != 2 {
			t.Errorf("repeated claim %q: %+v", v, again)
		}
		if res := claimOK(t, s, key, fp+"!", "other", time.Minute, 0); res.Outcome != idempotency.OutcomeMismatch {
			t.Errorf("claim of %q with another fingerprint: %v, want mismatch", v, res.Outcome)
		}
		if res := claimOK(t, s, key, fp, "other", time.Minute, 0); res.Outcome != idempotency.OutcomeInProgress {
			t.Errorf("claim of %q by another token: %v, want in progress", v, res.Outcome)
		}
		if err := s.Complete(bg, key, idempotency.Token(tok), []byte("result "+v), time.Hour); err != nil {
			t.Fatalf("complete %q: %v", v, err)
		}
		if res := claimOK(t, s, key, fp, "other", time.Minute, 0); res.Outcome != idempotency.OutcomeReplay || string(res.Result) != "result "+v {
			t.Errorf("replay of %q: %v %q", v, res.Outcome, res.Result)
		}
	}
	// Every key is a record of its own.
	for _, v := range odd {
		if res := claimOK(t, s, "k"+v, v, "x", time.Minute, 0); res.Outcome != idempotency.OutcomeReplay {
			t.Errorf("key %q: %v, want its own replay", "k"+v, res.Outcome)
		}
	}
}

// TestEncodeString checks the one-to-one encoding of user strings.
func TestEncodeString(t *testing.T) {
	for _, s := range []string{"", "abc", "$x", "a.b", "ключ", "\xff", "a\x00b", "\xc3("} {
		raw, err := bson.Marshal(bson.D{{Key: "v", Value: encodeString(s)}})
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeString(bson.Raw(raw).Lookup("v"))
		if !ok || got != s {
			t.Errorf("decode(encode(%q)) = %q, %v", s, got, ok)
		}
	}
	if _, ok := encodeString("\xff").(bson.Binary); !ok {
		t.Error("invalid UTF-8 is not stored as binary")
	}
	// A string and binary data of the same bytes are different values.
	if compare(encodeString("ab"), bson.Binary{Data: []byte("ab")}) == 0 {
		t.Error("string and binary compare equal")
	}
}

// TestDocumentShape checks the documents the pipelines write, field by
// field, on the model: the layout the README documents.
func TestDocumentShape(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	now := clock.ms()
	res := claimOK(t, s, "k", "fp", "tok", 2*time.Second, 3*time.Second)
	d := m.doc("k")
	if got := fields(d); !slices.Equal(got, []string{"_id", "s", "f", "t", "n", "a", "l", "g", "e", "x"}) {
		t.Errorf("started record fields %v", got)
	}
	if res.Fence != now || longOf(t, d, "n") != now {
		t.Errorf("fence %d (stored %v), want the clock in ms, %d", res.Fence, lookup(d, "n"), now)
	}
	if lookup(d, "s") != "started" || lookup(d, "f") != "fp" || lookup(d, "t") != "tok" || longOf(t, d, "a") != 1 || longOf(t, d, "g") != 3000 {
		t.Errorf("started record %v", d)
	}
	if dateMS(t, d, "l") != now+2000 || dateMS(t, d, "e") != now+5000 || dateMS(t, d, "x") != now+5000 {
		t.Errorf("deadlines of %v, want lease %d, expiry and deletion %d", d, now+2000, now+5000)
	}

	if err := s.Checkpoint(bg, "k", "tok", "step", []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	d = m.doc("k")
	cps, ok := lookup(d, "c").(bson.A)
	if !ok || len(cps) != 1 || compare(cps[0], bson.D{{Key: "k", Value: "step"}, {Key: "v", Value: binary([]byte{1, 2})}}) != 0 {
		t.Errorf("checkpoints %v", lookup(d, "c"))
	}

	clock.Advance(time.Second)
	if err := s.Complete(bg, "k", "tok", []byte("r"), time.Minute); err != nil {
		t.Fatal(err)
	}
	d = m.doc("k")
	if got := fields(d); !slices.Equal(got, []string{"_id", "s", "f", "t", "n", "a", "r", "e", "x"}) {
		t.Errorf("completed record fields %v", got)
	}
	if lookup(d, "s") != "completed" || compare(lookup(d, "r"), binary([]byte("r"))) != 0 || dateMS(t, d, "e") != now+1000+60000 || dateMS(t, d, "x") != now+61000 {
		t.Errorf("completed record %v", d)
	}

	claimOK(t, s, "k2", "fp", "tok2", time.Second, time.Hour)
	clock.Advance(time.Millisecond)
	if err := s.Release(bg, "k2", "tok2"); err != nil {
		t.Fatal(err)
	}
	d = m.doc("k2")
	if got := fields(d); !slices.Equal(got, []string{"_id", "n", "e", "x"}) {
		t.Errorf("released record fields %v", got)
	}
	if dateMS(t, d, "e") != clock.ms() || dateMS(t, d, "x") != clock.ms() {
		t.Errorf("released record %v, want expiry and deletion now (%d)", d, clock.ms())
	}
}

// TestFenceAcrossDeletion checks the fence construction on the model:
// fences grow within a millisecond across release and re-creation, and
// nothing deletes a record before the clock has passed its fence.
func TestFenceAcrossDeletion(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	now := clock.ms()
	var last int64
	for i := range 5 { // five claims and releases in one millisecond
		res := claimOK(t, s, "k", "fp", fmt.Sprint("tok", i), time.Second, time.Second)
		if res.Fence != now+int64(i) || res.Attempt != 1 {
			t.Fatalf("claim %d in one millisecond: fence %d attempt %d, want fence %d attempt 1", i, res.Fence, res.Attempt, now+int64(i))
		}
		last = res.Fence
		if err := s.Release(bg, "k", idempotency.Token(fmt.Sprint("tok", i))); err != nil {
			t.Fatal(err)
		}
	}
	if x := dateMS(t, m.doc("k"), "x"); x != last+1 {
		t.Errorf("released record's deletion time %d, want the millisecond after its fence, %d", x, last+1)
	}
	// The record cannot be deleted until the clock passed last+1.
	clock.Advance(time.Duration(last+1-now) * time.Millisecond)
	if n, err := s.Sweep(bg, 0); err != nil || n != 0 {
		t.Fatalf("Sweep at the deletion time: %d, %v, want 0 (deleted only after it)", n, err)
	}
	clock.Advance(time.Millisecond)
	if n, err := s.Sweep(bg, 0); err != nil || n != 1 {
		t.Fatalf("Sweep after the deletion time: %d, %v, want 1", n, err)
	}
	if res := claimOK(t, s, "k", "fp", "new", time.Second, 0); res.Fence <= last || res.Attempt != 1 {
		t.Errorf("claim after deletion: fence %d attempt %d, want a fence above %d, attempt 1", res.Fence, res.Attempt, last)
	}

	// A fence far ahead of the clock (a clock stepped back while the record
	// lived) keeps growing by one, and keeps the record from deletion until
	// the clock catches up.
	ahead := clock.ms() + int64(time.Hour/time.Millisecond)
	claimOK(t, s, "ahead", "fp", "t1", time.Second, 0)
	d := m.doc("ahead")
	d = setField(d, fieldFence, ahead)
	m.set("ahead", d)
	clock.Advance(2 * time.Second) // lease and expiry over
	res := claimOK(t, s, "ahead", "fp", "t2", time.Second, 0)
	if res.Fence != ahead+1 || res.Attempt != 1 {
		t.Errorf("claim of an expired record with a fence ahead of the clock: fence %d attempt %d, want %d, 1", res.Fence, res.Attempt, ahead+1)
	}
	if err := s.Release(bg, "ahead", "t2"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if _, err := s.Sweep(bg, 0); err != nil || m.doc("ahead") == nil {
		t.Errorf("Sweep of a released record whose fence is an hour ahead: %v, deleted it", err)
	}
	if res := claimOK(t, s, "ahead", "fp", "t3", time.Second, 0); res.Fence != ahead+2 {
		t.Errorf("claim after release: fence %d, want %d", res.Fence, ahead+2)
	}
	// A takeover also goes by one when the clock is behind the fence.
	clock.Advance(2 * time.Second)
	if res := claimOK(t, s, "ahead", "fp", "t4", time.Second, time.Hour); res.Fence != ahead+3 || res.Attempt != 1 {
		t.Errorf("claim after expiry: fence %d attempt %d, want %d, 1", res.Fence, res.Attempt, ahead+3)
	}
	clock.Advance(2 * time.Second)
	if res := claimOK(t, s, "ahead", "fp", "t5", time.Second, 0); res.Fence != ahead+4 || res.Attempt != 2 {
		t.Errorf("takeover: fence %d attempt %d, want %d, 2", res.Fence, res.Attempt, ahead+4)
	}
}

// TestClaimReadsTheWinner checks the duplicate key path: the store reads
// the record that blocked its upsert and decides from it, sends the upsert
// again when the record changed in between, and gives up with an error,
// never with an outcome, when it keeps changing.
func TestClaimReadsTheWinner(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	claimOK(t, s, "k", "fp", "holder", time.Minute, time.Minute)
	res := claimOK(t, s, "k", "fp", "other", time.Minute, 0)
	if res.Outcome != idempotency.OutcomeInProgress || res.RetryAfter != time.Minute {
		t.Errorf("claim of a held key: %+v, want in progress for a minute", res)
	}

	// The holder releases between the upsert and the read: the claim goes
	// round again and acquires.
	m.between = func(cmd string) {
		if cmd == "findAndModify" {
			m.between = nil
			_ = s.Release(bg, "k", "holder")
		}
	}
	res = claimOK(t, s, "k", "fp", "other", time.Minute, 0)
	if res.Outcome != idempotency.OutcomeAcquired || res.Attempt != 1 {
		t.Errorf("claim whose blocker was released before the read: %+v, want acquired afresh", res)
	}

	// A record that changes before every read: an error, not an outcome.
	churn := 0
	m.between = func(cmd string) {
		if cmd == "findAndModify" {
			churn++
			d := m.doc("k")
			m.set("k", setField(d, fieldExpires, bson.DateTime(clock.ms()-1)))
		}
		if cmd == "find" {
			// Live again for the next upsert.
			d := m.doc("k")
			m.set("k", setField(d, fieldExpires, bson.DateTime(clock.ms()+60000)))
		}
	}
	_, err := s.Claim(bg, idempotency.ClaimRequest{Key: "k", Fingerprint: "fp", Token: "third", Lease: time.Minute})
	m.between = nil
	if err == nil || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("claim of a record that keeps changing: %v, want an error", err)
	}
	_ = churn
}

// TestClaimDecisions covers decideFromRead's table directly.
func TestClaimDecisions(t *testing.T) {
	r := idempotency.ClaimRequest{Key: "k", Fingerprint: "fp", Token: "me", Lease: time.Second}
	doc := func(pairs ...any) bson.Raw {
		d := bson.D{}
		for i := 0; i < len(pairs); i += 2 {
			d = append(d, bson.E{Key: pairs[i].(string), Value: pairs[i+1]})
		}
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name string
		doc  bson.Raw
		ok   bool
		want idempotency.Outcome
	}{
		{"absent", nil, false, 0},
		{"not live", doc("live", false, "s", "completed", "f", "fp"), false, 0},
		{"other fingerprint", doc("live", true, "s", "started", "f", "other", "t", "x", "left", int64(5)), true, idempotency.OutcomeMismatch},
		{"completed", doc("live", true, "s", "completed", "f", "fp", "r", binary([]byte("res"))), true, idempotency.OutcomeReplay},
		{"live lease", doc("live", true, "s", "started", "f", "fp", "t", "x", "left", int64(5)), true, idempotency.OutcomeInProgress},
		{"lease over", doc("live", true, "s", "started", "f", "fp", "t", "x", "left", int64(0)), false, 0},
		{"own", doc("live", true, "s", "started", "f", "fp", "t", "me", "left", int64(5)), false, 0},
		{"released", doc("live", false), false, 0},
	}
	for _, c := range cases {
		res, ok := decideFromRead(c.doc, r)
		if ok != c.ok || ok && res.Outcome != c.want {
			t.Errorf("%s: %v %v, want %v %v", c.name, res.Outcome, ok, c.want, c.ok)
		}
		if ok && res.Outcome == idempotency.OutcomeReplay && string(res.Result) != "res" {
			t.Errorf("%s: result %q", c.name, res.Result)
		}
		if ok && res.Outcome == idempotency.OutcomeInProgress && res.RetryAfter != 5*time.Millisecond {
			t.Errorf("%s: retry after %v", c.name, res.RetryAfter)
		}
	}
}

// TestReleaseDecisions covers Release after an update that matched
// nothing, on the model.
func TestReleaseDecisions(t *testing.T) {
	s, _, clock := modelStore(t, nil)
	if err := s.Release(bg, "absent", "t"); err != nil {
		t.Errorf("release of an absent record: %v", err)
	}
	claimOK(t, s, "held", "fp", "holder", time.Minute, 0)
	if err := s.Release(bg, "held", "other"); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("release by another token: %v, want ErrLeaseLost", err)
	}
	claimOK(t, s, "done", "fp", "holder", time.Minute, 0)
	if err := s.Complete(bg, "done", "holder", nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(bg, "done", "holder"); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("release of a completed record: %v, want ErrLeaseLost", err)
	}
	claimOK(t, s, "expired", "fp", "holder", time.Second, 0)
	clock.Advance(time.Second)
	if err := s.Release(bg, "expired", "other"); err != nil {
		t.Errorf("release of an expired record: %v", err)
	}
}

// TestTooLarge checks both limits: the configured one before anything is
// sent, and the server's 16 MiB document limit, after which nothing is
// written.
func TestTooLarge(t *testing.T) {
	const limit = 1 << 20
	s, m, _ := modelStore(t, &Options{MaxValueSize: limit})
	claimOK(t, s, "k", "fp", "tok", time.Minute, time.Minute)
	before := m.commands["update"]
	if err := s.Complete(bg, "k", "tok", make([]byte, limit+1), time.Minute); !errors.Is(err, idempotency.ErrTooLarge) {
		t.Errorf("result over the limit: %v, want ErrTooLarge", err)
	}
	if err := s.Checkpoint(bg, "k", "tok", "c", make([]byte, limit+1)); !errors.Is(err, idempotency.ErrTooLarge) {
		t.Errorf("checkpoint over the limit: %v, want ErrTooLarge", err)
	}
	if m.commands["update"] != before {
		t.Error("a value over the limit was sent")
	}
	// Sixteen checkpoints of 1 MiB fill the document; the sixteenth is
	// refused by the server, and the record keeps the fifteen.
	var err error
	n := 0
	for ; n < 20; n++ {
		if err = s.Checkpoint(bg, "k", "tok", fmt.Sprint("c", n), make([]byte, limit)); err != nil {
			break
		}
	}
	if !errors.Is(err, idempotency.ErrTooLarge) || n != 15 {
		t.Errorf("checkpoint %d: %v, want the 16th to get ErrTooLarge", n, err)
	}
	res := claimOK(t, s, "k", "fp", "tok", time.Minute, time.Minute)
	if len(res.Checkpoints) != 15 {
		t.Errorf("%d checkpoints after a refused one, want 15", len(res.Checkpoints))
	}
	if err := s.Complete(bg, "k", "tok", make([]byte, limit), time.Minute); err != nil {
		t.Errorf("result at the limit: %v", err)
	}
	// The largest limit still fits in a document with the longest key.
	s2, _, _ := modelStore(t, &Options{MaxValueSize: MaxValueLimit})
	key := strings.Repeat("k", idempotency.MaxStorageKeyLen)
	fp := strings.Repeat("f", idempotency.MaxFingerprintLen)
	claimOK(t, s2, key, fp, strings.Repeat("t", 32), time.Minute, time.Minute)
	if err := s2.Complete(bg, key, idempotency.Token(strings.Repeat("t", 32)), make([]byte, MaxValueLimit), time.Minute); err != nil {
		t.Errorf("result of MaxValueLimit bytes under the longest key: %v", err)
	}
}

func TestOptions(t *testing.T) {
	for _, bad := range []*Options{
		{MaxValueSize: -1},
		{MaxValueSize: MaxValueLimit + 1},
		{SweepBatch: -1},
		{WriteConcern: writeconcern.Unacknowledged()},
		{WriteConcern: &writeconcern.WriteConcern{W: 1.5}},
		{ReadConcern: readconcern.Available()},
		{ReadConcern: readconcern.Snapshot()},
	} {
		if _, err := checkOptions(bad); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("options %+v: %v, want ErrInvalidArgument", *bad, err)
		}
	}
	o := mustOptions(t, nil)
	if o.MaxValueSize != DefaultMaxValueSize || o.SweepBatch != DefaultSweepBatch || o.WriteConcern.W != "majority" || o.ReadConcern.Level != "majority" {
		t.Errorf("defaults %+v", o)
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("New(nil): %v", err)
	}
	s, _, _ := modelStore(t, nil)
	for _, r := range []idempotency.ClaimRequest{
		{Key: "", Token: "t", Lease: time.Second},
		{Key: "k", Token: "", Lease: time.Second},
		{Key: "k", Token: "t", Lease: 0},
		{Key: "k", Token: "t", Lease: time.Second, Grace: -1},
	} {
		if _, err := s.Claim(bg, r); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("Claim(%+v): %v, want ErrInvalidArgument", r, err)
		}
	}
	if err := s.Renew(bg, "k", "t", 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Renew with no lease: %v", err)
	}
	if err := s.Complete(bg, "k", "t", nil, 0); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Complete with no retention: %v", err)
	}
}

func TestMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, time.Nanosecond: 1, time.Millisecond: 1, 1500 * time.Microsecond: 2, time.Hour: 3600000} {
		if got := millis(d); got != want {
			t.Errorf("millis(%v) = %d, want %d", d, got, want)
		}
	}
}

func rawDoc(t testing.TB, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestServerChecks covers the version, FerretDB, collation and topology
// checks of Migrate.
func TestServerChecks(t *testing.T) {
	info := func(version string, arr ...int32) bson.Raw {
		d := bson.D{{Key: "version", Value: version}}
		if arr != nil {
			a := bson.A{}
			for _, x := range arr {
				a = append(a, x)
			}
			d = append(d, bson.E{Key: "versionArray", Value: a})
		}
		return rawDoc(t, d)
	}
	for _, c := range []struct {
		info bson.Raw
		ok   bool
		want []string
	}{
		{info("4.4.29", 4, 4, 29, 0), false, []string{"MongoDB 4.4.29", "5.0"}},
		{info("4.2.1"), false, []string{"MongoDB 4.2.1", "5.0"}},
		{info("3.6.23", 3, 6, 23, 0), false, []string{"MongoDB 3.6.23"}},
		{info("5.0.0", 5, 0, 0, 0), true, nil},
		{info("7.0.14", 7, 0, 14, 0), true, nil},
		{info("8.2.0-rc1", 8, 2, 0, -49), true, nil},
		{info("6.0.3"), true, nil},
		{rawDoc(t, bson.D{{Key: "version", Value: "7.0.42"}, {Key: "ferretdbVersion", Value: "v1.24.2"}}), false, []string{"FerretDB v1.24.2", "not atomic"}},
		{rawDoc(t, bson.D{}), false, []string{"no version"}},
	} {
		err := checkServer(c.info)
		if c.ok != (err == nil) {
			t.Errorf("buildInfo %s: %v, want ok=%v", c.info, err, c.ok)
			continue
		}
		if err != nil && !errors.Is(err, ErrUnsupportedServer) {
			t.Errorf("buildInfo %s: %v does not wrap ErrUnsupportedServer", c.info, err)
		}
		for _, w := range c.want {
			if !strings.Contains(fmt.Sprint(err), w) {
				t.Errorf("buildInfo %s: %q does not say %q", c.info, err, w)
			}
		}
	}
	if err := checkCollation(nil); err != nil {
		t.Error(err)
	}
	if err := checkCollation(rawDoc(t, bson.D{{Key: "locale", Value: "simple"}})); err != nil {
		t.Error(err)
	}
	if err := checkCollation(rawDoc(t, bson.D{{Key: "locale", Value: "en"}, {Key: "strength", Value: int32(2)}})); !errors.Is(err, ErrUnsupportedServer) {
		t.Errorf("case-insensitive collation: %v", err)
	}
	for _, c := range []struct {
		hello bson.D
		want  bool
	}{
		{bson.D{{Key: "isWritablePrimary", Value: true}}, false},
		{bson.D{{Key: "setName", Value: "rs0"}}, true},
		{bson.D{{Key: "msg", Value: "isdbgrid"}}, true},
	} {
		if got := hasChangeStreams(rawDoc(t, c.hello)); got != c.want {
			t.Errorf("hasChangeStreams(%v) = %v", c.hello, got)
		}
	}
}

// TestMigrate checks that every operation runs Migrate until it succeeds
// once, that a refused server fails every operation with the reason, and
// that the TTL index is created unless SkipIndex.
func TestMigrate(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	m.info = bson.D{{Key: "version", Value: "4.4.29"}, {Key: "versionArray", Value: bson.A{int32(4), int32(4), int32(29), int32(0)}}}
	_, err := s.Claim(bg, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Second})
	if !errors.Is(err, ErrUnsupportedServer) || !strings.Contains(err.Error(), "4.4.29") {
		t.Errorf("claim on MongoDB 4.4: %v", err)
	}
	if err := s.Release(bg, "k", "t"); !errors.Is(err, ErrUnsupportedServer) {
		t.Errorf("release on MongoDB 4.4: %v", err)
	}
	if m.commands["findAndModify"]+m.commands["update"] != 0 || m.ttl {
		t.Error("commands were sent to a refused server")
	}
	m.info = newModel(nil).info // upgraded
	claimOK(t, s, "k", "f", "t", time.Second, 0)
	claimOK(t, s, "k2", "f", "t", time.Second, 0)
	if m.commands["buildInfo+hello"] != 3 || !m.ttl || !m.started {
		t.Errorf("setup ran %d times (index %v), want twice refused then once", m.commands["buildInfo+hello"], m.ttl)
	}
	if !s.canWatch.Load() {
		t.Error("a replica set member was not recognized")
	}

	s, m, _ = modelStore(t, &Options{SkipIndex: true})
	m.hello = bson.D{{Key: "isWritablePrimary", Value: true}}
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	if m.ttl {
		t.Error("SkipIndex created the index")
	}
	if err := s.Watch(bg, "k"); err == nil || !strings.Contains(err.Error(), "standalone") {
		t.Errorf("Watch on a standalone: %v", err)
	}

	s, m, _ = modelStore(t, nil)
	m.coll = bson.D{{Key: "locale", Value: "en"}, {Key: "strength", Value: int32(1)}}
	if err := s.Migrate(bg); !errors.Is(err, ErrUnsupportedServer) {
		t.Errorf("setup on a collection with a collation: %v", err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t", Lease: time.Second}); !errors.Is(err, context.Canceled) {
		t.Errorf("claim with a canceled context: %v", err)
	}
}

// TestErrors covers the classification of driver errors.
func TestErrors(t *testing.T) {
	s, _, _ := modelStore(t, nil)
	dup := mongo.CommandError{Code: 11000, Message: "E11000 duplicate key error"}
	if !mongo.IsDuplicateKeyError(dup) {
		t.Error("the model's duplicate key error is not one to the driver")
	}
	we := mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "E11000"}}}
	if !mongo.IsDuplicateKeyError(we) {
		t.Error("a write exception with E11000 is not a duplicate key error")
	}
	for _, err := range []error{
		mongo.CommandError{Code: codeBSONObjectTooLarge, Message: "BSONObj size: 16793600 (0x1003000) is invalid"},
		mongo.CommandError{Code: codeUpdateResultTooLarge, Message: "Resulting document after update is larger than 16777216"},
		mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: codeUpdateResultTooLarge}}},
		fmt.Errorf("wrapped: %w", driver.ErrDocumentTooLarge),
	} {
		got := s.fail(bg, "complete", err)
		if !errors.Is(got, idempotency.ErrTooLarge) || !strings.Contains(got.Error(), err.Error()) {
			t.Errorf("fail(%v) = %v, want ErrTooLarge wrapping the driver's error", err, got)
		}
	}
	for _, err := range []error{
		mongo.CommandError{Code: 91, Message: "ShutdownInProgress"},
		mongo.CommandError{Code: 50, Message: "operation exceeded time limit"},
		dup,
		errors.New("connection reset"),
	} {
		got := s.fail(bg, "claim", err)
		var se mongo.ServerError
		if errors.Is(got, idempotency.ErrTooLarge) || errors.Is(got, idempotency.ErrLeaseLost) || !strings.Contains(got.Error(), err.Error()) ||
			errors.As(err, &se) && !errors.As(got, &se) {
			t.Errorf("fail(%v) = %v, want a plain error wrapping it", err, got)
		}
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	got := s.fail(ctx, "claim", errors.New("socket closed"))
	if !errors.Is(got, context.Canceled) {
		t.Errorf("fail under a canceled context = %v, want it to wrap context.Canceled", got)
	}
}

// TestRoundTrips counts the commands of each path on the model.
func TestRoundTrips(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	count := func() int { return commandCount(m) }
	steps := []struct {
		name string
		run  func()
		want int
	}{
		{"fresh claim", func() { claimOK(t, s, "k", "fp", "t", time.Minute, 0) }, 1},
		{"checkpoint", func() { _ = s.Checkpoint(bg, "k", "t", "c", nil) }, 1},
		{"renew", func() { _ = s.Renew(bg, "k", "t", time.Minute) }, 1},
		{"in progress", func() { claimOK(t, s, "k", "fp", "u", time.Minute, 0) }, 2},
		{"complete", func() { _ = s.Complete(bg, "k", "t", nil, time.Minute) }, 1},
		{"replay", func() { claimOK(t, s, "k", "fp", "u", time.Minute, 0) }, 2},
		{"release of an absent record", func() { _ = s.Release(bg, "absent", "t") }, 2},
	}
	for _, st := range steps {
		before := count()
		st.run()
		if got := count() - before; got != st.want {
			t.Errorf("%s: %d commands, want %d", st.name, got, st.want)
		}
	}
}

// TestWatchVersion checks what Watch compares: only a live started
// record has a version, made of its holder and fence.
func TestWatchVersion(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	read := func(key string) version {
		raw, err := m.findOne(bg, keyFilter(key), watchProjection())
		if err != nil {
			t.Fatal(err)
		}
		if raw == nil {
			return version{}
		}
		return watchVersion(raw)
	}
	if v := read("k"); v.started {
		t.Errorf("absent record: %+v", v)
	}
	first := claimOK(t, s, "k", "fp", "a", time.Second, time.Hour)
	v1 := read("k")
	if !v1.started || v1.token != "a" || v1.fence != first.Fence {
		t.Errorf("started record: %+v", v1)
	}
	if err := s.Renew(bg, "k", "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(bg, "k", "a", "c", nil); err != nil {
		t.Fatal(err)
	}
	if v := read("k"); v != v1 {
		t.Errorf("a renewal and a checkpoint changed the version: %+v, was %+v", v, v1)
	}
	clock.Advance(2 * time.Second)
	claimOK(t, s, "k", "fp", "b", time.Second, time.Hour)
	if v := read("k"); v == v1 || v.token != "b" {
		t.Errorf("a takeover left the version: %+v", v)
	}
	if err := s.Complete(bg, "k", "b", nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if v := read("k"); v.started {
		t.Errorf("completed record: %+v", v)
	}
	if got := watchPipeline("$x.y"); compare(got, bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "documentKey._id", Value: "$x.y"}}}}}) != 0 {
		t.Errorf("watch pipeline %v", got)
	}
}
