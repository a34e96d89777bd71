package benchmarks_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkEtcdIndexCost isolates what the etcd store's index of STARTED
// records (which Stuck reads) costs a fresh request, in one run so that
// the machine's load falls on both sides alike: the two transactions of
// a fresh Do as the store sends them (a claim that creates the record on
// one lease and its live marker on another, and a completion that
// rewrites the record with a 200-byte result), with the index's
// operations (an empty entry put on the record's lease by the claim,
// deleted by the completion) against the same transactions without
// them, chunks of the two alternating. ns/op is with the index,
// noindex-ns/op without, ratio noindex ÷ index.
//
//	go test -run '^$' -bench EtcdIndexCost -count 5 -benchtime 3000x ./benchmarks/
func BenchmarkEtcdIndexCost(b *testing.B) {
	eps := bench.Server(b, bench.Etcd)
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("op=fresh/callers=%d", callers), func(b *testing.B) {
			var trips atomic.Int64
			c, err := bench.EtcdClient(strings.Split(eps, ","), &trips)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			prefix := "idem-index-" + bench.RandomHex(6) + "/"
			defer c.Delete(ctx, prefix, clientv3.WithPrefix())
			live, err := c.Grant(ctx, 600)
			if err != nil {
				b.Fatal(err)
			}
			life, err := c.Grant(ctx, 1200)
			if err != nil {
				b.Fatal(err)
			}
			keep, err := c.Grant(ctx, 1800)
			if err != nil {
				b.Fatal(err)
			}
			// Values of the sizes the store writes: a STARTED record of a
			// 64-byte storage key, its live marker, the COMPLETED record.
			started, result := strings.Repeat("s", 90), strings.Repeat("c", 290)
			fresh := func(tag string, index bool) func(g, i int) error {
				return func(_, i int) error {
					base := fmt.Sprintf("%s%s/tenant-427/order-%09d-%s\x00", prefix, tag, i, strings.Repeat("x", 32))
					entry := prefix + tag + "\x00s/" + base[len(prefix)+len(tag):len(base)-1]
					then := []clientv3.Op{
						clientv3.OpPut(base+"h", started, clientv3.WithLease(life.ID)),
						clientv3.OpPut(base+"l", "30000", clientv3.WithLease(live.ID)),
					}
					if index {
						then = append(then, clientv3.OpPut(entry, "", clientv3.WithLease(life.ID)))
					}
					if _, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(base+"h"), "=", 0)).
						Then(then...).Else(clientv3.OpGet(base+"h", clientv3.WithRange(base+"s"))).Commit(); err != nil {
						return err
					}
					done := []clientv3.Op{clientv3.OpPut(base+"h", result, clientv3.WithLease(keep.ID))}
					if index {
						done = append(done, clientv3.OpDelete(entry))
					}
					_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(base+"h"), ">", 0)).
						Then(done...).Else(clientv3.OpGet(base+"h", clientv3.WithRange(base+"s"))).Commit()
					return err
				}
			}
			bench.Compare(b, callers, &trips, "noindex", fresh("with", true), fresh("without", false))
		})
	}
}
