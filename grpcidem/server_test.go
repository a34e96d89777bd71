package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/grpcidem/internal/testpb"
)

func TestReplay(t *testing.T) {
	p, addr := start(t, nil)
	c := dial(t, addr)
	req := &testpb.PayRequest{Account: "acct_1", Amount: 1000, Currency: "EUR"}
	var h1, h2 metadata.MD
	first, err := c.Pay(keyed("k1"), req, grpc.Header(&h1))
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Pay(keyed("k1"), req, grpc.Header(&h2))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, second) || first.GetChargeId() != "ch_1" {
		t.Fatalf("replay %v, first %v", second, first)
	}
	if replayed(h1) || !replayed(h2) {
		t.Fatalf("replay header: first %v, second %v; want only the second", h1, h2)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.runs.Load())
	}
	// Another key is another call.
	third, err := c.Pay(keyed("k2"), req)
	if err != nil || third.GetChargeId() != "ch_2" {
		t.Fatalf("new key: %v, %v", third, err)
	}
}

// A stored error (a code Stored accepts) replays with its code, message
// and details; a transient one releases the key.
func TestReplayStoredError(t *testing.T) {
	p, addr := start(t, nil)
	fail := codes.FailedPrecondition
	p.hook = func(context.Context, *testpb.PayRequest) error {
		st, _ := status.New(fail, "insufficient funds").WithDetails(&errdetails.PreconditionFailure{
			Violations: []*errdetails.PreconditionFailure_Violation{{Type: "BALANCE", Subject: "acct_1"}},
		})
		return st.Err()
	}
	c := dial(t, addr)
	req := &testpb.PayRequest{Account: "acct_1", Amount: 1000}
	_, err1 := c.Pay(keyed("k"), req)
	var trailer metadata.MD
	_, err2 := c.Pay(keyed("k"), req, grpc.Trailer(&trailer))
	s1, s2 := status.Convert(err1), status.Convert(err2)
	if s1.Code() != fail || !proto.Equal(s1.Proto(), s2.Proto()) || len(s2.Details()) != 1 {
		t.Fatalf("replayed status %v, first %v", s2.Proto(), s1.Proto())
	}
	if !replayed(trailer) {
		t.Fatalf("replayed error without the replay mark in its trailer: %v", trailer)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.runs.Load())
	}

	for _, code := range []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown, codes.Unauthenticated, codes.ResourceExhausted, codes.Aborted} {
		fail = code
		before := p.runs.Load()
		key := "transient-" + code.String()
		_, err1 := c.Pay(keyed(key), req)
		_, err2 := c.Pay(keyed(key), req)
		if status.Code(err1) != code || status.Code(err2) != code || p.runs.Load() != before+2 {
			t.Fatalf("%v: errors %v, %v, runs %d; want the handler run twice", code, err1, err2, p.runs.Load()-before)
		}
	}
}

func TestStored(t *testing.T) {
	stored := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true,
		codes.AlreadyExists: true, codes.PermissionDenied: true, codes.FailedPrecondition: true, codes.OutOfRange: true}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if grpcidem.Stored(c) != stored[c] {
			t.Errorf("Stored(%v) = %v", c, !stored[c])
		}
	}
}

// Ten concurrent calls with one key: one runs the handler, the others get
// Aborted with a retry delay while it runs.
func TestConcurrentDuplicates(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMaxRetryAfter(200*time.Millisecond))
	release := make(chan struct{})
	p.hook = func(context.Context, *testpb.PayRequest) error {
		<-release
		return nil
	}
	c := dial(t, addr)
	req := &testpb.PayRequest{Account: "acct_1", Amount: 5}
	const n = 10
	errs := make(chan error, n)
	var wg sync.WaitGroup
	var winner *testpb.PayReply
	for range n {
		wg.Go(func() {
			reply, err := c.Pay(keyed("dup"), req)
			if err == nil {
				winner = reply
			}
			errs <- err
		})
	}
	// The nine duplicates answer while the first call is blocked.
	for range n - 1 {
		err := <-errs
		wantErr(t, err, codes.Aborted, grpcidem.ReasonInProgress)
		if d, ok := grpcidem.RetryDelay(err); !ok || d <= 0 || d > 200*time.Millisecond {
			t.Fatalf("retry delay %v, %v; want (0, 200ms]", d, ok)
		}
	}
	close(release)
	wg.Wait()
	if err := <-errs; err != nil || winner.GetChargeId() != "ch_1" {
		t.Fatalf("the first call: %v, %v", winner, err)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.runs.Load())
	}
}

// Ten concurrent duplicates through the client interceptor: one effect,
// and every caller gets its reply.
func TestConcurrentDuplicatesRetried(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMaxRetryAfter(20*time.Millisecond))
	p.hook = func(context.Context, *testpb.PayRequest) error {
		time.Sleep(100 * time.Millisecond)
		return nil
	}
	c := dial(t, addr, retrying(t, grpcidem.WithMaxAttempts(100)))
	req := &testpb.PayRequest{Account: "acct_1", Amount: 5}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fresh, replays int
	for range 10 {
		wg.Go(func() {
			var h metadata.MD
			reply, err := c.Pay(keyed("dup"), req, grpc.Header(&h))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil || reply.GetChargeId() != "ch_1":
				t.Errorf("reply %v, %v; want ch_1", reply, err)
			case replayed(h):
				replays++
			default:
				fresh++
			}
		})
	}
	wg.Wait()
	if p.runs.Load() != 1 || fresh != 1 || replays != 9 {
		t.Fatalf("runs %d, fresh replies %d, replays %d; want 1, 1, 9", p.runs.Load(), fresh, replays)
	}
}

func TestMismatch(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMethods("/idem.test.v1.Payments/"))
	c := dial(t, addr)
	req := &testpb.PayRequest{Account: "acct_1", Amount: 1000, Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}}
	if _, err := c.Pay(keyed("k"), req); err != nil {
		t.Fatal(err)
	}
	// The same message, its map filled in another order: the same request.
	same := &testpb.PayRequest{Account: "acct_1", Amount: 1000, Labels: map[string]string{}}
	for _, k := range []string{"d", "c", "b", "a"} {
		same.Labels[k] = req.Labels[k]
	}
	var h metadata.MD
	if _, err := c.Pay(keyed("k"), same, grpc.Header(&h)); err != nil || !replayed(h) {
		t.Fatalf("equal message: %v, replayed %v", err, replayed(h))
	}
	_, err := c.Pay(keyed("k"), &testpb.PayRequest{Account: "acct_1", Amount: 2000})
	wantErr(t, err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)
	// Another method with the key is another request too.
	_, err = c.Balance(keyed("k"), &testpb.BalanceRequest{Account: "acct_1"})
	wantErr(t, err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.runs.Load())
	}
}

func TestStoreDown(t *testing.T) {
	fs := &failingStore{Store: memStore(nil)}
	p, addr := start(t, newRunner(t, fs, idempotency.WithStoreRetries(2, time.Millisecond)))
	c := dial(t, addr)
	_, err := c.Pay(keyed("k"), &testpb.PayRequest{Amount: 1})
	wantErr(t, err, codes.Unavailable, grpcidem.ReasonStoreUnavailable)
	if d, ok := grpcidem.RetryDelay(err); !ok || d <= 0 {
		t.Fatalf("Unavailable without a retry delay: %v", err)
	}
	if p.runs.Load() != 0 || fs.claims.Load() != 2 {
		t.Fatalf("runs %d, claims %d; want 0 and 2 (the runner's retries)", p.runs.Load(), fs.claims.Load())
	}
}

func TestKeyErrors(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithKeyValidator(func(k string) error {
		if strings.HasPrefix(k, "bad") {
			return errors.New("keys must not start with bad")
		}
		return nil
	}))
	c := dial(t, addr)
	req := &testpb.PayRequest{Amount: 1}

	_, err := c.Pay(context.Background(), req)
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
	_, err = c.Pay(metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "a", "idempotency-key", "b"), req)
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMalformed)
	_, err = c.Pay(keyed(strings.Repeat("x", 256)), req) // the runner's 255-byte limit
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMalformed)
	_, err = c.Pay(keyed("bad-key"), req)
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMalformed)
	if !strings.Contains(status.Convert(err).Message(), "must not start with bad") {
		t.Fatalf("validator's message not sent: %v", err)
	}
	if p.runs.Load() != 0 {
		t.Fatalf("handler ran %d times on invalid keys", p.runs.Load())
	}

	// WithRequired: a method that does not require a key passes through.
	p2, addr2 := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithRequired(func(context.Context, string) bool { return false }))
	c2 := dial(t, addr2)
	for range 2 {
		if _, err := c2.Pay(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	if p2.runs.Load() != 2 {
		t.Fatalf("keyless calls ran %d times, want 2", p2.runs.Load())
	}
}

// Methods declared NO_SIDE_EFFECTS are not managed by default; WithMethods
// chooses.
func TestManagedMethods(t *testing.T) {
	p, addr := start(t, nil)
	c := dial(t, addr)
	if _, err := c.Balance(context.Background(), &testpb.BalanceRequest{}); err != nil {
		t.Fatalf("Balance without a key: %v", err)
	}
	_, err := c.Pay(context.Background(), &testpb.PayRequest{})
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)

	p2, addr2 := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMethods("/idem.test.v1.Payments/Balance"))
	c2 := dial(t, addr2)
	if _, err := c2.Pay(context.Background(), &testpb.PayRequest{}); err != nil {
		t.Fatalf("Pay, not managed: %v", err)
	}
	_, err = c2.Balance(context.Background(), &testpb.BalanceRequest{})
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
	if p.runs.Load() != 1 || p2.runs.Load() != 1 {
		t.Fatalf("runs %d, %d", p.runs.Load(), p2.runs.Load())
	}
}

// tenantScope scopes calls by the tenant metadata entry (in a real
// service: the authenticated peer's identity).
func tenantScope(ctx context.Context, fullMethod string) ([]string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	t := md.Get("tenant")
	switch {
	case len(t) == 0:
		return nil, errors.New("directory lookup failed: secret internal detail")
	case t[0] == "anonymous":
		return nil, status.Error(codes.Unauthenticated, "log in first")
	case t[0] == "blank":
		return []string{"", fullMethod}, nil
	}
	return []string{t[0], fullMethod}, nil
}

func TestScope(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithScope(tenantScope))
	c := dial(t, addr)
	req := &testpb.PayRequest{Amount: 1}
	a, err := c.Pay(keyed("k", "tenant", "a"), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Pay(keyed("k", "tenant", "b"), req)
	if err != nil || a.GetChargeId() == b.GetChargeId() {
		t.Fatalf("tenant b got %v, %v; tenant a %v: the key must not cross tenants", b, err, a)
	}

	_, err = c.Pay(keyed("k"), req)
	wantErr(t, err, codes.PermissionDenied, grpcidem.ReasonScopeRejected)
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("the scope error's text was sent: %v", err)
	}
	// The scope function's own status is sent with its code and message,
	// and the reason attached (issue 25: it had none).
	_, err = c.Pay(keyed("k", "tenant", "anonymous"), req)
	wantErr(t, err, codes.Unauthenticated, grpcidem.ReasonScopeRejected)
	if st, _ := status.FromError(err); st.Message() != "log in first" {
		t.Fatalf("message %q, want the scope function's", st.Message())
	}
	_, err = c.Pay(keyed("k", "tenant", "blank"), req)
	wantErr(t, err, codes.PermissionDenied, grpcidem.ReasonScopeRejected)
	if p.runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2 (tenants a and b)", p.runs.Load())
	}
}

func TestResponseNotStored(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMaxResponseSize(16))
	c := dial(t, addr)
	req := &testpb.PayRequest{Amount: 1 << 40} // ch_1 and a long amount: above 16 bytes stored
	first, err := c.Pay(keyed("k"), req)
	if err != nil || first.GetChargeId() != "ch_1" || first.GetAmount() != req.Amount {
		t.Fatalf("first call: %v, %v; want its reply although it is not stored", first, err)
	}
	var h metadata.MD
	_, err = c.Pay(keyed("k"), req, grpc.Header(&h))
	wantErr(t, err, codes.FailedPrecondition, grpcidem.ReasonResponseNotStored)
	if !replayed(h) || p.runs.Load() != 1 {
		t.Fatalf("replayed %v, runs %d; want true, 1", replayed(h), p.runs.Load())
	}
}

// A panic releases the key (a recovery interceptor outside answers it),
// so that a retry runs the handler again.
func TestPanicReleases(t *testing.T) {
	idem, err := grpcidem.UnaryServerInterceptor(newRunner(t, nil), grpcidem.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	recovery := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
		defer func() {
			if recover() != nil {
				err = status.Error(codes.Internal, "panic")
			}
		}()
		return h(ctx, req)
	}
	p := &payments{}
	p.hook = func(context.Context, *testpb.PayRequest) error {
		if p.runs.Load() == 1 {
			panic("boom")
		}
		return nil
	}
	c := dial(t, serve(t, p, recovery, idem))
	_, err = c.Pay(keyed("k"), &testpb.PayRequest{})
	wantErr(t, err, codes.Internal, "")
	reply, err := c.Pay(keyed("k"), &testpb.PayRequest{})
	if err != nil || reply.GetChargeId() != "ch_2" {
		t.Fatalf("retry after a panic: %v, %v; want the handler run again", reply, err)
	}
}

func TestConfigRefused(t *testing.T) {
	r := newRunner(t, nil)
	cases := []struct {
		name string
		exec idempotency.Executor
		opts []grpcidem.Option
		want string
	}{
		{"nil executor", nil, []grpcidem.Option{grpcidem.WithSharedKeySpace()}, "nil executor"},
		{"typed nil executor", (*idempotency.Runner)(nil), []grpcidem.Option{grpcidem.WithSharedKeySpace()}, "nil executor"},
		{"no scope", r, nil, "WithScope"},
		{"both scopes", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithScope(tenantScope)}, "choose one"},
		{"nil option", r, []grpcidem.Option{nil}, "nil option"},
		{"reserved key metadata", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithKeyMetadata("grpc-key")}, "WithKeyMetadata"},
		{"binary replay metadata", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithReplayMetadata("x-bin")}, "WithReplayMetadata"},
		{"method without slash", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithMethods("pkg.Svc/Pay")}, "WithMethods"},
		{"no methods", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithMethods()}, "WithMethods"},
		{"nil fingerprint", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithFingerprint(nil)}, "WithFingerprint"},
		{"zero response size", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithMaxResponseSize(0)}, "WithMaxResponseSize"},
		{"retry delay in ns", r, []grpcidem.Option{grpcidem.WithSharedKeySpace(), grpcidem.WithMaxRetryAfter(100)}, "WithMaxRetryAfter"},
	}
	for _, tc := range cases {
		i, err := grpcidem.UnaryServerInterceptor(tc.exec, tc.opts...)
		if i != nil || !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := grpcidem.UnaryServerInterceptor(r, grpcidem.WithKeyMetadata("X-Idempotency-Key"), grpcidem.WithSharedKeySpace()); err != nil {
		t.Errorf("upper-case metadata key: %v (gRPC lowers it)", err)
	}

	clientCases := []struct {
		name string
		opts []grpcidem.ClientOption
		want string
	}{
		{"zero attempts", []grpcidem.ClientOption{grpcidem.WithMaxAttempts(0)}, "WithMaxAttempts"},
		{"zero elapsed", []grpcidem.ClientOption{grpcidem.WithMaxElapsed(0)}, "WithMaxElapsed"},
		{"negative attempt timeout", []grpcidem.ClientOption{grpcidem.WithAttemptTimeout(-1)}, "WithAttemptTimeout"},
		{"max below min backoff", []grpcidem.ClientOption{grpcidem.WithBackoff(time.Second, time.Millisecond)}, "WithBackoff"},
		{"zero backoff", []grpcidem.ClientOption{grpcidem.WithBackoff(0, time.Second)}, "WithBackoff"},
		{"bad method", []grpcidem.ClientOption{grpcidem.WithClientMethods("Pay")}, "WithClientMethods"},
		{"bad metadata", []grpcidem.ClientOption{grpcidem.WithClientMetadata("key", "")}, "WithClientMetadata"},
		{"nil option", []grpcidem.ClientOption{nil}, "nil option"},
	}
	for _, tc := range clientCases {
		i, err := grpcidem.UnaryClientInterceptor(tc.opts...)
		if i != nil || !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("client, %s: %v, want ErrInvalidArgument naming %q", tc.name, err, tc.want)
		}
	}
}

// TestCorruptRecord: a completed record whose stored answer cannot be read
// (another codec, damage) is answered DataLoss with reason
// IDEMPOTENCY_RESULT_CORRUPT, the handler never runs, and the client
// interceptor does not retry it: a retry with the same key can never
// succeed. (HTTP answers the same outcome 500, ProblemResultCorrupt.)
func TestCorruptRecord(t *testing.T) {
	store := memStore(nil)
	r := newRunner(t, store)
	p, addr := start(t, r)
	req := &testpb.PayRequest{Amount: 5}
	fp, err := grpcidem.DefaultFingerprint(testpb.Payments_Pay_FullMethodName, req)
	if err != nil {
		t.Fatal(err)
	}
	for name, stored := range map[string][]byte{
		"unknown kind":              []byte("?garbage"),
		"undecodable value":         []byte(`v{"not json`),
		"not an answer":             []byte("b\x00\x01not a stored answer"),
		"a stored error (not ours)": []byte(`e"declined"`),
	} {
		t.Run(name, func(t *testing.T) {
			key := "corrupt-" + strings.ReplaceAll(name, " ", "-")
			skey, err := r.StorageKey(idempotency.Request{Key: key, Fingerprint: fp})
			if err != nil {
				t.Fatal(err)
			}
			if cr, err := store.Claim(t.Context(), idempotency.ClaimRequest{Key: skey, Fingerprint: fp, Token: "old", Lease: time.Minute}); err != nil || cr.Outcome != idempotency.OutcomeAcquired {
				t.Fatalf("seed claim: %+v %v", cr, err)
			}
			if err := store.Complete(t.Context(), skey, "old", stored, time.Hour); err != nil {
				t.Fatal(err)
			}
			var attempts atomic.Int64
			count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				attempts.Add(1)
				return invoker(ctx, method, req, reply, cc, opts...)
			})
			c := dial(t, addr, retrying(t), count)
			_, err = c.Pay(keyed(key), req)
			wantErr(t, err, codes.DataLoss, grpcidem.ReasonResultCorrupt)
			if d, ok := grpcidem.RetryDelay(err); ok {
				t.Errorf("a corrupt record's answer carries a retry delay (%v): it must never be retried", d)
			}
			if n := attempts.Load(); n != 1 {
				t.Errorf("the client interceptor sent %d attempts for a corrupt record, want 1", n)
			}
			if p.runs.Load() != 0 {
				t.Errorf("the handler ran %d times for a completed record", p.runs.Load())
			}
		})
	}
}

// observed records the events an observer gets.
type observed struct {
	mu     sync.Mutex
	events []idempotency.Event
}

func (o *observed) Observe(_ context.Context, e idempotency.Event) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

// The calls the interceptor refuses before the executor (issue 25: scope
// rejections were not counted) reach WithObserver as OutcomeInvalidKey;
// WithErrorRenderer shapes every answer of the interceptor's own, and
// never runs for the handler's answers.
func TestRefusalsObservedAndRendered(t *testing.T) {
	var obs observed
	var rendered []string
	render := func(ctx context.Context, a grpcidem.ErrorAnswer) error {
		rendered = append(rendered, a.Reason+"/"+a.Outcome.String())
		if a.Outcome == idempotency.OutcomeMismatch {
			return status.Error(codes.AlreadyExists, "rendered: "+a.Status.Message())
		}
		return nil // the status as it is
	}
	p, addr := start(t, nil, grpcidem.WithScope(tenantScope), grpcidem.WithObserver(&obs), grpcidem.WithErrorRenderer(render))
	c := dial(t, addr)
	req := &testpb.PayRequest{Amount: 1}
	_, err := c.Pay(keyed("k", "tenant", "anonymous"), req) // the scope function's own status
	wantErr(t, err, codes.Unauthenticated, grpcidem.ReasonScopeRejected)
	_, err = c.Pay(keyed("k"), req) // no tenant
	wantErr(t, err, codes.PermissionDenied, grpcidem.ReasonScopeRejected)
	_, err = c.Pay(context.Background(), req) // no key
	wantErr(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
	if _, err = c.Pay(keyed("k", "tenant", "a"), req); err != nil {
		t.Fatal(err)
	}
	_, err = c.Pay(keyed("k", "tenant", "a"), &testpb.PayRequest{Amount: 2})
	if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "rendered") {
		t.Fatalf("mismatch: %v, want the renderer's AlreadyExists", err)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", p.runs.Load())
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	var refused int
	for _, e := range obs.events {
		if e.Outcome != idempotency.OutcomeInvalidKey || !errors.Is(e.Err, idempotency.ErrInvalidKey) {
			t.Errorf("event %+v, want OutcomeInvalidKey matching ErrInvalidKey", e)
		}
		refused++
	}
	if refused != 3 || !strings.Contains(obs.events[0].Err.Error(), grpcidem.ReasonScopeRejected) {
		t.Fatalf("%d events (%v), want the 3 refusals, the first a scope rejection", refused, obs.events)
	}
	want := []string{"IDEMPOTENCY_SCOPE_REJECTED/invalid_key", "IDEMPOTENCY_SCOPE_REJECTED/invalid_key",
		"IDEMPOTENCY_KEY_MISSING/invalid_key", "IDEMPOTENCY_KEY_REUSED/mismatch"}
	if fmt.Sprint(rendered) != fmt.Sprint(want) {
		t.Fatalf("rendered %v, want %v", rendered, want)
	}
	if _, err := grpcidem.UnaryServerInterceptor(newRunner(t, nil), grpcidem.WithSharedKeySpace(), grpcidem.WithErrorRenderer(nil)); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithErrorRenderer") {
		t.Fatalf("nil renderer: %v", err)
	}
}
