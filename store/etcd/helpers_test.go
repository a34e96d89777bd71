package etcd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

const howTo = "run scripts/test.sh, or start a server with `eval $(scripts/servers/etcd.sh start DIR)`"

// endpoints returns the etcd server's endpoints from IDEM_ETCD_ENDPOINTS.
func endpoints(tb testing.TB) []string {
	tb.Helper()
	v := os.Getenv("IDEM_ETCD_ENDPOINTS")
	if v == "" {
		tb.Fatalf("IDEM_ETCD_ENDPOINTS is not set: %s", howTo)
	}
	return strings.Split(v, ",")
}

// newClient returns a client of the test server, closed at the end of the
// test, failing the test when the server does not answer.
func newClient(tb testing.TB) *clientv3.Client {
	tb.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints(tb), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "health-check"); err != nil {
		tb.Fatalf("etcd at %v unreachable (%v): %s", endpoints(tb), err, howTo)
	}
	return c
}

// interceptedClient returns a client of the test server whose unary
// calls go through intercept, closed at the end of the test.
func interceptedClient(t *testing.T, intercept grpc.UnaryClientInterceptor) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints(t), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// uniquePrefix keeps the records of each test apart.
func uniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest/" + hex.EncodeToString(b[:]) + "/"
}

// newStore returns a store on client with a fresh prefix.
func newStore(tb testing.TB, client idemetcd.Client, opts *idemetcd.Options) *idemetcd.Store {
	tb.Helper()
	var o idemetcd.Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = uniquePrefix()
	}
	s, err := idemetcd.New(client, &o)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return s
}

// TestMain refuses to run without the server's address: a client given no
// endpoint would dial localhost:2379, which may be another program's etcd.
func TestMain(m *testing.M) {
	if os.Getenv("IDEM_ETCD_ENDPOINTS") == "" {
		fmt.Fprintln(os.Stderr, "store/etcd tests need IDEM_ETCD_ENDPOINTS: "+howTo)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
