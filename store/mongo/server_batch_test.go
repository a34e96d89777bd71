package mongo_test

// The Batcher against the real server: the commands a batch costs, the
// guard that keeps a batch's completions and releases from inserting, and
// a batch of results too large for one command (the driver splits it).
// The conformance suite's batch cases run in TestConformance.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// monitored returns a store on a client of its own whose commands the
// returned function counts, by name, since its last call.
func monitored(t *testing.T, opts *idemmongo.Options) (*idemmongo.Store, *mongo.Collection, func() map[string]int) {
	t.Helper()
	server(t)
	var mu sync.Mutex
	counts := map[string]int{}
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		counts[e.CommandName]++
		mu.Unlock()
	}}
	c, err := mongo.Connect(options.Client().ApplyURI(os.Getenv(envURI)).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	coll := freshCollection(t, c)
	s := newStore(t, coll, opts)
	return s, coll, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := counts
		counts = map[string]int{}
		return out
	}
}

func batchReqs(prefix string, n int) []idempotency.ClaimRequest {
	reqs := make([]idempotency.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = idempotency.ClaimRequest{Key: fmt.Sprint(prefix, i), Fingerprint: "fp", Token: idempotency.Token(fmt.Sprint(prefix, "-tok-", i, "-", randomHex(4))), Lease: time.Minute, Grace: time.Minute}
	}
	return reqs
}

// TestBatchCommands counts the commands of a batch of 500: one update and
// one find for the claims, one update for the completions, and the same
// for a replay of them all.
func TestBatchCommands(t *testing.T) {
	s, _, since := monitored(t, nil)
	ctx := context.Background()
	since()
	reqs := batchReqs("cmd", 500)
	_, errs := s.ClaimBatch(ctx, reqs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := since(); got["update"] != 1 || got["find"] != 1 || len(got) != 2 {
		t.Errorf("ClaimBatch of 500 fresh keys: commands %v, want one update and one find", got)
	}
	fin := make([]idempotency.Finish, len(reqs))
	for i, r := range reqs {
		fin[i] = idempotency.Finish{Key: r.Key, Token: r.Token, Result: []byte(r.Key), Retention: time.Hour}
	}
	if err := errors.Join(s.FinishBatch(ctx, fin)...); err != nil {
		t.Fatal(err)
	}
	if got := since(); got["update"] != 1 || len(got) != 1 {
		t.Errorf("FinishBatch of 500: commands %v, want one update", got)
	}
	again := batchReqs("cmd", 500)
	res, errs := s.ClaimBatch(ctx, again)
	for i := range res {
		if errs[i] != nil || res[i].Outcome != idempotency.OutcomeReplay || string(res[i].Result) != reqs[i].Key {
			t.Fatalf("item %d again: %+v %v, want a replay of its result", i, res[i], errs[i])
		}
	}
	if got := since(); got["update"] != 1 || got["find"] != 1 || len(got) != 2 {
		t.Errorf("ClaimBatch of 500 completed keys: commands %v, want one update and one find", got)
	}
}

// TestBatchGuard checks on the server what FinishBatch relies on: a
// guarded completion or release whose filter matches nothing is refused
// by the server as its own write error (a replacement that is not a
// document), inserts nothing, and leaves the other statements applied.
func TestBatchGuard(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	s := newStore(t, coll, nil)
	ctx := context.Background()
	claim(t, s, "held", "fp", "holder", time.Minute, time.Minute)
	claim(t, s, "mine", "fp", "me", time.Minute, time.Minute)
	errs := s.FinishBatch(ctx, []idempotency.Finish{
		{Key: "absent", Token: "me", Result: []byte("r"), Retention: time.Hour},
		{Key: "held", Token: "me", Result: []byte("r"), Retention: time.Hour},
		{Key: "mine", Token: "me", Result: []byte("mine"), Retention: time.Hour},
		{Key: "absent-r", Token: "me", Release: true},
		{Key: "held", Token: "me", Release: true},
	})
	want := []error{idempotency.ErrLeaseLost, idempotency.ErrLeaseLost, nil, nil, idempotency.ErrLeaseLost}
	for i, w := range want {
		if w == nil && errs[i] != nil || w != nil && !errors.Is(errs[i], w) {
			t.Errorf("item %d: %v, want %v", i, errs[i], w)
		}
	}
	for _, k := range []string{"absent", "absent-r"} {
		if d := rawDoc(t, coll, k); d != nil {
			t.Errorf("a batch finish of the absent %q inserted %s", k, d)
		}
	}
	if st, _ := rawDoc(t, coll, "held").Lookup("s").StringValueOK(); st != "started" {
		t.Errorf("held: state %q, want started (untouched)", st)
	}
	res := claim(t, s, "mine", "fp", "other", time.Minute, time.Minute)
	if res.Outcome != idempotency.OutcomeReplay || string(res.Result) != "mine" {
		t.Errorf("mine: %+v, want a replay", res)
	}
}

// TestBatchLargeResults finishes a batch whose results (40 of 4 MiB, and
// one of MaxValueLimit under the longest key) are more than one command
// carries: the driver splits the bulk write, and every item is completed.
func TestBatchLargeResults(t *testing.T) {
	s, _, since := monitored(t, &idemmongo.Options{MaxValueSize: idemmongo.MaxValueLimit})
	ctx := context.Background()
	reqs := batchReqs("big", 40)
	reqs = append(reqs, idempotency.ClaimRequest{Key: strings.Repeat("k", idempotency.MaxStorageKeyLen), Fingerprint: idempotency.Fingerprint(strings.Repeat("f", idempotency.MaxFingerprintLen)), Token: "longest", Lease: time.Minute, Grace: time.Minute})
	if _, errs := s.ClaimBatch(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	fin := make([]idempotency.Finish, len(reqs))
	for i, r := range reqs {
		size := 4 << 20
		if i == len(reqs)-1 {
			size = idemmongo.MaxValueLimit
		}
		fin[i] = idempotency.Finish{Key: r.Key, Token: r.Token, Result: bytes.Repeat([]byte{byte(i)}, size), Retention: time.Hour}
	}
	since()
	for i, err := range s.FinishBatch(ctx, fin) {
		if err != nil {
			t.Errorf("item %d: %v", i, err)
		}
	}
	if got := since(); got["update"] < 2 {
		t.Errorf("FinishBatch of about 176 MiB of results: commands %v, want the bulk write split into several updates", got)
	} else {
		t.Logf("FinishBatch of about 176 MiB of results: commands %v", got)
	}
	for i, r := range reqs {
		r.Token = "again"
		res, err := s.Claim(ctx, r)
		if err != nil || res.Outcome != idempotency.OutcomeReplay || !bytes.Equal(res.Result, fin[i].Result) {
			t.Fatalf("item %d: %v %v, want a replay of its result", i, res.Outcome, err)
		}
	}
}

// TestBatchDuplicateKeysServer claims one key several times in one batch,
// 20 rounds: whatever order the server applies the unordered statements
// in, exactly one token acquires it, and the items of one token get one
// answer.
func TestBatchDuplicateKeysServer(t *testing.T) {
	c := server(t)
	s := newStore(t, freshCollection(t, c), nil)
	ctx := context.Background()
	for round := range 20 {
		key := fmt.Sprint("dup-", round)
		toks := []idempotency.Token{"t1", "t2", "t1", "t3"}
		fps := []idempotency.Fingerprint{"fp", "fp", "fp", "other"}
		reqs := make([]idempotency.ClaimRequest, len(toks))
		for i := range reqs {
			reqs[i] = idempotency.ClaimRequest{Key: key, Fingerprint: fps[i], Token: toks[i], Lease: time.Minute, Grace: time.Minute}
		}
		res, errs := s.ClaimBatch(ctx, reqs)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		holders := map[idempotency.Token]bool{}
		for i, r := range res {
			if r.Outcome == idempotency.OutcomeAcquired {
				holders[toks[i]] = true
			}
		}
		if len(holders) != 1 {
			t.Fatalf("round %d: outcomes %v %v %v %v, want exactly one token acquiring", round, res[0].Outcome, res[1].Outcome, res[2].Outcome, res[3].Outcome)
		}
		if res[0].Outcome != res[2].Outcome || res[0].Fence != res[2].Fence {
			t.Errorf("round %d: the two items of t1: %+v and %+v, want one answer", round, res[0], res[2])
		}
	}
}
