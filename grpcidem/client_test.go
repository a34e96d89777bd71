package grpcidem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/grpcidem/internal/testpb"
)

// The connection breaks after the handler ran, before its reply reaches
// the client: the client retries with the same key and gets the reply of
// the one run.
func TestClientRetryThroughConnectionReset(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMaxRetryAfter(20*time.Millisecond))
	px := newProxy(t, addr)
	p.hook = func(context.Context, *testpb.PayRequest) error {
		if p.runs.Load() == 1 {
			px.reset() // the reply has nowhere to go
		}
		return nil
	}
	c := dial(t, px.addr(), retrying(t))
	var h metadata.MD
	reply, err := c.Pay(context.Background(), &testpb.PayRequest{Account: "acct_1", Amount: 1000}, grpc.Header(&h))
	if err != nil || reply.GetChargeId() != "ch_1" {
		t.Fatalf("reply %v, %v; want ch_1", reply, err)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.runs.Load())
	}
	if px.accepted.Load() < 2 || !replayed(h) {
		t.Fatalf("connections %d, replayed %v: the reply did not come from a retry", px.accepted.Load(), replayed(h))
	}
}

// scripted is a server without the interceptor that answers each attempt
// with the next error of its script (then OK), and records the attempts.
type scripted struct {
	testpb.UnimplementedPaymentsServer
	mu     sync.Mutex
	script []error
	header metadata.MD // sent with every error
	keys   []string
	times  []time.Time
}

func (s *scripted) Pay(ctx context.Context, req *testpb.PayRequest) (*testpb.PayReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	md, _ := metadata.FromIncomingContext(ctx)
	s.keys = append(s.keys, md.Get(grpcidem.DefaultKeyMetadata)...)
	s.times = append(s.times, time.Now())
	if n := len(s.times); n <= len(s.script) {
		if s.header != nil {
			grpc.SetHeader(ctx, s.header)
		}
		return nil, s.script[n-1]
	}
	return &testpb.PayReply{ChargeId: "ch"}, nil
}

func (s *scripted) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.times)
}

func retryInfo(c codes.Code, d time.Duration) error {
	st, _ := status.New(c, "try later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

func TestClientHonoursRetryInfo(t *testing.T) {
	const delay = 300 * time.Millisecond
	s := &scripted{script: []error{retryInfo(codes.Aborted, delay), retryInfo(codes.Unavailable, delay)}}
	c := dial(t, serve(t, s), retrying(t, grpcidem.WithBackoff(time.Millisecond, time.Millisecond)))
	if _, err := c.Pay(context.Background(), &testpb.PayRequest{}); err != nil {
		t.Fatal(err)
	}
	if len(s.times) != 3 {
		t.Fatalf("%d attempts, want 3", len(s.times))
	}
	for i := 1; i < 3; i++ {
		if gap := s.times[i].Sub(s.times[i-1]); gap < delay {
			t.Errorf("attempt %d came %v after the one the server asked to wait %v", i+1, gap, delay)
		}
	}
	if s.keys[0] == "" || s.keys[0] != s.keys[1] || s.keys[1] != s.keys[2] || len(s.keys) != 3 {
		t.Fatalf("keys %q: want one key, the same in every attempt", s.keys)
	}
}

func TestClientRetryCodes(t *testing.T) {
	for _, tc := range []struct {
		code  codes.Code
		retry bool
	}{
		{codes.Unavailable, true}, {codes.Aborted, true}, {codes.ResourceExhausted, true},
		{codes.Internal, true}, {codes.Unknown, true}, {codes.DeadlineExceeded, true},
		{codes.InvalidArgument, false}, {codes.FailedPrecondition, false}, {codes.NotFound, false},
		{codes.PermissionDenied, false}, {codes.Unauthenticated, false}, {codes.Unimplemented, false},
	} {
		s := &scripted{script: []error{status.Error(tc.code, "x")}}
		c := dial(t, serve(t, s), retrying(t))
		_, err := c.Pay(context.Background(), &testpb.PayRequest{})
		if retried := s.attempts() == 2; retried != tc.retry || (tc.retry && err != nil) {
			t.Errorf("%v: %d attempts, err %v; want retried %v", tc.code, s.attempts(), err, tc.retry)
		}
	}
}

// A replayed answer is the stored outcome: never retried, whatever its
// code.
func TestClientNeverRetriesReplayed(t *testing.T) {
	s := &scripted{script: []error{status.Error(codes.Unavailable, "stored")}, header: metadata.Pairs(grpcidem.DefaultReplayMetadata, "true")}
	c := dial(t, serve(t, s), retrying(t))
	_, err := c.Pay(context.Background(), &testpb.PayRequest{})
	if status.Code(err) != codes.Unavailable || s.attempts() != 1 {
		t.Fatalf("err %v after %d attempts; want the replayed Unavailable after 1", err, s.attempts())
	}
}

func TestClientBounds(t *testing.T) {
	always := func(n int, err error) []error {
		s := make([]error, n)
		for i := range s {
			s[i] = err
		}
		return s
	}
	s := &scripted{script: always(10, status.Error(codes.Unavailable, "down"))}
	c := dial(t, serve(t, s), retrying(t, grpcidem.WithMaxAttempts(3)))
	_, err := c.Pay(context.Background(), &testpb.PayRequest{})
	if status.Code(err) != codes.Unavailable || s.attempts() != 3 {
		t.Fatalf("err %v after %d attempts; want Unavailable after 3", err, s.attempts())
	}

	// A retry delay beyond the call's deadline ends the call at once.
	s = &scripted{script: always(10, retryInfo(codes.Aborted, time.Hour))}
	c = dial(t, serve(t, s), retrying(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Pay(ctx, &testpb.PayRequest{})
	if status.Code(err) != codes.Aborted || s.attempts() != 1 || ctx.Err() != nil {
		t.Fatalf("err %v after %d attempts, ctx %v; want Aborted after 1, before the deadline", err, s.attempts(), ctx.Err())
	}

	// MaxElapsed bounds the retries of a call without a deadline.
	s = &scripted{script: always(10, retryInfo(codes.Aborted, time.Hour))}
	c = dial(t, serve(t, s), retrying(t, grpcidem.WithMaxElapsed(time.Second)))
	_, err = c.Pay(context.Background(), &testpb.PayRequest{})
	if status.Code(err) != codes.Aborted || s.attempts() != 1 {
		t.Fatalf("err %v after %d attempts; want Aborted after 1", err, s.attempts())
	}

	// A canceled call stops.
	s = &scripted{script: always(10, retryInfo(codes.Aborted, 50*time.Millisecond))}
	c = dial(t, serve(t, s), retrying(t))
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(120*time.Millisecond, cancel)
	_, err = c.Pay(ctx, &testpb.PayRequest{})
	if err == nil || s.attempts() >= 10 {
		t.Fatalf("err %v after %d attempts; want a stop at the cancel", err, s.attempts())
	}
}

// An attempt that times out is retried with the same key, and the retry
// gets the first attempt's reply once stored.
func TestClientAttemptTimeout(t *testing.T) {
	p, addr := start(t, nil, grpcidem.WithSharedKeySpace(), grpcidem.WithMaxRetryAfter(20*time.Millisecond))
	p.hook = func(context.Context, *testpb.PayRequest) error {
		time.Sleep(300 * time.Millisecond) // longer than an attempt
		return nil
	}
	c := dial(t, addr, retrying(t, grpcidem.WithAttemptTimeout(100*time.Millisecond), grpcidem.WithMaxAttempts(100)))
	var h metadata.MD
	reply, err := c.Pay(context.Background(), &testpb.PayRequest{}, grpc.Header(&h))
	if err != nil || reply.GetChargeId() != "ch_1" || p.runs.Load() != 1 || !replayed(h) {
		t.Fatalf("reply %v, %v, runs %d, replayed %v; want ch_1 from one run, replayed to a later attempt", reply, err, p.runs.Load(), replayed(h))
	}
}

func TestClientKeys(t *testing.T) {
	s := &scripted{}
	c := dial(t, serve(t, s), retrying(t, grpcidem.WithClientMethods("/idem.test.v1.Payments/Pay")))
	c.Pay(context.Background(), &testpb.PayRequest{})
	c.Pay(context.Background(), &testpb.PayRequest{})
	c.Pay(grpcidem.WithKey(context.Background(), "mine"), &testpb.PayRequest{})
	if len(s.keys) != 3 || s.keys[0] == s.keys[1] || len(s.keys[0]) != 36 || s.keys[2] != "mine" {
		t.Fatalf("keys %q; want a fresh UUID per call and the caller's own", s.keys)
	}

	// A method the interceptor does not manage gets no key and no retry.
	s = &scripted{script: []error{status.Error(codes.Unavailable, "down")}}
	c = dial(t, serve(t, s), retrying(t, grpcidem.WithClientMethods("/idem.test.v1.Payments/Balance")))
	_, err := c.Pay(context.Background(), &testpb.PayRequest{})
	if status.Code(err) != codes.Unavailable || s.attempts() != 1 || len(s.keys) != 0 {
		t.Fatalf("unmanaged: %v, %d attempts, keys %q", err, s.attempts(), s.keys)
	}
}

// A holder that crashed (its claim made straight on the store, never
// renewed) holds the key for its lease; the Aborted answers tell how long
// it still runs, and the client interceptor keeps retrying past its
// MaxAttempts and MaxElapsed until the lease ends and its retry takes the
// key over. With WithMaxLeaseWait(0) it gives up as before.
func TestClientFollowsACrashedHoldersLease(t *testing.T) {
	for _, follow := range []bool{true, false} {
		store := memStore(nil)
		runner := newRunner(t, store, idempotency.WithUnsafeShortDurations(), idempotency.WithLease(time.Second))
		p, addr := start(t, runner)
		req := &testpb.PayRequest{Amount: 4}
		fp, err := grpcidem.DefaultFingerprint(testpb.Payments_Pay_FullMethodName, req)
		if err != nil {
			t.Fatal(err)
		}
		key, err := runner.StorageKey(idempotency.Request{Key: "crashed", Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		const lease = 1500 * time.Millisecond
		if _, err := store.Claim(context.Background(), idempotency.ClaimRequest{Key: key, Fingerprint: fp,
			Token: "the crashed holder", Lease: lease, Grace: time.Minute}); err != nil {
			t.Fatal(err)
		}
		opts := []grpcidem.ClientOption{grpcidem.WithMaxAttempts(2), grpcidem.WithMaxElapsed(200 * time.Millisecond)}
		if !follow {
			opts = append(opts, grpcidem.WithMaxLeaseWait(0))
		}
		c := dial(t, addr, retrying(t, opts...))
		began := time.Now()
		reply, err := c.Pay(keyed("crashed"), req)
		switch {
		case follow && (err != nil || p.runs.Load() != 1 || time.Since(began) < lease/2):
			t.Fatalf("following the lease: %v, %v after %v and %d runs; want the takeover's reply", reply, err, time.Since(began), p.runs.Load())
		case !follow && (status.Code(err) != codes.Aborted || p.runs.Load() != 0):
			t.Fatalf("not following: %v after %d runs, want Aborted", err, p.runs.Load())
		}
		if !follow {
			if d, ok := grpcidem.LeaseRemaining(err); !ok || d <= 0 || d > lease {
				t.Fatalf("LeaseRemaining = %v, %v; want the holder's lease left, up to %v", d, ok, lease)
			}
		}
	}
}
