package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// txStore is a memory store with a Transactional part: a context marked
// with txMark runs "in a transaction" (the memory store cannot roll back,
// which these tests do not need).
type txStore struct{ *memory.Store }

type txMark struct{}

func (s txStore) Capabilities() idempotency.Capabilities {
	c := idempotency.CapabilitiesOf(s.Store)
	c.Transactional = s
	return c
}

func (txStore) InTx(ctx context.Context) bool { return ctx.Value(txMark{}) != nil }

func (txStore) Discard(context.Context, string, idempotency.Token) error { return nil }

// A duplicate in a transaction is not waited for, even with WithWait: Do
// claims once and answers ErrInProgress, since waiting would hold the
// transaction (and its connection) for the length of the other call. The
// same runner outside a transaction waits.
func TestNoWaitInTransaction(t *testing.T) {
	var o recorder
	r, err := idempotency.New(txStore{memStore(nil)}, idempotency.WithWait(time.Minute), idempotency.WithObserver(&o))
	if err != nil {
		t.Fatal(err)
	}
	if r.Wait() != time.Minute {
		t.Fatalf("Wait() = %v, want the WithWait of a minute", r.Wait())
	}
	ctx := context.Background()
	release, first := holdKey(r, "k")
	res, err := idempotency.Do(context.WithValue(ctx, txMark{}, true), r, req("k"), func(ctx context.Context) (string, error) {
		t.Error("the duplicate ran fn")
		return "", nil
	})
	var ip *idempotency.InProgressError
	if !errors.As(err, &ip) || res.Outcome != idempotency.OutcomeInProgress || ip.RetryAfter <= 0 {
		t.Fatalf("duplicate in a transaction: %+v, %v; want ErrInProgress with a hint at once", res, err)
	}
	o.mu.Lock()
	inProgress := 0
	for _, e := range o.events {
		if e.Outcome == idempotency.OutcomeInProgress {
			inProgress++
		}
	}
	o.mu.Unlock()
	if inProgress != 1 {
		t.Fatalf("%d in-progress claims, want 1: the duplicate claimed again, waiting in its transaction", inProgress)
	}
	// Outside a transaction the same runner waits for the result.
	waited := make(chan idempotency.Result[string], 1)
	go func() {
		res, _ := idempotency.Do(ctx, r, req("k"), func(ctx context.Context) (string, error) { return "", nil })
		waited <- res
	}()
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if res := <-waited; !res.Replayed || res.Value != "result" {
		t.Fatalf("waiter outside a transaction: %+v, want the replayed result", res)
	}
}

// Wait is 0 without WithWait.
func TestRunnerWaitDefault(t *testing.T) {
	r, _, _ := newRunner(t)
	if r.Wait() != 0 {
		t.Fatalf("Wait() = %v, want 0", r.Wait())
	}
}

// holdKey starts a call of Do for key whose fn runs until release is
// called and then returns "result"; it returns once fn runs. first gets
// the call's error.
func holdKey(r *idempotency.Runner, key string) (release func(), first <-chan error) {
	started, done := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), r, req(key), func(ctx context.Context) (string, error) {
			close(started)
			<-done
			return "result", nil
		})
		errc <- err
	}()
	<-started
	return sync.OnceFunc(func() { close(done) }), errc
}
