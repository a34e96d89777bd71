package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/store/postgres"
)

// payDesc is a one-method gRPC service on well-known types, so that the
// test needs no generated code: Pay takes an amount and answers a charge
// ID.
var payDesc = grpc.ServiceDesc{
	ServiceName: "idem.integration.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Pay",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.Int64Value)
			if err := dec(in); err != nil {
				return nil, err
			}
			pay := srv.(func(context.Context, *wrapperspb.Int64Value) (*wrapperspb.StringValue, error))
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/idem.integration.Payments/Pay"}
			return ic(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return pay(ctx, req.(*wrapperspb.Int64Value))
			})
		},
	}},
}

// The gRPC interceptors on PostgreSQL's transactional mode: the key, the
// handler's INSERT and the stored reply commit in one transaction. Ten
// concurrent calls with one key, retried by the client interceptor, make
// one row, and every caller gets its charge ID.
func TestGRPCPostgresTx(t *testing.T) {
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		t.Fatal("IDEM_POSTGRES_URL is not set: run scripts/test.sh (it starts a throwaway PostgreSQL) or set IDEM_POSTGRES_URL")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("IDEM_POSTGRES_URL: %v", err)
	}
	cfg.MaxConns = 12 // the server is shared: one connection per duplicate and a few more
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("grpcidem_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("cannot use the PostgreSQL at IDEM_POSTGRES_URL (%v); run scripts/test.sh or point it at a reachable server", err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".charges (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(pool, &postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := postgres.NewTxExecutor(pool, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := grpcidem.UnaryServerInterceptor(exec, grpcidem.WithScope(func(ctx context.Context, fullMethod string) ([]string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return append(md.Get("tenant"), fullMethod), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	pay := func(ctx context.Context, in *wrapperspb.Int64Value) (*wrapperspb.StringValue, error) {
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return nil, fmt.Errorf("no transaction in the handler's context")
		}
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO "+schema+".charges (amount) VALUES ($1) RETURNING id", in.GetValue()).Scan(&id); err != nil {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond) // the duplicates arrive while it runs
		return wrapperspb.String(fmt.Sprintf("ch_%d", id)), nil
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idem))
	srv.RegisterService(&payDesc, pay)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	retry, err := grpcidem.UnaryClientInterceptor(grpcidem.WithBackoff(10*time.Millisecond, 100*time.Millisecond), grpcidem.WithMaxAttempts(20))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(retry))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	callCtx := metadata.AppendToOutgoingContext(grpcidem.WithKey(ctx, "shared-key"), "tenant", "acct_42")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[string]int{}
	replays := 0
	for range 10 {
		wg.Go(func() {
			out := new(wrapperspb.StringValue)
			var h metadata.MD
			err := cc.Invoke(callCtx, "/idem.integration.Payments/Pay", wrapperspb.Int64(1000), out, grpc.Header(&h))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("call: %v", err)
				return
			}
			ids[out.GetValue()]++
			if v := h.Get(grpcidem.DefaultReplayMetadata); len(v) > 0 && v[0] == "true" {
				replays++
			}
		})
	}
	wg.Wait()
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".charges").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || len(ids) != 1 || replays != 9 {
		t.Fatalf("rows %d, charge IDs %v, replays %d; want 1 row, one ID for all 10 calls, 9 replays", rows, ids, replays)
	}

	// Another tenant with the same key is another request.
	other := metadata.AppendToOutgoingContext(grpcidem.WithKey(ctx, "shared-key"), "tenant", "acct_7")
	out := new(wrapperspb.StringValue)
	if err := cc.Invoke(other, "/idem.integration.Payments/Pay", wrapperspb.Int64(5), out); err != nil || ids[out.GetValue()] != 0 {
		t.Fatalf("other tenant: %v, %v", out, err)
	}
}
