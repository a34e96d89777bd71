package grpcidem_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/grpcidem/internal/testpb"
	"github.com/exactlyonce/idempotency/store/memory"
)

// paymentsServer charges once per call that reaches it.
type paymentsServer struct {
	testpb.UnimplementedPaymentsServer
	charges int
}

func (s *paymentsServer) Pay(ctx context.Context, req *testpb.PayRequest) (*testpb.PayReply, error) {
	s.charges++
	fmt.Println("charging", req.GetAccount(), req.GetAmount())
	return &testpb.PayReply{ChargeId: fmt.Sprintf("ch_%d", s.charges), Amount: req.GetAmount()}, nil
}

// accountOf is the scope of a call: here the account named in the
// metadata; in a real service, the identity of the authenticated peer
// (peer.FromContext and its AuthInfo, or a verified token).
func accountOf(ctx context.Context, fullMethod string) ([]string, error) {
	if _, ok := peer.FromContext(ctx); !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	acct := md.Get("account")
	if len(acct) != 1 {
		return nil, status.Error(codes.Unauthenticated, "log in first")
	}
	return []string{acct[0], fullMethod}, nil
}

func ExampleUnaryServerInterceptor() {
	store, err := memory.New(nil) // or postgres.New, redis.New
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	idem, err := grpcidem.UnaryServerInterceptor(runner, grpcidem.WithScope(accountOf))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idem))
	testpb.RegisterPaymentsServer(srv, &paymentsServer{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	client := testpb.NewPaymentsClient(cc)

	ctx := metadata.AppendToOutgoingContext(context.Background(), "account", "acct_42")
	ctx = grpcidem.WithKey(ctx, "9f2c4e1a-order-7") // one key per user intent
	for range 2 {                                   // a call and its retry
		var header metadata.MD
		reply, err := client.Pay(ctx, &testpb.PayRequest{Account: "acct_42", Amount: 1000}, grpc.Header(&header))
		fmt.Println(reply.GetChargeId(), header.Get("idempotent-replayed"), err)
	}
	// The same key with another request is refused, never replayed.
	_, err = client.Pay(ctx, &testpb.PayRequest{Account: "acct_42", Amount: 2000})
	fmt.Println(status.Code(err), grpcidem.ReasonOf(err))
	// Output:
	// charging acct_42 1000
	// ch_1 [] <nil>
	// ch_1 [true] <nil>
	// FailedPrecondition IDEMPOTENCY_KEY_REUSED
}

// servePayments serves paymentsServer behind the server interceptor, as
// ExampleUnaryServerInterceptor does, and returns its address.
func servePayments() (addr string, stop func()) {
	runner, err := idempotency.New(memStore(nil))
	if err != nil {
		panic(err)
	}
	idem, err := grpcidem.UnaryServerInterceptor(runner, grpcidem.WithScope(accountOf))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idem))
	testpb.RegisterPaymentsServer(srv, &paymentsServer{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	return ln.Addr().String(), srv.Stop
}

func ExampleUnaryClientInterceptor() {
	addr, stop := servePayments()
	defer stop()

	// Every call through the client gets a key of its own, kept for its
	// retries; Unavailable, Aborted and the other transient codes are
	// retried with backoff, waiting at least the server's RetryInfo.
	retry, err := grpcidem.UnaryClientInterceptor(grpcidem.WithMaxAttempts(5))
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(retry))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	client := testpb.NewPaymentsClient(cc)

	ctx := metadata.AppendToOutgoingContext(context.Background(), "account", "acct_42")
	reply, err := client.Pay(ctx, &testpb.PayRequest{Account: "acct_42", Amount: 1000})
	fmt.Println(reply.GetChargeId(), err)
	// A user who clicks "Pay" again makes a new intent: a new key, a new
	// charge. A retry of the same intent passes the intent's key.
	key := grpcidem.NewKey()
	for range 2 {
		reply, err = client.Pay(grpcidem.WithKey(ctx, key), &testpb.PayRequest{Account: "acct_42", Amount: 500})
		fmt.Println(reply.GetChargeId(), err)
	}
	// Output:
	// charging acct_42 1000
	// ch_1 <nil>
	// charging acct_42 500
	// ch_2 <nil>
	// ch_2 <nil>
}
