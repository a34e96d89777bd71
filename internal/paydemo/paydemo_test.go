package paydemo

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// noWatch hides the memory store's Watch, as the PostgreSQL store has none.
type noWatch struct{ s *memory.Store }

func (n noWatch) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return n.s.Claim(ctx, r)
}
func (n noWatch) Renew(ctx context.Context, k string, t idempotency.Token, d time.Duration) error {
	return n.s.Renew(ctx, k, t, d)
}
func (n noWatch) Checkpoint(ctx context.Context, k string, t idempotency.Token, name string, v []byte) error {
	return n.s.Checkpoint(ctx, k, t, name, v)
}
func (n noWatch) Complete(ctx context.Context, k string, t idempotency.Token, r []byte, d time.Duration) error {
	return n.s.Complete(ctx, k, t, r, d)
}
func (n noWatch) Release(ctx context.Context, k string, t idempotency.Token) error {
	return n.s.Release(ctx, k, t)
}

// The crash wrapper is a Watcher exactly when the store under it is.
func TestWrapperWatchesOnlyWhenStoreDoes(t *testing.T) {
	if _, ok := newDemo(memStore(nil)).store.forRunner().(idempotency.Watcher); !ok {
		t.Fatal("the wrapped memory store lost its Watch")
	}
	if _, ok := newDemo(noWatch{memStore(nil)}).store.forRunner().(idempotency.Watcher); ok {
		t.Fatal("the wrapper claims to watch a store that cannot")
	}
}

// A killed holder's calls never reach the store: its lease must run out.
func TestKilledHolderIsCutOff(t *testing.T) {
	ctx := context.Background()
	s := newDemo(memStore(nil)).store
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t1", Lease: time.Minute})
	if err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	s.kill("k")
	for name, err := range map[string]error{
		"renew":      s.Renew(ctx, "k", "t1", time.Minute),
		"checkpoint": s.Checkpoint(ctx, "k", "t1", "step", []byte("x")),
		"complete":   s.Complete(ctx, "k", "t1", []byte("r"), time.Minute),
		"release":    s.Release(ctx, "k", "t1"),
	} {
		if !errors.Is(err, errDead) {
			t.Fatalf("%s by the dead holder: %v, want it dropped", name, err)
		}
	}
	res, err = s.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: "f", Token: "t2", Lease: time.Minute})
	if err != nil || res.Outcome != idempotency.OutcomeInProgress {
		t.Fatalf("claim after the crash: %+v %v, want the dead lease still in force", res, err)
	}
}

// The scenario on a store without Watch (as PostgreSQL's) charges every
// intent once.
func TestRunWithoutWatcher(t *testing.T) {
	var out bytes.Buffer
	ok, err := Run(noWatch{memStore(nil)}, Config{Seed: 11, Verbose: true}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("not every intent charged once:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "worker-crash-takeover") || !strings.Contains(out.String(), "-> 201") {
		t.Fatalf("no crash row or no verbose client line in\n%s", out.String())
	}
}

func TestRunNilStore(t *testing.T) {
	if _, err := Run(nil, Config{}, &bytes.Buffer{}); err == nil {
		t.Fatal("nil store accepted")
	}
}
