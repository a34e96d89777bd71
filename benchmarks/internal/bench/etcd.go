package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// EtcdClient returns a client of endpoints that counts its round trips
// (every unary call: transactions, lease grants, TimeToLive) in trips.
func EtcdClient(endpoints []string, trips *atomic.Int64) (*clientv3.Client, error) {
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		trips.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	return clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)},
	})
}

func (b *Backend) openEtcd(ctx context.Context, endpoints []string) error {
	c, err := EtcdClient(endpoints, &b.trips)
	if err != nil {
		return fmt.Errorf("bench: etcd: %w", err)
	}
	b.closers = append(b.closers, c.Close)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Get(pctx, "ping"); err != nil {
		return fmt.Errorf("bench: etcd at %s unreachable: %w: %s", Var(Etcd), err, howTo(Etcd))
	}
	prefix := "idem-bench-" + RandomHex(6) + "/"
	s, err := idemetcd.New(c, &idemetcd.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	b.records = func(ctx context.Context) (map[string]int64, error) {
		// One holder key per record: keys ending in NUL "h".
		resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		var n int64
		for _, kv := range resp.Kvs {
			if strings.HasSuffix(string(kv.Key), "\x00h") {
				n++
			}
		}
		return map[string]int64{endpoints[0]: n}, nil
	}
	b.closers = append(b.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.Delete(ctx, prefix, clientv3.WithPrefix())
		return err
	})
	b.store, b.counted = s, true
	return nil
}
