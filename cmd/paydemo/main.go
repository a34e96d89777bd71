// Command paydemo plays a payments scenario over HTTP and checks that every
// payment intent was charged exactly once.
//
// A payments API (POST /payments) runs behind the httpidem middleware on
// the in-memory store. Clients send through httpidem.Transport, which
// retries with the intent's key, over a flaky link that drops responses
// after the server has processed the request and sends some requests
// twice. The scenarios: double clicks, client timeouts followed by
// retries, 50 concurrent duplicates, a key reused with a different
// amount, a worker that crashes mid-payment (after charging the card) and
// is taken over once its lease ends, and a batch of ordinary payments
// over the flaky link.
//
// It prints one row per intent (attempts seen by the server, charges,
// replays, 409s, 422s) and exits with status 1 if any intent was charged
// other than once or a client saw an unexpected answer.
//
//	go run ./cmd/paydemo [-seed N] [-v]
//
// The same scenario runs on PostgreSQL or Redis with the examples
// module's command, which may import their drivers:
//
//	go run ./examples/cmd/paydemo -postgres URL
//	go run ./examples/cmd/paydemo -redis ADDR
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/exactlyonce/idempotency/internal/paydemo"
	"github.com/exactlyonce/idempotency/store/memory"
)

func main() {
	var cfg paydemo.Config
	cfg.RegisterFlags(flag.CommandLine)
	flag.Parse()
	log.SetFlags(0)
	start := time.Now()
	// The demo finishes in seconds; if it hangs, that is a failure too.
	time.AfterFunc(time.Minute, func() {
		fmt.Fprintln(os.Stderr, "FAIL: the demo did not finish within a minute")
		os.Exit(1)
	})
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	ok, err := paydemo.Run(store, cfg, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nfinished in %v\n", time.Since(start).Round(10*time.Millisecond))
	if !ok {
		fmt.Println("FAIL: some intent was not charged exactly once, or a client got an unexpected answer")
		os.Exit(1)
	}
	fmt.Println("ok: every intent charged exactly once")
}
