package redis_test

import (
	"context"
	"fmt"
	"os"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// A payment handler de-duplicated through Redis: the second call with the
// same key replays the first call's result instead of charging again.
func ExampleNew() {
	client := goredis.NewClient(&goredis.Options{Addr: os.Getenv("IDEM_REDIS_ADDR")})
	defer client.Close()

	store, err := idemredis.New(client, &idemredis.Options{Prefix: "example:" + uniquePrefix()})
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
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

// A store for Redis Cluster: the same code, a cluster client. Keys carry a
// hash tag derived from the storage key, so records spread over the
// masters.
func ExampleNew_cluster() {
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: clusterAddrsForExample()})
	defer client.Close()

	store, err := idemredis.New(client, &idemredis.Options{
		Prefix: "example:" + uniquePrefix(),
		Notify: true, // duplicates waiting with idempotency.WithWait are woken by SPUBLISH
	})
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	res, err := idempotency.Do(context.Background(), runner, idempotency.Request{Key: "job-1"}, func(ctx context.Context) (int, error) {
		return 42, nil
	})
	fmt.Println(res.Value, err)
	// Output: 42 <nil>
}
