package mongo

// The Batcher on the model: the statements it sends, the commands it
// costs, and each item decided on its own when the others fail, refuse or
// change under it. The conformance suite's batch cases run on the model
// in TestModelConformance.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// commandCount is the number of commands the model has run.
func commandCount(m *model) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.commands {
		n += c
	}
	return n
}

func req(key, fp, tok string, lease time.Duration) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Key: key, Fingerprint: idempotency.Fingerprint(fp), Token: idempotency.Token(tok), Lease: lease, Grace: time.Minute}
}

// TestBatchStatementsLiterals checks the statements of a batch as
// TestLetValuesAreLiterals checks the single calls': every user value
// sits inside a $literal (or is the _id of the filter), and every
// variable read is bound in the statement itself.
func TestBatchStatementsLiterals(t *testing.T) {
	const key, fp, tok = "$key.with.dots", "$fp.x", "$$tok2"
	r := req(key, fp, tok, time.Second)
	let := claimLet(fp, tok, r.Lease, r.Grace)
	stmts := map[string]update{
		"claim":    {filter: boundFilter(claimFilter(key), let), pipeline: boundPipeline(claimPipeline(), let, nil)},
		"complete": finishStatement(idempotency.Finish{Key: key, Token: tok, Result: []byte("$r"), Retention: time.Minute}),
		"release":  finishStatement(idempotency.Finish{Key: key, Token: tok, Release: true}),
	}
	for what, st := range stmts {
		if st.filter[0].Key != fieldID || st.filter[0].Value != key {
			t.Errorf("%s: filter starts with %v, want the _id equality", what, st.filter[0])
		}
		for name, v := range map[string]any{"filter": st.filter[1:], "pipeline": st.pipeline} {
			walkLiterals(v, false, func(s string, inLiteral bool) {
				if (s == key || s == fp || s == tok) && !inLiteral {
					t.Errorf("%s %s holds the user value %q outside a $literal", what, name, s)
				}
			})
		}
	}
	// Each statement runs on the model with no let document of the
	// command: its variables are its own.
	s, m, _ := modelStore(t, nil)
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	errs, err := m.bulkUpdate(bg, []update{stmts["claim"]})
	if err != nil || errs[0] != nil {
		t.Fatalf("the claim's statement on the model: %v %v", err, errs)
	}
	errs, err = m.bulkUpdate(bg, []update{stmts["complete"]})
	if err != nil || errs[0] != nil {
		t.Fatalf("the completion's statement on the model: %v %v", err, errs)
	}
	if st := lookup(m.doc(key), fieldState); st != stateCompleted {
		t.Errorf("state after the completion's statement: %v", st)
	}
}

// walkLiterals calls fn on every string value in v, saying whether it is
// inside a $literal.
func walkLiterals(v any, in bool, fn func(string, bool)) {
	switch v := v.(type) {
	case string:
		fn(v, in)
	case bson.D:
		for _, e := range v {
			walkLiterals(e.Value, in || e.Key == "$literal", fn)
		}
	case bson.A:
		for _, x := range v {
			walkLiterals(x, in, fn)
		}
	}
}

// TestBatchRoundTrips counts the commands of a batch on the model: the
// same whatever the number of items (TestBatchSplit counts them at
// MaxBatch and beyond), and a claim of one item is Claim's one command.
func TestBatchRoundTrips(t *testing.T) {
	for _, n := range []int{1, 10, 100} {
		s, m, _ := modelStore(t, nil)
		if err := s.Migrate(bg); err != nil {
			t.Fatal(err)
		}
		reqs := make([]idempotency.ClaimRequest, n)
		fin := make([]idempotency.Finish, n)
		for i := range reqs {
			reqs[i] = req(fmt.Sprint("k", i), "fp", fmt.Sprint("t", i), time.Minute)
			fin[i] = idempotency.Finish{Key: reqs[i].Key, Token: reqs[i].Token, Result: []byte("r"), Retention: time.Hour}
		}
		fresh := 2 // the bulk write and the find
		if n == 1 {
			fresh = 1 // Claim's findAndModify
		}
		steps := []struct {
			name string
			run  func() error
			want int
		}{
			{"fresh claims", func() error { return firstErr(s.ClaimBatch(bg, reqs)) }, fresh},
			{"completions", func() error { return errors.Join(s.FinishBatch(bg, fin)...) }, 1},
			{"replays", func() error {
				again := make([]idempotency.ClaimRequest, n)
				for i := range again {
					again[i] = req(reqs[i].Key, "fp", fmt.Sprint("u", i), time.Minute)
				}
				res, errs := s.ClaimBatch(bg, again)
				for i := range res {
					if errs[i] == nil && res[i].Outcome != idempotency.OutcomeReplay {
						return fmt.Errorf("item %d: %v, want a replay", i, res[i].Outcome)
					}
				}
				return errors.Join(errs...)
			}, 2},
			{"releases of absent records", func() error {
				rel := make([]idempotency.Finish, n)
				for i := range rel {
					rel[i] = idempotency.Finish{Key: fmt.Sprint("absent", i), Token: "t", Release: true}
				}
				return errors.Join(s.FinishBatch(bg, rel)...)
			}, 2},
		}
		for _, st := range steps {
			before := commandCount(m)
			if err := st.run(); err != nil {
				t.Fatalf("%d items, %s: %v", n, st.name, err)
			}
			if got := commandCount(m) - before; got != st.want {
				t.Errorf("%d items, %s: %d commands, want %d", n, st.name, got, st.want)
			}
		}
		if n == 100 {
			// Nothing was inserted for the absent records released.
			for i := range n {
				if d := m.doc(fmt.Sprint("absent", i)); d != nil {
					t.Fatalf("a batch release of an absent record wrote %v", d)
				}
			}
		}
	}

	// A takeover with checkpoints costs one more read, for them only.
	s, m, clock := modelStore(t, nil)
	claimOK(t, s, "cp", "fp", "old", time.Second, time.Hour)
	if err := s.Checkpoint(bg, "cp", "old", "step", []byte("1")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	before := commandCount(m)
	res, errs := s.ClaimBatch(bg, []idempotency.ClaimRequest{req("cp", "fp", "new", time.Minute), req("fresh", "fp", "new", time.Minute)})
	if err := errors.Join(errs...); err != nil || res[0].Outcome != idempotency.OutcomeAcquired || string(res[0].Checkpoints["step"]) != "1" || res[1].Checkpoints != nil {
		t.Fatalf("takeover with a checkpoint in a batch: %+v %v", res, err)
	}
	if got := commandCount(m) - before; got != 3 {
		t.Errorf("takeover with checkpoints: %d commands, want 3", got)
	}
}

func firstErr(_ []idempotency.ClaimResult, errs []error) error { return errors.Join(errs...) }

// TestBatchFinishNeverInserts checks the guard of the finishing
// statements: a completion or a release whose filter matches nothing
// writes nothing (no document for an absent key, the record untouched
// otherwise) and gets its own answer.
func TestBatchFinishNeverInserts(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	claimOK(t, s, "other", "fp", "holder", time.Minute, time.Minute)
	claimOK(t, s, "done", "fp", "mine", time.Minute, time.Minute)
	if err := s.Complete(bg, "done", "mine", []byte("kept"), time.Hour); err != nil {
		t.Fatal(err)
	}
	claimOK(t, s, "expired", "fp", "mine", time.Second, 0)
	clock.Advance(time.Second)
	before := map[string]bson.D{"other": m.doc("other"), "done": m.doc("done"), "expired": m.doc("expired")}
	errs := s.FinishBatch(bg, []idempotency.Finish{
		{Key: "absent-c", Token: "mine", Result: []byte("r"), Retention: time.Hour},
		{Key: "absent-r", Token: "mine", Release: true},
		{Key: "other", Token: "mine", Result: []byte("r"), Retention: time.Hour},
		{Key: "other", Token: "mine", Release: true},
		{Key: "done", Token: "mine", Release: true},
		{Key: "expired", Token: "mine", Result: []byte("r"), Retention: time.Hour},
		{Key: "expired", Token: "mine", Release: true},
	})
	want := []error{idempotency.ErrLeaseLost, nil, idempotency.ErrLeaseLost, idempotency.ErrLeaseLost, idempotency.ErrLeaseLost, idempotency.ErrLeaseLost, nil}
	for i, w := range want {
		if w == nil && errs[i] != nil || w != nil && !errors.Is(errs[i], w) {
			t.Errorf("item %d: %v, want %v", i, errs[i], w)
		}
	}
	for _, k := range []string{"absent-c", "absent-r"} {
		if d := m.doc(k); d != nil {
			t.Errorf("a batch finish of the absent %s inserted %v", k, d)
		}
	}
	for k, d := range before {
		if got := m.doc(k); compare(got, d) != 0 {
			t.Errorf("%s changed: %v, was %v", k, got, d)
		}
	}
}

// TestBatchPerItem checks that each item is answered on its own: an
// invalid request, a value over the limit, a statement the server
// refuses, as too large or for another reason, fail their item only.
func TestBatchPerItem(t *testing.T) {
	s, m, _ := modelStore(t, &Options{MaxValueSize: 10})
	reqs := []idempotency.ClaimRequest{req("a", "fp", "ta", time.Minute), req("b", "fp", "", time.Minute), req("c", "fp", "tc", time.Minute), req("d", "fp", "td", time.Minute), req("e", "fp", "te", time.Minute)}
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	// The statements sent are a, c, d and e: d's is refused as a shutdown
	// would, e's as too large.
	refuse := map[int]mongo.WriteError{2: {Code: 91, Message: "ShutdownInProgress"}, 3: {Code: codeUpdateResultTooLarge, Message: "Resulting document after update is larger than 16777216"}}
	m.statementErr = func(i int) error {
		if we, ok := refuse[i]; ok {
			we.Index = i
			return we
		}
		return nil
	}
	res, errs := s.ClaimBatch(bg, reqs)
	m.statementErr = nil
	if errs[0] != nil || res[0].Outcome != idempotency.OutcomeAcquired || errs[2] != nil || res[2].Outcome != idempotency.OutcomeAcquired {
		t.Errorf("items a and c: %+v %v, %+v %v, want acquired", res[0], errs[0], res[2], errs[2])
	}
	if !errors.Is(errs[1], idempotency.ErrInvalidArgument) {
		t.Errorf("item b (no token): %v, want ErrInvalidArgument", errs[1])
	}
	var se mongo.ServerError
	if errs[3] == nil || !errors.As(errs[3], &se) || !se.HasErrorCode(91) || !strings.HasPrefix(errs[3].Error(), "mongo: claim: ") {
		t.Errorf("item d: %v, want the server's error, wrapped", errs[3])
	}
	if !errors.Is(errs[4], idempotency.ErrTooLarge) {
		t.Errorf("item e: %v, want ErrTooLarge", errs[4])
	}

	fin := []idempotency.Finish{
		{Key: "a", Token: "ta", Result: []byte("0123456789"), Retention: time.Hour},
		{Key: "c", Token: "tc", Result: []byte("01234567890"), Retention: time.Hour},
		{Key: "c", Token: "tc", Result: nil, Retention: 0},
	}
	errs = s.FinishBatch(bg, fin)
	if errs[0] != nil {
		t.Errorf("completion at the limit: %v", errs[0])
	}
	if !errors.Is(errs[1], idempotency.ErrTooLarge) {
		t.Errorf("completion over the limit: %v, want ErrTooLarge", errs[1])
	}
	if !errors.Is(errs[2], idempotency.ErrInvalidArgument) {
		t.Errorf("completion without retention: %v, want ErrInvalidArgument", errs[2])
	}
	if st := lookup(m.doc("c"), fieldState); st != stateStarted {
		t.Errorf("c after refused completions: state %v, want started", st)
	}
}

// TestBatchWholeErrors checks the errors of a whole command: each item
// gets it (the write may have applied to any); a canceled context sends
// nothing; a bulk write refused as too large as a whole is sent again one
// item at a time, so that no item is told its result is too large when it
// is not.
func TestBatchWholeErrors(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	reqs := []idempotency.ClaimRequest{req("a", "fp", "ta", time.Minute), req("b", "fp", "tb", time.Minute)}
	m.failBulk = errors.New("connection reset by peer")
	_, errs := s.ClaimBatch(bg, reqs)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "connection reset") {
			t.Errorf("claim item %d after a lost connection: %v", i, err)
		}
	}
	if firstErr(s.ClaimBatch(bg, reqs)) != nil {
		t.Fatal("the batch repeated after the error")
	}

	ctx, cancel := context.WithCancel(bg)
	cancel()
	before := commandCount(m)
	_, errs = s.ClaimBatch(ctx, reqs)
	fe := s.FinishBatch(ctx, []idempotency.Finish{{Key: "a", Token: "ta", Release: true}})
	for _, err := range append(errs, fe...) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("under a canceled context: %v, want context.Canceled", err)
		}
	}
	if commandCount(m) != before {
		t.Error("a batch under a canceled context sent commands")
	}

	m.failBulk = mongo.CommandError{Code: codeBSONObjectTooLarge, Message: "BSONObj size: 16793600 (0x1003000) is invalid"}
	fin := []idempotency.Finish{{Key: "a", Token: "ta", Result: []byte("ra"), Retention: time.Hour}, {Key: "b", Token: "tb", Release: true}}
	for i, err := range s.FinishBatch(bg, fin) {
		if err != nil {
			t.Errorf("finish item %d after the whole write was refused as too large: %v, want it finished by a single call", i, err)
		}
	}
	if st := lookup(m.doc("a"), fieldState); st != stateCompleted {
		t.Errorf("a: state %v, want completed", st)
	}
}

// TestBatchRecordChanges checks the items whose record changes between
// the bulk write and the read: each is sent again, with its token, and
// decided as Claim would; one that keeps changing gets an error, and the
// others their answers.
func TestBatchRecordChanges(t *testing.T) {
	s, m, clock := modelStore(t, nil)
	claimOK(t, s, "blocked", "fp", "holder", time.Minute, time.Minute)
	// After the first bulk write: the holder of "blocked" releases it, and
	// "mine", just acquired by the batch with a lease of a second, is
	// taken over.
	updates := 0
	m.between = func(cmd string) {
		if cmd != "update" {
			return
		}
		updates++
		if updates == 1 {
			_ = s.Release(bg, "blocked", "holder")
			clock.Advance(time.Second)
			claimOK(t, s, "mine", "fp", "taker", time.Minute, time.Minute)
		}
	}
	res, errs := s.ClaimBatch(bg, []idempotency.ClaimRequest{req("blocked", "fp", "tb", time.Minute), req("mine", "fp", "tm", time.Second), req("plain", "fp", "tp", time.Minute)})
	m.between = nil
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != idempotency.OutcomeAcquired || res[0].Attempt != 1 {
		t.Errorf("claim whose blocker was released before the read: %+v, want acquired afresh", res[0])
	}
	if res[1].Outcome != idempotency.OutcomeInProgress {
		t.Errorf("claim acquired, then taken over before the read: %+v, want in progress (the taker's)", res[1])
	}
	if res[2].Outcome != idempotency.OutcomeAcquired {
		t.Errorf("untouched item: %+v", res[2])
	}
	// The takeover happened after the plain item's lease was set: its
	// record is as the batch left it.
	if err := s.Renew(bg, "plain", "tp", time.Minute); err != nil {
		t.Errorf("renew of the plain item: %v", err)
	}

	// A record that expires after every update and lives again before the
	// next: that item fails, the other is acquired.
	m.between = func(cmd string) {
		switch cmd {
		case "update":
			m.set("churn", setField(m.doc("churn"), fieldExpires, bson.DateTime(clock.ms()-1)))
		}
	}
	claimOK(t, s, "churn", "fp", "x", time.Minute, time.Minute)
	res, errs = s.ClaimBatch(bg, []idempotency.ClaimRequest{req("churn", "fp", "tc", time.Minute), req("calm", "fp", "tc", time.Minute)})
	m.between = nil
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "changed between the update and the read") {
		t.Errorf("claim of a record that keeps changing: %v, want an error", errs[0])
	}
	if errs[1] != nil || res[1].Outcome != idempotency.OutcomeAcquired {
		t.Errorf("the other item: %+v %v, want acquired", res[1], errs[1])
	}

	// A release whose record is held by its token again by the read (a
	// repeated claim between): sent again, and applied.
	claimOK(t, s, "rel", "fp", "tr", time.Minute, time.Minute)
	m.between = func(cmd string) {
		if cmd == "update" {
			m.between = nil
			claimOK(t, s, "rel", "fp", "tr", time.Minute, time.Minute)
		}
	}
	m.statementErr = func(int) error {
		m.statementErr = nil
		return mongo.WriteError{Code: codeNotHeld, Message: "refused once"}
	}
	if errs := s.FinishBatch(bg, []idempotency.Finish{{Key: "rel", Token: "tr", Release: true}}); errs[0] != nil {
		t.Errorf("release sent again: %v", errs[0])
	}
	if st := lookup(m.doc("rel"), fieldState); st != missing {
		t.Errorf("rel after the release: state %v, want a released record", st)
	}
}

// TestBatchOddKeys runs a batch over keys that would mean something else
// as expressions or are not UTF-8 (stored as binary _ids, which the read
// maps back to their keys).
func TestBatchOddKeys(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	keys := []string{"$f", "$$NOW", "a.b", "\xff\xfe", "plain", "\xff\xfe\x00"}
	reqs := make([]idempotency.ClaimRequest, len(keys))
	fin := make([]idempotency.Finish, len(keys))
	for i, k := range keys {
		reqs[i] = req(k, "$fp", "$$tok"+fmt.Sprint(i), time.Minute)
		fin[i] = idempotency.Finish{Key: k, Token: reqs[i].Token, Result: []byte(k), Retention: time.Hour}
	}
	res, errs := s.ClaimBatch(bg, reqs)
	for i := range keys {
		if errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired {
			t.Errorf("claim of %q: %+v %v", keys[i], res[i], errs[i])
		}
	}
	result := []byte("mutable")
	fin[0].Result = result
	if err := errors.Join(s.FinishBatch(bg, fin)...); err != nil {
		t.Fatal(err)
	}
	copy(result, "MUTATED")
	for i := range reqs {
		reqs[i].Token = idempotency.Token(fmt.Sprint("again", i))
	}
	res, errs = s.ClaimBatch(bg, reqs)
	for i, k := range keys {
		want := k
		if i == 0 {
			want = "mutable"
		}
		if errs[i] != nil || res[i].Outcome != idempotency.OutcomeReplay || string(res[i].Result) != want {
			t.Errorf("replay of %q: %+v %v, want %q", k, res[i], errs[i], want)
		}
	}
	if _, ok := lookup(m.doc("\xff\xfe"), fieldID).(bson.Binary); !ok {
		t.Error("a key that is not UTF-8 is not stored as binary")
	}
}

// TestDoBatchOnModel runs DoBatch through a runner on the model: fn runs
// once per key, the store is asked in three commands for the batch, and
// a batch larger than MaxBatch is split.
func TestDoBatchOnModel(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	// A store timeout the model's thousand statements fit in on a loaded
	// machine (the model is slower than a server).
	r, err := idempotency.New(s, idempotency.WithLease(3*time.Minute), idempotency.WithStoreTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	n := MaxBatch + MaxBatch/2
	reqs := make([]idempotency.Request, n)
	for i := range reqs {
		reqs[i] = idempotency.Request{Scope: []string{"t"}, Key: fmt.Sprint("k", i%(n-1))} // the last repeats the first
	}
	reqs[7].Key = "bad\x00key"
	ran := make([]int, n)
	fn := func(_ context.Context, i int) (int, error) { ran[i]++; return i, nil }
	before := commandCount(m)
	out := idempotency.DoBatch(bg, r, reqs, fn)
	if got := commandCount(m) - before; got != 6 {
		t.Errorf("DoBatch of %d items: %d commands, want 6 (two batches of three)", n, got)
	}
	for i, o := range out {
		switch {
		case i == 7:
			if !errors.Is(o.Err, idempotency.ErrInvalidKey) {
				t.Errorf("item 7: %v, want ErrInvalidKey", o.Err)
			}
		case o.Err != nil:
			t.Errorf("item %d: %v", i, o.Err)
		case i == n-1:
			// The first's key again, in the second chunk: a replay.
			if !o.Replayed || o.Value != 0 || ran[i] != 0 {
				t.Errorf("item %d, the first's key again: %+v, ran %d", i, o.Result, ran[i])
			}
		case !o.Ran || o.Value != i || ran[i] != 1:
			t.Errorf("item %d: %+v, ran %d", i, o.Result, ran[i])
		}
	}
	out = idempotency.DoBatch(bg, r, reqs[:100], fn)
	for i, o := range out {
		if i != 7 && (o.Err != nil || !o.Replayed || o.Value != i || ran[i] != 1) {
			t.Errorf("item %d again: %+v %v, ran %d", i, o.Result, o.Err, ran[i])
		}
	}
}

// TestBatchEmpty checks that an empty batch, or one whose every item is
// invalid, sends nothing (not even the set-up) and answers each item.
func TestBatchEmpty(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	for _, reqs := range [][]idempotency.ClaimRequest{nil, {}} {
		res, errs := s.ClaimBatch(bg, reqs)
		if len(res) != 0 || len(errs) != 0 {
			t.Errorf("ClaimBatch of %d items: %d results, %d errors", len(reqs), len(res), len(errs))
		}
	}
	if errs := s.FinishBatch(bg, nil); len(errs) != 0 {
		t.Errorf("FinishBatch of no items: %d errors", len(errs))
	}
	res, errs := s.ClaimBatch(bg, []idempotency.ClaimRequest{req("", "fp", "t", time.Minute), req("k", "fp", "", time.Minute)})
	if len(res) != 2 || !errors.Is(errs[0], idempotency.ErrInvalidArgument) || !errors.Is(errs[1], idempotency.ErrInvalidArgument) {
		t.Errorf("ClaimBatch of invalid items: %v", errs)
	}
	fe := s.FinishBatch(bg, []idempotency.Finish{{Key: "k", Token: "t", Result: []byte("r")}})
	if !errors.Is(fe[0], idempotency.ErrInvalidArgument) {
		t.Errorf("FinishBatch of a completion without retention: %v", fe[0])
	}
	if n := commandCount(m); n != 0 {
		t.Errorf("empty and invalid batches sent %d commands, want none", n)
	}
}

// TestBatchDuplicateKeys checks a batch that names one key several times
// (DoBatch never sends one, but a direct caller may): each item is
// decided as the same single calls in that order would be, and the key
// is acquired once.
func TestBatchDuplicateKeys(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	res, errs := s.ClaimBatch(bg, []idempotency.ClaimRequest{
		req("k", "fp", "t1", time.Minute),
		req("k", "fp", "t2", time.Minute),
		req("k", "fp", "t1", time.Minute),
		req("k", "other", "t3", time.Minute),
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := []idempotency.Outcome{idempotency.OutcomeAcquired, idempotency.OutcomeInProgress, idempotency.OutcomeAcquired, idempotency.OutcomeMismatch}
	for i, w := range want {
		if res[i].Outcome != w {
			t.Errorf("item %d: %v, want %v", i, res[i].Outcome, w)
		}
	}
	if res[0].Fence != res[2].Fence || res[0].Attempt != 1 || res[2].Attempt != 1 {
		t.Errorf("the holder's two claims: fences %d and %d, attempts %d and %d, want one fence and attempt 1", res[0].Fence, res[2].Fence, res[0].Attempt, res[2].Attempt)
	}
	if tok, _ := decodeString(toRaw(t, lookup(m.doc("k"), fieldToken))); tok != "t1" {
		t.Errorf("holder %q, want t1", tok)
	}
	fe := s.FinishBatch(bg, []idempotency.Finish{
		{Key: "k", Token: "t1", Result: []byte("first"), Retention: time.Hour},
		{Key: "k", Token: "t1", Result: []byte("second"), Retention: time.Hour},
		{Key: "k", Token: "t1", Release: true},
		{Key: "k", Token: "t2", Result: []byte("t2's"), Retention: time.Hour},
	})
	if fe[0] != nil || fe[1] != nil || !errors.Is(fe[2], idempotency.ErrLeaseLost) || !errors.Is(fe[3], idempotency.ErrLeaseLost) {
		t.Errorf("FinishBatch of one key four times: %v, want nil, nil (a repeat), ErrLeaseLost (a release of a completed record), ErrLeaseLost (another token)", fe)
	}
	r, err := s.Claim(bg, req("k", "fp", "t4", time.Minute))
	if err != nil || r.Outcome != idempotency.OutcomeReplay || string(r.Result) != "first" {
		t.Errorf("replay: %+v %v, want the first completion's result", r, err)
	}
}

// toRaw wraps a model value as the driver's RawValue, for decodeString.
func toRaw(t *testing.T, v any) bson.RawValue {
	t.Helper()
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bson.RawValue{Type: typ, Value: data}
}

// TestBatchInvalidInTheMiddle checks that invalid items among valid ones
// get their own errors, are not sent, and leave the others to run.
func TestBatchInvalidInTheMiddle(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	reqs := []idempotency.ClaimRequest{
		req("a", "fp", "ta", time.Minute),
		req("", "fp", "tx", time.Minute),
		req("b", "fp", "tb", time.Minute),
		req("c", "fp", "tc", 0),
		req("d", "fp", "td", time.Minute),
	}
	res, errs := s.ClaimBatch(bg, reqs)
	for _, i := range []int{1, 3} {
		if !errors.Is(errs[i], idempotency.ErrInvalidArgument) || res[i].Outcome != idempotency.OutcomeUnknown {
			t.Errorf("invalid item %d: %+v %v, want ErrInvalidArgument and no outcome", i, res[i], errs[i])
		}
	}
	for _, i := range []int{0, 2, 4} {
		if errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired {
			t.Errorf("valid item %d: %+v %v, want acquired", i, res[i], errs[i])
		}
	}
	if m.doc("") != nil || m.doc("c") != nil {
		t.Error("an invalid item was written")
	}
	fe := s.FinishBatch(bg, []idempotency.Finish{
		{Key: "a", Token: "ta", Result: []byte("a"), Retention: time.Hour},
		{Key: "b", Token: "tb", Result: []byte("b")},
		{Key: "d", Token: "td", Release: true},
	})
	if fe[0] != nil || !errors.Is(fe[1], idempotency.ErrInvalidArgument) || fe[2] != nil {
		t.Errorf("FinishBatch with an invalid item in the middle: %v", fe)
	}
	if lookup(m.doc("a"), fieldState) != stateCompleted || lookup(m.doc("b"), fieldState) != stateStarted || lookup(m.doc("d"), fieldState) != missing {
		t.Errorf("records after the FinishBatch: a %v, b %v, d %v; want completed, started (untouched), released",
			lookup(m.doc("a"), fieldState), lookup(m.doc("b"), fieldState), lookup(m.doc("d"), fieldState))
	}
}

// TestBatchSplit checks a batch larger than MaxBatch given to the store
// directly: split into runs of MaxBatch, two commands per run of claims
// and one per run of completions, and every item answered.
func TestBatchSplit(t *testing.T) {
	s, m, _ := modelStore(t, nil)
	if err := s.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	n := 2*MaxBatch + 3
	reqs := make([]idempotency.ClaimRequest, n)
	fin := make([]idempotency.Finish, n)
	for i := range reqs {
		reqs[i] = req(fmt.Sprint("k", i), "fp", fmt.Sprint("t", i), time.Minute)
		fin[i] = idempotency.Finish{Key: reqs[i].Key, Token: reqs[i].Token, Result: []byte(fmt.Sprint(i)), Retention: time.Hour}
	}
	reqs[MaxBatch].Key = "" // the first item of the second run is invalid
	before := commandCount(m)
	res, errs := s.ClaimBatch(bg, reqs)
	if got := commandCount(m) - before; got != 6 {
		t.Errorf("ClaimBatch of %d items: %d commands, want 6", n, got)
	}
	for i := range reqs {
		switch {
		case i == MaxBatch:
			if !errors.Is(errs[i], idempotency.ErrInvalidArgument) {
				t.Errorf("item %d: %v, want ErrInvalidArgument", i, errs[i])
			}
		case errs[i] != nil || res[i].Outcome != idempotency.OutcomeAcquired:
			t.Fatalf("item %d: %+v %v, want acquired", i, res[i], errs[i])
		}
	}
	fin[MaxBatch].Key = ""
	before = commandCount(m)
	fe := s.FinishBatch(bg, fin)
	if got := commandCount(m) - before; got != 3 {
		t.Errorf("FinishBatch of %d items: %d commands, want 3", n, got)
	}
	for i, err := range fe {
		if i != MaxBatch && err != nil {
			t.Fatalf("finish item %d: %v", i, err)
		}
	}
	if !errors.Is(fe[MaxBatch], idempotency.ErrLeaseLost) {
		t.Errorf("completion of the key never claimed: %v, want ErrLeaseLost", fe[MaxBatch])
	}
	if m.maxBulk > MaxBatch {
		t.Errorf("a bulk write of %d statements, more than MaxBatch %d", m.maxBulk, MaxBatch)
	}
	if st := lookup(m.doc(fmt.Sprint("k", n-1)), fieldState); st != stateCompleted {
		t.Errorf("the last item: state %v, want completed", st)
	}
}

// TestBatchNotHeldErrors checks that a finishing statement refused by the
// guard or by the unique index is "not held", and any other write error
// is the item's error.
func TestBatchNotHeldErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{mongo.WriteError{Code: codeNotHeld, Message: "'replacement document' must evaluate to an object"}, true},
		{mongo.WriteError{Code: 11000, Message: "E11000 duplicate key error"}, true},
		{mongo.WriteError{Code: 91, Message: "ShutdownInProgress"}, false},
		{mongo.WriteError{Code: codeUpdateResultTooLarge}, false},
		{errors.New("other"), false},
		{nil, false},
	} {
		if got := isNotHeld(c.err); got != c.want {
			t.Errorf("isNotHeld(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// crashingFinish is the store of a process that dies in the middle of a
// FinishBatch: only the first landed items' writes reach the store; what
// the process is told afterwards no longer matters.
type crashingFinish struct {
	*Store
	landed int
}

func (c *crashingFinish) Capabilities() idempotency.Capabilities {
	caps := c.Store.Capabilities()
	caps.Batcher = c
	return caps
}

func (c *crashingFinish) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	c.Store.FinishBatch(ctx, items[:min(c.landed, len(items))])
	return make([]error, len(items))
}

// TestBatchCrash crashes a DoBatch after half of its completions landed
// (the lease then ends, as a dead process's does): the completed items
// replay, and the others are taken over exactly once by four batches
// racing over the same keys.
func TestBatchCrash(t *testing.T) {
	s, _, clock := modelStore(t, nil)
	const n, half = 10, 5
	reqs := make([]idempotency.Request, n)
	for i := range reqs {
		reqs[i] = idempotency.Request{Scope: []string{"t"}, Key: fmt.Sprint("crash-", i)}
	}
	var ran [n]atomic.Int32
	fn := func(_ context.Context, i int) (int, error) { ran[i].Add(1); return i, nil }
	dead, err := idempotency.New(&crashingFinish{Store: s, landed: half}, idempotency.WithLease(time.Minute), idempotency.WithStoreTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	idempotency.DoBatch(bg, dead, reqs, fn)
	clock.Advance(time.Minute + time.Second)

	var wg sync.WaitGroup
	outs := make([][]idempotency.BatchResult[int], 4)
	for g := range outs {
		r, err := idempotency.New(s, idempotency.WithLease(time.Minute), idempotency.WithStoreTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { outs[g] = idempotency.DoBatch(bg, r, reqs, fn) })
	}
	wg.Wait()
	for i := range n {
		want := int32(1)
		if i >= half {
			want = 2 // once before the crash, once by the takeover
		}
		if got := ran[i].Load(); got != want {
			t.Errorf("item %d ran %d times, want %d", i, got, want)
		}
		took := 0
		for g, out := range outs {
			o := out[i]
			switch {
			case o.Ran:
				took++
				if i < half {
					t.Errorf("batch %d ran the completed item %d", g, i)
				}
			case i < half && (o.Err != nil || !o.Replayed || o.Value != i):
				t.Errorf("batch %d, completed item %d: %+v %v, want a replay", g, i, o.Result, o.Err)
			case i >= half && o.Err == nil && !o.Replayed:
				t.Errorf("batch %d, item %d: %+v, want ran, replayed or an error (in progress)", g, i, o.Result)
			}
		}
		if i >= half && took != 1 {
			t.Errorf("item %d taken over by %d batches, want exactly 1", i, took)
		}
	}
}
