package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/grpcidem/internal/testpb"
	"github.com/exactlyonce/idempotency/store/memory"
)

// payments is the service under test: Pay is the effect, counted in runs.
type payments struct {
	testpb.UnimplementedPaymentsServer
	runs atomic.Int64
	// hook, when set, runs in Pay after the effect is counted; its error
	// is Pay's.
	hook func(ctx context.Context, req *testpb.PayRequest) error
}

func (p *payments) Pay(ctx context.Context, req *testpb.PayRequest) (*testpb.PayReply, error) {
	n := p.runs.Add(1)
	if p.hook != nil {
		if err := p.hook(ctx, req); err != nil {
			return nil, err
		}
	}
	return &testpb.PayReply{ChargeId: fmt.Sprintf("ch_%d", n), Amount: req.GetAmount()}, nil
}

func (p *payments) Balance(context.Context, *testpb.BalanceRequest) (*testpb.BalanceReply, error) {
	p.runs.Add(1)
	return &testpb.BalanceReply{Balance: 7}, nil
}

func newRunner(t testing.TB, s idempotency.Store, opts ...idempotency.Option) *idempotency.Runner {
	t.Helper()
	if s == nil {
		s = memStore(nil)
	}
	r, err := idempotency.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// serve starts a gRPC server on loopback running srv behind the
// interceptors and returns its address.
func serve(t testing.TB, srv testpb.PaymentsServer, interceptors ...grpc.UnaryServerInterceptor) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...))
	testpb.RegisterPaymentsServer(s, srv)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// start serves a fresh payments service behind the server interceptor on
// exec with opts (WithSharedKeySpace if opts is empty).
func start(t testing.TB, exec idempotency.Executor, opts ...grpcidem.Option) (*payments, string) {
	t.Helper()
	if exec == nil {
		exec = newRunner(t, nil)
	}
	if len(opts) == 0 {
		opts = []grpcidem.Option{grpcidem.WithSharedKeySpace()}
	}
	idem, err := grpcidem.UnaryServerInterceptor(exec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	p := &payments{}
	return p, serve(t, p, idem)
}

func dial(t testing.TB, addr string, opts ...grpc.DialOption) testpb.PaymentsClient {
	t.Helper()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewPaymentsClient(cc)
}

// retrying returns the dial option of a client interceptor with short
// backoffs.
func retrying(t testing.TB, opts ...grpcidem.ClientOption) grpc.DialOption {
	t.Helper()
	ci, err := grpcidem.UnaryClientInterceptor(append([]grpcidem.ClientOption{
		grpcidem.WithBackoff(5*time.Millisecond, 50*time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return grpc.WithUnaryInterceptor(ci)
}

func keyed(key string, kv ...string) context.Context {
	ctx := grpcidem.WithKey(context.Background(), key)
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	return ctx
}

// wantErr checks err's code and the interceptor's reason ("" for none).
func wantErr(t testing.TB, err error, code codes.Code, reason string) {
	t.Helper()
	if status.Code(err) != code || grpcidem.ReasonOf(err) != reason {
		t.Fatalf("err = %v (reason %q), want %v with reason %q", err, grpcidem.ReasonOf(err), code, reason)
	}
}

func replayed(md metadata.MD) bool {
	v := md.Get(grpcidem.DefaultReplayMetadata)
	return len(v) > 0 && v[0] == "true"
}

// failingStore is a store that cannot be reached: every claim fails.
type failingStore struct {
	*memory.Store
	claims atomic.Int64
}

func (s *failingStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.claims.Add(1)
	return idempotency.ClaimResult{}, errors.New("dial tcp 127.0.0.1:1: connection refused")
}

// proxy is a TCP proxy in front of a server whose connections a test can
// reset, as a network fault or a crashing load balancer does.
type proxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.reset()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.accepted.Add(1)
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(s, c)
		go pipe(c, s)
	}
}

// reset drops every open connection with a TCP reset: nothing buffered
// in the proxy reaches either side.
func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	p.conns = nil
}
