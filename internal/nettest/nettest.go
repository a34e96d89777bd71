// Package nettest gives the adapters' tests the two unreachable servers
// they all need: one that accepts connections and never answers, and an
// address where nothing listens.
package nettest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// BlackHole starts a TCP server on loopback that accepts connections,
// reads what it is sent and never answers (a database that hangs, or a
// network that loses every reply), and returns its address. It stops,
// closing every connection, when the test ends.
func BlackHole(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	tb.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// ClosedPort returns a loopback address where nothing listens.
func ClosedPort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
