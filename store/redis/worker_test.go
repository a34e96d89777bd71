package redis

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWorkers: spawn runs every task exactly once, from many goroutines
// at once; a caller that spawns one task after another reuses an idle
// worker instead of starting a goroutine each time; and idle workers end,
// leaving no goroutine behind.
func TestWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	const callers, tasks = 32, 50
	var ran [callers * tasks]atomic.Int32
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range tasks {
				done := make(chan struct{})
				spawn(func() {
					ran[g*tasks+i].Add(1)
					close(done)
				})
				<-done
			}
		})
	}
	wg.Wait()
	for i := range ran {
		if n := ran[i].Load(); n != 1 {
			t.Fatalf("task %d ran %d times", i, n)
		}
	}

	// One caller, a pause between tasks as between requests: one worker
	// (or a few, when a task's end races the next spawn) serves them all.
	started := workersStarted.Load()
	for range 100 {
		done := make(chan struct{})
		spawn(func() { close(done) })
		<-done
		time.Sleep(time.Millisecond)
	}
	if n := workersStarted.Load() - started; n > 10 {
		t.Errorf("100 tasks one after another started %d goroutines, want a worker reused", n)
	}

	deadline := time.Now().Add(workerIdle + 5*time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Errorf("%d goroutines %v after the last task, %d before", n, workerIdle+5*time.Second, base)
	}
}
