// Command client is the crash trial's client process (see package
// crashtrial): it opens the queue in CRASHTRIAL_FILE, enqueues the items
// of CRASHTRIAL_ITEMS (JSON) for CRASHTRIAL_URL while it submits, says
// what it does on stdout, holding at SEND and DONE for a line on stdin,
// and exits once every item is enqueued and none is pending. The trial
// builds it without the race detector, whose start-up (about two seconds
// on a loaded machine) would dominate a trial of many restarts.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency/queue"
	"github.com/exactlyonce/idempotency/queue/internal/crashtrial"
)

func main() { os.Exit(run()) }

// run is the client; it returns the exit status.
func run() int {
	var items []crashtrial.Item
	if err := json.Unmarshal([]byte(os.Getenv("CRASHTRIAL_ITEMS")), &items); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var outMu sync.Mutex
	t0 := time.Now()
	debug := os.Getenv("CRASHTRIAL_DEBUG") != ""
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Printf(format+"\n", args...)
		if debug {
			fmt.Fprintf(os.Stderr, "%v "+format+"\n", append([]any{time.Since(t0).Round(time.Millisecond)}, args...)...)
		}
		outMu.Unlock()
	}
	gos := make(chan struct{}, 64)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			gos <- struct{}{}
		}
	}()
	hold := func() { <-gos }
	unsafeNewKey := os.Getenv("CRASHTRIAL_UNSAFE_NEW_KEY") == "1"
	q, err := queue.Open(os.Getenv("CRASHTRIAL_FILE"),
		queue.WithBackoff(2*time.Millisecond, 20*time.Millisecond),
		queue.WithConcurrency(2),
		queue.WithAttemptTimeout(5*time.Second),
		queue.WithPrepare(func(req *http.Request) error {
			say("SEND %s", req.Header.Get("Idempotency-Key"))
			hold()
			if unsafeNewKey {
				// The control's broken client: a key per attempt.
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64()))
			}
			return nil
		}),
		queue.WithOnDone(func(ctx context.Context, it *queue.Item) error {
			say("DONE %s %d %v", it.Key, it.Response.Status, it.Response.Replayed)
			hold()
			return nil
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer q.Close()
	var enqueued atomic.Bool
	go func() {
		for _, it := range items {
			body, _ := json.Marshal(it)
			req, _ := http.NewRequest("POST", os.Getenv("CRASHTRIAL_URL"), strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			say("START %d", it.Index)
			key, err := q.Enqueue(req, queue.InOrder(it.Order))
			if err != nil {
				fmt.Fprintln(os.Stderr, "Enqueue:", err)
				os.Exit(2)
			}
			say("ENQ %d %s", it.Index, key)
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		}
		enqueued.Store(true)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			time.Sleep(2 * time.Millisecond)
			if !enqueued.Load() {
				continue
			}
			if p, d, err := q.Len(); err == nil && p == 0 && d == 0 {
				cancel()
				return
			}
		}
	}()
	q.Run(ctx)
	say("IDLE")
	return 0
}
