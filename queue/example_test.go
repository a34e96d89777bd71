package queue_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/queue"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A point-of-sale client records three sales while the network is down,
// is restarted, and sends them when the server is back: each sale is
// charged once, in order, and its answer reaches the client.
func Example_offline() {
	dir, _ := os.MkdirTemp("", "queue-example")
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "sales.queue")

	// The server's address, where nothing listens yet: the client is
	// offline.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()

	// Offline: the sales are stored, each with its key, on disk.
	q, err := queue.Open(file)
	if err != nil {
		panic(err)
	}
	for _, amount := range []int{1200, 350, 4999} {
		req, _ := http.NewRequest("POST", "http://"+addr+"/sales", strings.NewReader(fmt.Sprintf(`{"amount":%d}`, amount)))
		req.Header.Set("Content-Type", "application/json")
		if _, err := q.Enqueue(req); err != nil {
			panic(err)
		}
	}
	// Trying while offline: every attempt fails to connect, so nothing
	// can have reached a server, and the items wait.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	q.Run(ctx)
	cancel()
	q.Close() // the client is switched off

	// The server comes back.
	var charges atomic.Int64
	stop := serve(addr, &charges)
	defer stop()

	// The client starts again and sends what it stored.
	var answered atomic.Int64
	q, err = queue.Open(file, queue.WithBackoff(10*time.Millisecond, 100*time.Millisecond),
		queue.WithOnDone(func(ctx context.Context, it *queue.Item) error {
			fmt.Printf("%s %d %s\n", it.State, it.Response.Status, it.Response.Body)
			answered.Add(1)
			return nil // the item is removed
		}))
	if err != nil {
		panic(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		for answered.Load() < 3 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	q.Run(ctx)
	pending, _, _ := q.Len()
	q.Close()
	fmt.Println("charges:", charges.Load(), "pending:", pending)
	// Output:
	// done 201 {"sale":1,"amount":1200}
	// done 201 {"sale":2,"amount":350}
	// done 201 {"sale":3,"amount":4999}
	// charges: 3 pending: 0
}

// serve starts the sales service at addr: POST /sales behind the
// httpidem middleware, on the memory store.
func serve(addr string, charges *atomic.Int64) (stop func()) {
	store, _ := memory.New(nil)
	runner, _ := idempotency.New(store)
	idem, _ := httpidem.New(runner, httpidem.WithSharedKeySpace()) // one trusted client
	mux := http.NewServeMux()
	mux.Handle("POST /sales", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var amount int
		fmt.Sscanf(readAll(r), `{"amount":%d}`, &amount)
		n := charges.Add(1) // the effect
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"sale":%d,"amount":%d}`, n, amount)
	})))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	return func() { srv.Close() }
}

func readAll(r *http.Request) string {
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}
