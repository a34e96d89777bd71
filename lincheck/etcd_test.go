package lincheck

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEtcd checks the etcd store on the server at IDEM_ETCD_ENDPOINTS
// (Debian's etcd 3.4 in scripts/test.sh).
func TestEtcd(t *testing.T) {
	eps := os.Getenv("IDEM_ETCD_ENDPOINTS")
	if eps == "" {
		t.Fatal("IDEM_ETCD_ENDPOINTS is not set: run scripts/test.sh or set IDEM_ETCD_ENDPOINTS")
	}
	testEtcd(t, strings.Split(eps, ","), "IDEM_ETCD_ENDPOINTS")
}

// TestEtcd36 checks the etcd store on an embedded etcd 3.6 member.
func TestEtcd36(t *testing.T) {
	testEtcd(t, etcdtest.Start(t, 1, etcdtest.Fast).Endpoints(), "an embedded etcd 3.6")
}

// testEtcd checks a store on a client of endpoints under a prefix of its
// own, and deletes its keys at the end.
func testEtcd(t *testing.T, endpoints []string, what string) {
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.Get(ctx, "ping"); err != nil {
		t.Fatalf("etcd at %s unreachable: %v (run scripts/test.sh or set IDEM_ETCD_ENDPOINTS)", what, err)
	}
	prefix := "lincheck/" + randomHex(6) + "/"
	store, err := idemetcd.New(client, &idemetcd.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := client.Delete(context.Background(), prefix, clientv3.WithPrefix()); err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	}()
	checkStore(t, store, serverWorkload)
}
