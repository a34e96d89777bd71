package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

const howTo = "run scripts/test.sh, or start servers with `eval $(scripts/servers/redis.sh start DIR)`"

// singleAddr returns the address of the single Redis server, failing the
// test when it is not configured or not reachable.
func singleAddr(tb testing.TB) string {
	tb.Helper()
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		tb.Fatalf("IDEM_REDIS_ADDR is not set: %s", howTo)
	}
	return addr
}

// clusterAddrs returns the seed addresses of the Redis Cluster.
func clusterAddrs(tb testing.TB) []string {
	tb.Helper()
	addrs := os.Getenv("IDEM_REDIS_CLUSTER_ADDRS")
	if addrs == "" {
		tb.Fatalf("IDEM_REDIS_CLUSTER_ADDRS is not set: %s", howTo)
	}
	return strings.Split(addrs, ",")
}

// poolTimeout is how long the test clients' callers may queue for a
// connection. The conformance suite's bursts start thousands of claims at
// once (8 on each of 1,000 keys) on a pool of 10 connections per node and
// core; go-redis's default wait, ReadTimeout+1s = 4s, is less than a
// loaded machine running -race takes to serve the queue, and the claims
// at its end failed with "connection pool timeout" (in 3 of 5 runs on one
// core shared with four busy loops). The wait bounds nothing the tests
// check: the servers they time out are behind their own clients.
const poolTimeout = time.Minute

// newSingle returns a client of the single server, closed at the end of
// the test.
func newSingle(tb testing.TB) *goredis.Client {
	tb.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: singleAddr(tb), PoolTimeout: poolTimeout})
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("redis at %s unreachable (%v): %s", singleAddr(tb), err, howTo)
	}
	return c
}

// newCluster returns a client of the cluster, closed at the end of the test.
func newCluster(tb testing.TB) *goredis.ClusterClient {
	tb.Helper()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: clusterAddrs(tb), PoolTimeout: poolTimeout})
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.ForEachShard(ctx, func(ctx context.Context, n *goredis.Client) error {
		return n.Ping(ctx).Err()
	})
	if err != nil {
		tb.Fatalf("redis cluster at %v unreachable (%v): %s", clusterAddrs(tb), err, howTo)
	}
	return c
}

// onlineReplicas returns the addresses of the replicas connected to the
// single server and online (INFO replication), the ones WAIT can count.
// The servers scripts/servers/redis.sh starts have one; a server of one's
// own may have none, and the tests that wait for replicas then check that
// waiting fails instead.
func onlineReplicas(tb testing.TB, c *goredis.Client) []string {
	tb.Helper()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var addrs []string
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if _, err := strconv.Atoi(strings.TrimPrefix(name, "slave")); !ok || !strings.HasPrefix(name, "slave") || err != nil {
			continue // not a "slave<N>:ip=...,port=...,state=..." line
		}
		var ip, port, state string
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			case "state":
				state = v
			}
		}
		if state == "online" {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}
	return addrs
}

// uniquePrefix keeps the records of each test apart.
func uniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// newStore returns a store on client with a fresh prefix.
func newStore(tb testing.TB, client idemredis.Client, opts *idemredis.Options) *idemredis.Store {
	tb.Helper()
	var o idemredis.Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = uniquePrefix()
	}
	s, err := idemredis.New(client, &o)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return s
}

// clusterAddrsForExample reads the cluster's addresses for the examples,
// which have no testing.TB to fail.
func clusterAddrsForExample() []string {
	return strings.Split(os.Getenv("IDEM_REDIS_CLUSTER_ADDRS"), ",")
}

// TestMain refuses to run without the servers' addresses: a go-redis
// client given an empty address would dial localhost:6379, which may be
// another program's Redis.
func TestMain(m *testing.M) {
	if os.Getenv("IDEM_REDIS_ADDR") == "" || os.Getenv("IDEM_REDIS_CLUSTER_ADDRS") == "" {
		fmt.Fprintln(os.Stderr, "store/redis tests need IDEM_REDIS_ADDR and IDEM_REDIS_CLUSTER_ADDRS: "+howTo)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// addHook adds h to the client s sends its commands through
// (Store.Client: on a default *redis.Client, a clone of the client given
// to New, which does not see hooks added to that client).
func addHook(tb testing.TB, s *idemredis.Store, h goredis.Hook) {
	tb.Helper()
	switch c := s.Client().(type) {
	case *goredis.Client:
		c.AddHook(h)
	case *goredis.ClusterClient:
		c.AddHook(h)
	case *goredis.Ring:
		c.AddHook(h)
	default:
		tb.Fatalf("cannot add a hook to a %T", c)
	}
}
