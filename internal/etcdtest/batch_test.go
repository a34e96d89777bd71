package etcdtest_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// refusals counts the transactions a server refused, by the refusal.
type refusals struct {
	mu   sync.Mutex
	txns int
	by   map[string]int
}

func (r *refusals) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if strings.HasSuffix(method, "/Txn") {
		r.mu.Lock()
		r.txns++
		if err != nil {
			r.by[status.Convert(err).Message()]++
		}
		r.mu.Unlock()
	}
	return err
}

func (r *refusals) take() (int, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, by := r.txns, r.by
	r.txns, r.by = 0, map[string]int{}
	return n, by
}

// TestBatchLowLimits runs batches on a 3.6 member whose limits are below
// etcd's defaults (--max-txn-ops 16, --max-request-bytes 64 KiB), which the
// store is not told of: every item of a batch of 100 claims, and of
// completions of 24 KiB results, is applied. The transactions the server
// refuses (before applying anything of them) are split in two; the store
// keeps half of what was refused as its limit, so the next batches are
// sent without a refusal.
func TestBatchLowLimits(t *testing.T) {
	c := etcdtest.StartWith(t, 1, etcdtest.Fast, func(cfg *embed.Config) {
		cfg.MaxTxnOps = 16
		cfg.MaxRequestBytes = 64 << 10
	})
	r := &refusals{by: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(r.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s, err := idemetcd.New(cli, &idemetcd.Options{MaxValueSize: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	claims := func(tag string) []idempotency.ClaimRequest {
		reqs := make([]idempotency.ClaimRequest, 100)
		for i := range reqs {
			key := fmt.Sprintf("%s-%03d", tag, i)
			reqs[i] = idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: idempotency.Token("t-" + key), Lease: time.Minute, Grace: time.Minute}
		}
		return reqs
	}
	claimAll := func(reqs []idempotency.ClaimRequest, want idempotency.Outcome) []idempotency.ClaimResult {
		t.Helper()
		res, errs := s.ClaimBatch(ctx, reqs)
		for i := range reqs {
			if errs[i] != nil || res[i].Outcome != want {
				t.Fatalf("item %d: %+v, %v; want %v", i, res[i], errs[i], want)
			}
		}
		return res
	}

	reqs := claims("a")
	claimAll(reqs, idempotency.OutcomeAcquired)
	n, by := r.take()
	t.Logf("first batch of 100 claims: %d transactions, refused: %v", n, by)
	if by[status.Convert(rpctypes.ErrGRPCTooManyOps).Message()] == 0 {
		t.Errorf("the first batch was never refused for too many operations (%v): the test checks nothing", by)
	}
	claimAll(claims("b"), idempotency.OutcomeAcquired)
	if n, by := r.take(); len(by) != 0 {
		t.Errorf("second batch of 100 claims: %d transactions, refused: %v; want none refused", n, by)
	}

	items := make([]idempotency.Finish, len(reqs))
	for i, q := range reqs {
		items[i] = idempotency.Finish{Key: q.Key, Token: q.Token, Result: bytes.Repeat([]byte{byte('a' + i%26)}, 24<<10), Retention: time.Minute}
	}
	for i, err := range s.FinishBatch(ctx, items) {
		if err != nil {
			t.Fatalf("completion %d: %v", i, err)
		}
	}
	n, by = r.take()
	t.Logf("100 completions of 24 KiB: %d transactions, refused: %v", n, by)
	if len(by) == 0 {
		t.Errorf("the completions were never refused (%d transactions): the test checks nothing", n)
	}
	for i, res := range claimAll(claims("a"), idempotency.OutcomeReplay) {
		if !bytes.Equal(res.Result, items[i].Result) {
			t.Fatalf("replay %d: %d bytes", i, len(res.Result))
		}
	}
	// The next completions of results as large: sent without a refusal.
	for i, q := range claims("b") {
		items[i].Key, items[i].Token = q.Key, q.Token
	}
	for i, err := range s.FinishBatch(ctx, items) {
		if err != nil {
			t.Fatalf("completion %d of the second batch: %v", i, err)
		}
	}
	if n, by := r.take(); len(by) != 0 {
		t.Errorf("second batch of 100 completions of 24 KiB: %d transactions, refused: %v; want none refused", n, by)
	}
}
