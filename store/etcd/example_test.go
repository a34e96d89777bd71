package etcd_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A payment handler de-duplicated through etcd: the second call with the
// same key replays the first call's result instead of charging again.
func ExampleNew() {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(os.Getenv("IDEM_ETCD_ENDPOINTS"), ","),
		DialTimeout: 5 * time.Second,
		// The client logs a warning to stderr for every retry while etcd
		// is unreachable: silence it, or give it your logger at
		// zap.ErrorLevel. The store's errors say what failed.
		Logger: zap.NewNop(),
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	store, err := idemetcd.New(client, &idemetcd.Options{Prefix: "example/" + uniquePrefix()})
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store) // asks etcd its minimum lease TTL once
	if err != nil {
		panic(err)
	}

	charges := 0
	charge := func(ctx context.Context) (string, error) {
		charges++
		return "pay_123", nil
	}
	req := idempotency.Request{Scope: []string{"tenant-42"}, Key: "order-7", Fingerprint: idempotency.FingerprintParts("POST", "/pay", "1000")}
	for range 2 {
		res, err := idempotency.Do(context.Background(), runner, req, charge)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Value, "replayed:", res.Replayed)
	}
	fmt.Println("charges:", charges)
	// Output:
	// pay_123 replayed: false
	// pay_123 replayed: true
	// charges: 1
}

// A store on a namespaced client: every key lives under "billing/", then
// the store's prefix. Duplicates that wait (WithWait) are woken by an etcd
// watch on the record.
func ExampleNamespace() {
	client, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv("IDEM_ETCD_ENDPOINTS"), ","), Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	store, err := idemetcd.New(idemetcd.Namespace(client, "billing/"), &idemetcd.Options{Prefix: uniquePrefix()})
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store, idempotency.WithWait(10*time.Second))
	if err != nil {
		panic(err)
	}
	res, err := idempotency.Do(context.Background(), runner, idempotency.Request{Key: "job-1"}, func(ctx context.Context) (int, error) {
		return 42, nil
	})
	fmt.Println(res.Value, err)
	// Output: 42 <nil>
}
