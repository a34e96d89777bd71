// Command etcd36 runs one etcd 3.6 member, configured as etcdtest.Config
// does, until it is stopped (SIGTERM or SIGINT). It prints "ready" once it
// serves. etcdtest.StartProcess builds it without the race detector and
// runs it beside a test, so that the server is not slowed by the test
// binary's instrumentation nor shares its scheduler.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/exactlyonce/idempotency/internal/etcdtest"
	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	name := flag.String("name", "m0", "member name")
	dir := flag.String("data-dir", "", "data directory (required)")
	clientURL := flag.String("client-url", "", "URL to serve clients at (required)")
	peerURL := flag.String("peer-url", "", "URL to serve peers at (required)")
	tick := flag.Uint("tick-ms", etcdtest.Fast.TickMs, "heartbeat interval in ms")
	election := flag.Uint("election-ms", etcdtest.Fast.ElectionMs, "election timeout in ms")
	flag.Parse()
	if *dir == "" || *clientURL == "" || *peerURL == "" {
		log.Fatal("etcd36: -data-dir, -client-url and -peer-url are required")
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatalf("etcd36: -client-url: %v", err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatalf("etcd36: -peer-url: %v", err)
	}
	e, err := embed.StartEtcd(etcdtest.Config(*name, *dir, *cu, *pu, etcdtest.Timing{TickMs: *tick, ElectionMs: *election}))
	if err != nil {
		log.Fatalf("etcd36: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		log.Fatal("etcd36: not ready after a minute")
	}
	fmt.Println("ready")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		e.Close()
	case err := <-e.Err():
		log.Fatalf("etcd36: %v", err)
	}
}
