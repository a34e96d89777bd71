package benchmarks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkEtcdFloor compares Do on the etcd store with a raw floor on the
// same server and the same client: the same number of plain etcd
// transactions, each the least a hand-written check could do,
//
//	If(CreateRevision(k) = 0) Then(Put(k, the 200-byte JSON result)) Else(Get(k))
//
// two per fresh Do (a claim and a completion), one per replay. Chunks of
// Do, of the floor and of the JSON floor (the floor plus encoding the
// result before a fresh call, decoding the value read after a replay: see
// bench.FloorOps) alternate, from 1 and from 16 goroutines, so all see the
// same load. ns/op is Do's; raw-ns/op the floor's, json-ns/op the JSON
// floor's; ratio is raw-ns/op ÷ ns/op (1 means Do costs no more than the
// plain transactions; the target is 0.9), json-ratio json-ns/op ÷ ns/op;
// roundtrips/op counts Do's unary calls (transactions, lease grants,
// TimeToLive).
//
//	go test -run '^$' -bench EtcdFloor -benchtime 2000x ./benchmarks/
func BenchmarkEtcdFloor(b *testing.B) {
	eps := bench.Server(b, bench.Etcd)
	for _, op := range []string{"fresh", "replay"} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("op=%s/callers=%d", op, callers), func(b *testing.B) {
				etcdFloor(b, strings.Split(eps, ","), op, callers)
			})
		}
	}
}

func etcdFloor(b *testing.B, endpoints []string, op string, callers int) {
	var trips atomic.Int64
	c, err := bench.EtcdClient(endpoints, &trips)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prefix := "idem-floor-" + bench.RandomHex(6) + "/"
	defer c.Delete(context.Background(), prefix, clientv3.WithPrefix())
	s, err := idemetcd.New(c, &idemetcd.Options{Prefix: prefix + "store/"})
	if err != nil {
		b.Fatal(err)
	}
	r, err := idempotency.New(s, idempotency.WithRetention(10*time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	value, err := json.Marshal(bench.Result)
	if err != nil {
		b.Fatal(err)
	}
	fn := func(context.Context) (bench.Payment, error) { return bench.Result, nil }
	// raw runs the floor's transaction on key and returns the value it
	// found (none when it put one).
	raw := func(key string) ([]byte, error) {
		k := prefix + "raw/" + key
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(value))).Else(clientv3.OpGet(k)).Commit()
		if err != nil || resp.Succeeded {
			return nil, err
		}
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			return kvs[0].Value, nil
		}
		return nil, fmt.Errorf("raw replay of %s found no value", key)
	}
	do := func(key string) error {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: key}, fn)
		if err == nil && res.Replayed != (op == "replay") {
			err = fmt.Errorf("Do of %s: replayed %v in the %s workload", key, res.Replayed, op)
		}
		return err
	}
	// Replays read one completed key per goroutine; warm-up grants the
	// leases the measured calls share and opens the connection.
	for g := range callers {
		if err := do(fmt.Sprintf("warm-%d", g)); err != nil && op == "fresh" {
			b.Fatal(err)
		}
		if op == "replay" {
			if _, err := idempotency.Do(ctx, r, idempotency.Request{Scope: []string{"bench"}, Key: bench.HotKey(g)}, fn); err != nil {
				b.Fatal(err)
			}
			if _, err := raw(bench.HotKey(g)); err != nil {
				b.Fatal(err)
			}
		}
	}
	rawFresh := func(key string) error {
		if _, err := raw(key + "-claim"); err != nil {
			return err
		}
		_, err := raw(key + "-complete")
		return err
	}
	bench.FloorOps(b, op, callers, &trips, do, bench.FloorCalls{Fresh: rawFresh, Replay: raw})
}
