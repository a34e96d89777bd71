package lincheck

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/exactlyonce/idempotency"
)

// Testing the tester: the same check must find deliberately broken stores
// non-linearizable. toyStore is a small store of the contract without
// expiry (the workload never lets anything expire) with one fault at a
// time switched on; without a fault it must pass, which shows that what
// the check catches is the fault.

type fault int

const (
	faultNone fault = iota
	// Claim reads the record, yields, then writes what it decided from
	// that read (rule 1 broken): two claimers can both find the key
	// absent and both acquire it.
	faultReadThenWrite
	// Complete completes a STARTED record whoever holds it (rule 2
	// broken).
	faultCompleteIgnoresToken
	// Fences count per record and restart when it is deleted, so a
	// re-created record reuses an old holder's fence.
	faultFenceRestarts
	// Complete of a record already COMPLETED under the same token reports
	// a lost lease (rule 4 broken): a holder retrying a Complete whose
	// reply was lost is told it lost the lease.
	faultRepeatLost
)

func (f fault) String() string {
	return [...]string{"none", "read-then-write claim", "complete ignores token", "fence restarts", "repeated complete lost"}[f]
}

type toyRecord struct {
	fp        idempotency.Fingerprint
	completed bool
	token     idempotency.Token
	fence     int64
	attempt   int
	cps       map[string][]byte
	result    []byte
}

type toyStore struct {
	fault fault
	mu    sync.Mutex
	recs  map[string]toyRecord
	fence int64 // last fence handed out, store-wide
}

func newToy(f fault) *toyStore { return &toyStore{fault: f, recs: map[string]toyRecord{}} }

var _ idempotency.Store = (*toyStore)(nil)

func (s *toyStore) Claim(_ context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[r.Key]
	if s.fault == faultReadThenWrite {
		// Decide from this read, after letting other goroutines run.
		s.mu.Unlock()
		runtime.Gosched()
		s.mu.Lock()
	}
	if !ok {
		fence := s.fence + 1
		if s.fault == faultFenceRestarts {
			fence = 1
		}
		s.fence = fence
		s.recs[r.Key] = toyRecord{fp: r.Fingerprint, token: r.Token, fence: fence, attempt: 1}
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: fence, Attempt: 1}, nil
	}
	res := idempotency.ClaimResult{Fence: rec.fence, Attempt: rec.attempt}
	switch {
	case rec.fp != r.Fingerprint:
		res.Outcome = idempotency.OutcomeMismatch
	case rec.completed:
		res.Outcome = idempotency.OutcomeReplay
		res.Result = append([]byte{}, rec.result...)
	case rec.token == r.Token:
		res.Outcome = idempotency.OutcomeAcquired
		res.Checkpoints = maps.Clone(rec.cps)
	default:
		res.Outcome = idempotency.OutcomeInProgress
		res.RetryAfter = lease / 2
	}
	return res, nil
}

// held returns the STARTED record under key held under token.
func (s *toyStore) held(key string, token idempotency.Token) (toyRecord, bool) {
	rec, ok := s.recs[key]
	return rec, ok && !rec.completed && rec.token == token
}

func (s *toyStore) Renew(_ context.Context, key string, token idempotency.Token, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held(key, token); !ok {
		return idempotency.ErrLeaseLost
	}
	return nil
}

func (s *toyStore) Checkpoint(_ context.Context, key string, token idempotency.Token, name string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(key, token)
	if !ok {
		return idempotency.ErrLeaseLost
	}
	rec.cps = maps.Clone(rec.cps)
	if rec.cps == nil {
		rec.cps = map[string][]byte{}
	}
	rec.cps[name] = append([]byte{}, value...)
	s.recs[key] = rec
	return nil
}

func (s *toyStore) Complete(_ context.Context, key string, token idempotency.Token, result []byte, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[key]
	if s.fault == faultCompleteIgnoresToken {
		token = rec.token
	}
	switch {
	case !ok || rec.token != token:
		return idempotency.ErrLeaseLost
	case rec.completed && s.fault == faultRepeatLost:
		return idempotency.ErrLeaseLost
	case rec.completed:
		return nil
	}
	rec.completed, rec.result, rec.cps = true, append([]byte{}, result...), nil
	s.recs[key] = rec
	return nil
}

func (s *toyStore) Release(_ context.Context, key string, token idempotency.Token) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[key]
	switch {
	case !ok:
		return nil
	case rec.completed || rec.token != token:
		return idempotency.ErrLeaseLost
	}
	delete(s.recs, key)
	return nil
}

// brokenWorkload is the memory store's workload, smaller: a broken store
// shows within a few hundred operations per key.
var brokenWorkload = workload{Clients: 8, OpsPerClient: 200, KeysPerPhase: 3, PhaseLen: 40}

func TestToyStoreWithoutFault(t *testing.T) {
	checkStore(t, newToy(faultNone), memoryWorkload)
}

func TestCatchesBrokenStores(t *testing.T) {
	const tries = 5
	for _, f := range []fault{faultReadThenWrite, faultCompleteIgnoresToken, faultFenceRestarts, faultRepeatLost} {
		t.Run(f.String(), func(t *testing.T) {
			for try := range tries {
				w := brokenWorkload
				w.Seed = uint64(100 + try)
				h := record(t, newToy(f), w)
				res := porcupine.CheckOperationsTimeout(model, h.ops, checkTimeout)
				if res == porcupine.Illegal {
					t.Logf("caught on try %d of %d (%d operations)", try+1, tries, len(h.ops))
					checkVisualization(t, h.ops)
					return
				}
				t.Logf("try %d: porcupine says %s: %s", try+1, res, h.summary())
			}
			t.Fatalf("the check did not catch a store with fault %q in %d tries", f, tries)
		})
	}
}

// checkVisualization writes the visualization of an illegal history, as a
// failing test does, and checks that there is one.
func checkVisualization(t *testing.T, ops []porcupine.Operation) {
	path := visualize(t, ops)
	defer os.Remove(path)
	fi, err := os.Stat(path)
	if err != nil || fi.Size() == 0 || filepath.Ext(path) != ".html" {
		t.Errorf("visualization %s: %v, %v", path, fi, err)
	}
}
