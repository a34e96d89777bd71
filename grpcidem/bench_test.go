package grpcidem_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/grpcidem/internal/testpb"
)

// BenchmarkServerInterceptor measures the interceptor's overhead on the
// memory store, without the network: "bare" is the handler alone, "fresh"
// a new key per call (claim, run, store), "replay" one key (claim finds
// the stored reply). Compare within one run:
//
//	go test -run '^$' -bench ServerInterceptor -benchmem -count 6 ./grpcidem/
func BenchmarkServerInterceptor(b *testing.B) {
	idem, err := grpcidem.UnaryServerInterceptor(newRunner(b, nil), grpcidem.WithSharedKeySpace())
	if err != nil {
		b.Fatal(err)
	}
	p := &payments{}
	info := &grpc.UnaryServerInfo{FullMethod: "/idem.test.v1.Payments/Pay"}
	handler := func(ctx context.Context, req any) (any, error) { return p.Pay(ctx, req.(*testpb.PayRequest)) }
	req := &testpb.PayRequest{Account: "acct_42", Amount: 1000, Currency: "EUR"}
	keyed := func(k string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(grpcidem.DefaultKeyMetadata, k))
	}
	b.Run("bare", func(b *testing.B) {
		ctx := keyed("k")
		for b.Loop() {
			if _, err := handler(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fresh", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			if _, err := idem(keyed("fresh-"+strconv.Itoa(i)), req, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		ctx := keyed("replay")
		if _, err := idem(ctx, req, info, handler); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := idem(ctx, req, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
}
