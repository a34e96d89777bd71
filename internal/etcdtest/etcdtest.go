// Package etcdtest runs etcd 3.6 servers in the test process, through
// go.etcd.io/etcd/server/v3/embed, for the store/etcd tests that need a
// 3.6 server or a cluster whose members they stop and start; and, with
// [StartProcess], one member in a process of its own, for tests that load
// the server with thousands of requests at once.
//
// It is a module of its own, never published: the server's dependency
// tree (bbolt, raft, grpc-gateway, OpenTelemetry...) stays out of
// store/etcd's go.mod. Its tests run the conformance suite on a 3.6
// member and the leader-loss test on three; lincheck imports it to check
// the store on 3.6 too.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Timing of the members' elections.
type Timing struct {
	// TickMs and ElectionMs are etcd's --heartbeat-interval and
	// --election-timeout. Zero means Fast.
	TickMs, ElectionMs uint
}

var (
	// Fast elections: a 50ms heartbeat and a 500ms election timeout, so
	// the minimum lease TTL (1.5 election timeouts, rounded up to whole
	// seconds) is 1s and a lost leader is replaced within about a second.
	Fast = Timing{TickMs: 50, ElectionMs: 500}
	// Default is etcd's own: 100ms and 1s, a minimum lease TTL of 2s.
	Default = Timing{TickMs: 100, ElectionMs: 1000}
)

// A Cluster is a set of embedded members on loopback.
type Cluster struct {
	tb      testing.TB
	timing  Timing
	members []*Member
	initial string
	token   string // the cluster's --initial-cluster-token
	// configure, when set, changes each member's configuration before it
	// starts (see [StartWith]).
	configure func(*embed.Config)
}

// A Member is one embedded server of a Cluster.
type Member struct {
	Name               string
	ClientURL, PeerURL url.URL
	dir                string
	mu                 sync.Mutex
	etcd               *embed.Etcd // nil while stopped
}

// Start starts n members with timing t and waits until they have a
// leader; they stop at the end of the test.
func Start(tb testing.TB, n int, t Timing) *Cluster {
	tb.Helper()
	return StartWith(tb, n, t, nil)
}

// StartWith is [Start] with configure applied to each member's
// configuration before it starts (and restarts): for a server's limits,
// such as --max-txn-ops (MaxTxnOps) or --max-request-bytes
// (MaxRequestBytes).
func StartWith(tb testing.TB, n int, t Timing, configure func(*embed.Config)) *Cluster {
	tb.Helper()
	if t.TickMs == 0 {
		t = Fast
	}
	c := &Cluster{tb: tb, timing: t, token: "idem-" + tb.TempDir(), configure: configure}
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: freeURL(tb),
			PeerURL:   freeURL(tb),
			dir:       tb.TempDir(),
		}
		c.members = append(c.members, m)
		initial = append(initial, m.Name+"="+m.PeerURL.String())
	}
	c.initial = strings.Join(initial, ",")
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, m := range c.members {
		wg.Go(func() { errs[i] = c.start(m, "new") })
	}
	wg.Wait()
	tb.Cleanup(func() {
		for _, m := range c.members {
			c.Stop(m)
		}
	})
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return c
}

// freeURL is an http URL on a loopback port that was free a moment ago.
func freeURL(tb testing.TB) url.URL {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

// Config is the configuration of a member named name with its data in
// dir, serving clients at clientURL and peers at peerURL, with timing t,
// logging nothing. It is the first member of a new cluster of its own;
// Cluster sets the cluster's members, state and token on top.
func Config(name, dir string, clientURL, peerURL url.URL, t Timing) *embed.Config {
	if t.TickMs == 0 {
		t = Fast
	}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.TickMs, cfg.ElectionMs = t.TickMs, t.ElectionMs
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = name + "=" + peerURL.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	return cfg
}

func (c *Cluster) start(m *Member, state string) error {
	cfg := Config(m.Name, m.dir, m.ClientURL, m.PeerURL, c.timing)
	cfg.InitialCluster = c.initial
	cfg.ClusterState = state
	cfg.InitialClusterToken = c.token
	if c.configure != nil {
		c.configure(cfg)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("starting embedded etcd %s: %w", m.Name, err)
	}
	if len(c.members) == 1 {
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(30 * time.Second):
			e.Close()
			return fmt.Errorf("embedded etcd %s not ready after 30s", m.Name)
		}
	}
	m.mu.Lock()
	m.etcd = e
	m.mu.Unlock()
	return nil
}

// Endpoints are the members' client addresses.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.ClientURL.Host)
	}
	return eps
}

// Members are the cluster's members.
func (c *Cluster) Members() []*Member { return c.members }

// Client returns a client of every member, closed at the end of the test.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return client(tb, c.Endpoints())
}

// client returns a client of endpoints, closed at the end of the test.
func client(tb testing.TB, endpoints []string) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leader returns the member that leads, or nil when none does (as the
// running members see it).
func (c *Cluster) Leader() *Member {
	for _, m := range c.members {
		m.mu.Lock()
		e := m.etcd
		m.mu.Unlock()
		if e == nil {
			continue
		}
		if l := e.Server.Leader(); l != 0 && uint64(e.Server.MemberID()) == uint64(l) {
			return m
		}
	}
	return nil
}

// WaitLeader waits until a running member leads, and returns it.
func (c *Cluster) WaitLeader(limit time.Duration) (*Member, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l != nil {
			return l, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Errorf("no etcd leader after %v", limit)
}

// Stop stops m (it keeps its data); stopping a stopped member does nothing.
func (c *Cluster) Stop(m *Member) {
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts the stopped member m again from its data.
func (c *Cluster) Restart(m *Member) error {
	return c.start(m, "existing")
}

// Ping checks that the cluster answers a linearizable read within limit.
func Ping(cli *clientv3.Client, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	_, err := cli.Get(ctx, "etcdtest-ping")
	return err
}
