package chaos_test

// The workload of the failover trials: clients running Do on fresh keys
// against whichever runner is current, and the accounting of what the
// store acknowledged, what it kept and what ran twice.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
)

// foKey is what the test knows of one key.
type foKey struct {
	claimAcked    atomic.Bool  // fn started: the store acknowledged a claim
	completeAcked atomic.Bool  // Do returned fn's result: the store acknowledged the completion
	effects       atomic.Int32 // fn's effect, once per run of fn
}

// A foWorkload is a set of clients, each running Do on one fresh key after
// another (retrying a key until it gets a result), against Current. fn's
// effect is a plain write without a downstream key or a recovery point, so
// that a lost claim or completion shows as an effect run twice.
type foWorkload struct {
	Current atomic.Pointer[idempotency.Runner]
	work    time.Duration
	stop    atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	keys    map[string]*foKey
	order   []string
}

func (w *foWorkload) fn(k *foKey) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		k.claimAcked.Store(true)
		info, _ := idempotency.FromContext(ctx)
		time.Sleep(w.work)
		k.effects.Add(1)
		return info.Fence, nil
	}
}

// foStart starts clients on r, fn working for work, on keys that start
// with prefix.
func foStart(r *idempotency.Runner, clients int, work time.Duration, prefix string) *foWorkload {
	w := &foWorkload{work: work, keys: map[string]*foKey{}}
	w.Current.Store(r)
	for c := range clients {
		w.wg.Go(func() {
			for j := 0; j < 100000 && !w.stop.Load(); j++ {
				key := fmt.Sprintf("%s%d-%d", prefix, c, j)
				k := &foKey{}
				w.mu.Lock()
				w.keys[key], w.order = k, append(w.order, key)
				w.mu.Unlock()
				for !w.stop.Load() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					res, err := idempotency.Do(ctx, w.Current.Load(), netRequest(key), w.fn(k))
					cancel()
					if err == nil {
						if !res.Replayed {
							k.completeAcked.Store(true)
						}
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	return w
}

// Stop stops the clients and waits for them.
func (w *foWorkload) Stop() {
	w.stop.Store(true)
	w.wg.Wait()
}

// A foLookup reads key's record: whether it exists and whether it is
// COMPLETED.
type foLookup func(ctx context.Context, key string) (exists, completed bool, err error)

// foInspect looks records up through r's Inspector.
func foInspect(r *idempotency.Runner) foLookup {
	return func(ctx context.Context, key string) (bool, bool, error) {
		info, err := r.Inspect(ctx, netRequest(key), false)
		if errors.Is(err, idempotency.ErrNotFound) {
			return false, false, nil
		}
		return err == nil, err == nil && info.State == idempotency.StateCompleted, err
	}
}

// Lost looks up every key whose claim was acknowledged: a claim is lost
// when the record is gone, a completion when the record is not COMPLETED.
// acked counts the acknowledged writes.
func (w *foWorkload) Lost(t *testing.T, ctx context.Context, lookup foLookup) (claims, completions, acked int) {
	for _, key := range w.order {
		k := w.keys[key]
		if !k.claimAcked.Load() {
			continue
		}
		acked++
		if k.completeAcked.Load() {
			acked++
		}
		// The test's own reads are retried: on a loaded machine a read
		// may time out, and only what the store kept is measured here.
		var exists, completed bool
		var err error
		for range 20 {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			exists, completed, err = lookup(lctx, key)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		switch {
		case err != nil:
			t.Fatalf("look up %s: %v", key, err)
		case !exists:
			claims++
			if k.completeAcked.Load() {
				completions++
			}
		case k.completeAcked.Load() && !completed:
			completions++
		}
	}
	return claims, completions, acked
}

// Recover retries every key through r until it gets a result, with as
// many clients as the workload had (a key that is not ready goes back in
// the queue), and returns the longest time from since until a key's
// result, and how many effects ran more than once. A key without a result
// after bound fails the test.
func (w *foWorkload) Recover(t *testing.T, r *idempotency.Runner, since time.Time, bound time.Duration, clients int) (longest time.Duration, duplicates int) {
	queue := make(chan string, len(w.order))
	for _, key := range w.order {
		queue <- key
	}
	var (
		wg        sync.WaitGroup
		remaining atomic.Int64
		mu        sync.Mutex
	)
	remaining.Store(int64(len(w.order)))
	for range clients {
		wg.Go(func() {
			for remaining.Load() > 0 {
				var key string
				select {
				case key = <-queue:
				default:
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := idempotency.Do(ctx, r, netRequest(key), w.fn(w.keys[key]))
				cancel()
				if err == nil {
					mu.Lock()
					longest = max(longest, time.Since(since))
					mu.Unlock()
					remaining.Add(-1)
					continue
				}
				if time.Since(since) > bound {
					t.Errorf("key %s: neither replayed nor claimable %v after the fault: %v", key, time.Since(since).Round(time.Millisecond), err)
					remaining.Add(-1)
					continue
				}
				queue <- key
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for _, key := range w.order {
		if n := w.keys[key].effects.Load(); n > 1 {
			duplicates += int(n) - 1
		}
	}
	return longest, duplicates
}

// Keys is how many keys the clients asked for.
func (w *foWorkload) Keys() int { return len(w.order) }
