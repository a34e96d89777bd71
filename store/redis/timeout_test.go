package redis_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/internal/nettest"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// closedPort is the shared address where nothing listens.
var closedPort = nettest.ClosedPort

// blackHole is a TCP server that accepts connections, reads what it is
// sent and never answers: a server that hangs, or a network that loses
// every reply.
type blackHole struct {
	ln   net.Listener
	open atomic.Int64 // connections the client has not closed
	wg   sync.WaitGroup
}

func newBlackHole(t *testing.T) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	b.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			b.open.Add(1)
			b.wg.Go(func() {
				_, _ = io.Copy(io.Discard, c) // until the client closes it
				b.open.Add(-1)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackHole) Addr() string { return b.ln.Addr().String() }

// scriptingClient is a go-redis client the test closes.
type scriptingClient interface {
	idemredis.Client
	Close() error
}

// clientKinds are the go-redis clients, each with go-redis's default
// options but the address, that a store must bound by the caller's
// deadline. The cluster client is given its slot map (one node, at addr)
// instead of asking a node for it, so that it reaches addr for the
// script itself; cluster clients that must load the map first are in
// TestClusterNeverReached.
var clientKinds = []struct {
	name string
	new  func(addr string) scriptingClient
}{
	{"single", func(addr string) scriptingClient {
		return goredis.NewClient(&goredis.Options{Addr: addr})
	}},
	{"single_split_timeouts", func(addr string) scriptingClient { // no clone: the worker hand-off
		return goredis.NewClient(&goredis.Options{Addr: addr, ReadTimeout: 3 * time.Second, WriteTimeout: 2 * time.Second})
	}},
	{"single_context_timeout", func(addr string) scriptingClient {
		return goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}},
	{"cluster", func(addr string) scriptingClient {
		return goredis.NewClusterClient(&goredis.ClusterOptions{ClusterSlots: oneNode(addr)})
	}},
	{"ring", func(addr string) scriptingClient {
		return goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addr}})
	}},
}

// oneNode is a cluster slot map with every slot on addr.
func oneNode(addr string) func(context.Context) ([]goredis.ClusterSlot, error) {
	return func(context.Context) ([]goredis.ClusterSlot, error) {
		return []goredis.ClusterSlot{{Start: 0, End: 16383, Nodes: []goredis.ClusterNode{{Addr: addr}}}}, nil
	}
}

// doOnce runs one Do on client with opts, checks that it failed with a
// *StoreError without running fn, and returns how long it took and the
// error.
func doOnce(t *testing.T, client idemredis.Client, opts ...idempotency.Option) (time.Duration, error) {
	t.Helper()
	r, err := idempotency.New(newStore(t, client, nil), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	start := time.Now()
	_, err = idempotency.Do(context.Background(), r, idempotency.Request{Scope: []string{"tenant"}, Key: "k"}, func(context.Context) (int, error) {
		ran = true
		return 1, nil
	})
	took := time.Since(start)
	var se *idempotency.StoreError
	if !errors.As(err, &se) || se.Ran || ran {
		t.Fatalf("Do: %v (fn ran: %v); want a *StoreError, fn not run", err, ran)
	}
	return took, err
}

// TestBlackHole: a server that accepts connections and never answers fails
// Do with a *StoreError within 2s when WithStoreTimeout is 500ms (3
// attempts of 500ms), whatever the client's options: go-redis by default
// ignores deadlines in socket I/O and retries a read timeout of 5s three
// times, which took 15s.
func TestBlackHole(t *testing.T) {
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			c := k.new(newBlackHole(t).Addr())
			defer c.Close()
			took, err := doOnce(t, c, idempotency.WithStoreTimeout(500*time.Millisecond))
			t.Logf("black hole, WithStoreTimeout(500ms): %v: %v", took.Round(time.Millisecond), err)
			if took > 2*time.Second {
				t.Errorf("Do took %v, want at most 2s", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Do: %v, want an error matching context.DeadlineExceeded", err)
			}
		})
	}
}

// TestBlackHoleDefaults: with no option at all, a black-holed server
// fails Do well before 30s (the core's default store timeout bounds each
// attempt).
func TestBlackHoleDefaults(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: newBlackHole(t).Addr()})
	defer c.Close()
	took, err := doOnce(t, c)
	t.Logf("black hole, no options: %v: %v", took.Round(time.Millisecond), err)
	if took > 15*time.Second {
		t.Errorf("Do took %v, want well under 30s", took)
	}
}

// TestClosedPort: a server that is not there (connection refused) fails
// Do within 1s, with or without a store timeout, and the error is the
// dial's: go-redis by default dials 5 times, 100ms apart, for each of its
// 4 attempts, which took 5.2s over the core's 3 attempts.
func TestClosedPort(t *testing.T) {
	for _, k := range clientKinds {
		for _, opts := range [][]idempotency.Option{nil, {idempotency.WithStoreTimeout(500 * time.Millisecond)}} {
			name := k.name
			if opts != nil {
				name += "_store_timeout"
			}
			t.Run(name, func(t *testing.T) {
				c := k.new(closedPort(t))
				defer c.Close()
				took, err := doOnce(t, c, opts...)
				t.Logf("closed port: %v: %v", took.Round(time.Millisecond), err)
				if took > time.Second {
					t.Errorf("Do took %v, want at most 1s", took)
				}
				var op *net.OpError
				if k.name != "ring" && !errors.As(err, &op) { // a ring may first mark its shard down
					t.Errorf("Do: %v, want an error wrapping the dial's *net.OpError", err)
				}
			})
		}
	}
}

// TestServerGoesDown: a server that worked and stops (its connections cut,
// its port closed) fails the next Do within 1s, on a single server and on
// a cluster whose slot map the client has.
func TestServerGoesDown(t *testing.T) {
	for _, k := range clientKinds {
		if k.name == "ring" {
			continue // a ring marks a shard down by its own health checks
		}
		t.Run(k.name, func(t *testing.T) {
			p := newProxy(t, singleAddr(t))
			c := k.new(p.Addr())
			defer c.Close()
			r, err := idempotency.New(newStore(t, c, nil))
			if err != nil {
				t.Fatal(err)
			}
			fn := func(context.Context) (int, error) { return 1, nil }
			if _, err := idempotency.Do(context.Background(), r, idempotency.Request{Key: "before"}, fn); err != nil {
				t.Fatalf("Do while the server is up: %v", err)
			}
			p.Close()
			took, err := doOnce(t, c)
			t.Logf("server gone: %v: %v", took.Round(time.Millisecond), err)
			if took > time.Second {
				t.Errorf("Do took %v, want at most 1s", took)
			}
		})
	}
}

// TestClusterNeverReached: a cluster client that has never loaded its
// slot map must dial a seed for it, and go-redis dials each seed 5 times,
// 100ms apart, before trying the next: the store cannot end that early
// without giving up on seeds that would answer, so a closed port costs
// 0.4s per attempt. It stays well within the store timeout.
func TestClusterNeverReached(t *testing.T) {
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{closedPort(t)}})
	defer c.Close()
	took, err := doOnce(t, c)
	t.Logf("cluster, closed seed: %v: %v", took.Round(time.Millisecond), err)
	if took > 3*time.Second {
		t.Errorf("Do took %v, want under 3s", took)
	}
	c = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{newBlackHole(t).Addr()}})
	defer c.Close()
	took, err = doOnce(t, c, idempotency.WithStoreTimeout(500*time.Millisecond))
	t.Logf("cluster, black-holed seed, WithStoreTimeout(500ms): %v: %v", took.Round(time.Millisecond), err)
	if took > 2*time.Second {
		t.Errorf("Do took %v, want at most 2s", took)
	}
}

// TestStoreCallEndsWithContext: every store operation returns the
// context's error soon after the context ends, whether it has a deadline
// or is canceled, on a client that ignores deadlines in socket I/O and on
// one that honours them.
func TestStoreCallEndsWithContext(t *testing.T) {
	for _, k := range clientKinds[:2] {
		t.Run(k.name, func(t *testing.T) {
			c := k.new(newBlackHole(t).Addr())
			defer c.Close()
			s := newStore(t, c, nil)
			ops := map[string]func(context.Context) error{
				"claim": func(ctx context.Context) error {
					_, err := s.Claim(ctx, claimReq("3:abc", "a", time.Minute))
					return err
				},
				"renew":      func(ctx context.Context) error { return s.Renew(ctx, "3:abc", "a", time.Minute) },
				"checkpoint": func(ctx context.Context) error { return s.Checkpoint(ctx, "3:abc", "a", "n", []byte("v")) },
				"complete":   func(ctx context.Context) error { return s.Complete(ctx, "3:abc", "a", []byte("r"), time.Minute) },
				"release":    func(ctx context.Context) error { return s.Release(ctx, "3:abc", "a") },
			}
			for name, op := range ops {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				start := time.Now()
				err := op(ctx)
				took := time.Since(start)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
					t.Errorf("%s under a 200ms deadline: %v after %v; want context.DeadlineExceeded within 1s", name, err, took)
				}
				ctx, cancel = context.WithCancel(context.Background())
				time.AfterFunc(200*time.Millisecond, cancel)
				start = time.Now()
				err = op(ctx)
				took = time.Since(start)
				if !errors.Is(err, context.Canceled) || took > time.Second {
					t.Errorf("%s canceled after 200ms: %v after %v; want context.Canceled within 1s", name, err, took)
				}
			}
		})
	}
}

// TestAbandonedCallsEnd: the go-redis calls a store stops waiting for end
// with go-redis's own read timeout, and close their connections: nothing
// is left behind.
func TestAbandonedCallsEnd(t *testing.T) {
	bh := newBlackHole(t)
	c := goredis.NewClient(&goredis.Options{Addr: bh.Addr(), ReadTimeout: 300 * time.Millisecond})
	defer c.Close()
	doOnce(t, c, idempotency.WithStoreTimeout(100*time.Millisecond))
	deadline := time.Now().Add(5 * time.Second)
	for bh.open.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := bh.open.Load(); n > 0 {
		t.Fatalf("%d connections still open 5s after Do returned", n)
	}
	if st := c.PoolStats(); st.TotalConns != 0 {
		t.Fatalf("pool holds %d connections, want 0: %+v", st.TotalConns, st)
	}
}
