package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// UnaryServerInterceptor returns a gRPC unary server interceptor that
// makes the methods it manages idempotent. It runs them through exec: an
// [*idempotency.Runner] (on any store) or another [idempotency.Executor],
// such as the PostgreSQL adapter's TxExecutor, in which the key, the
// handler's writes and the stored answer commit in one transaction. A
// managed call carrying an idempotency-key metadata entry runs the
// handler at most once per scope, key and request fingerprint (the full
// method name and the deterministically marshalled request) within the
// runner's retention; every retry gets the stored answer:
//
//	call                                       answer
//	first call with a key                      handler runs; its reply, or its error if Stored(code), is stored
//	retry, same key, same request              stored reply or error, header idempotent-replayed: true, handler not run
//	same key while the first one runs          Aborted + RetryInfo (or the runner waits: idempotency.WithWait)
//	same key, other method or request message  FailedPrecondition (IDEMPOTENCY_KEY_REUSED)
//	missing key on a method that requires it   InvalidArgument (IDEMPOTENCY_KEY_MISSING)
//	malformed or repeated key                  InvalidArgument (IDEMPOTENCY_KEY_MALFORMED)
//	scope function rejects the call            PermissionDenied (or its own status), nothing claimed
//	handler fails with a code Stored refuses   sent as it is, not stored: the key is released
//	handler panics                             the key is released, the panic goes on
//	store unreachable                          Unavailable + RetryInfo, handler not run
//	retry of an answer too large to store      FailedPrecondition (IDEMPOTENCY_RESPONSE_NOT_STORED), handler not run
//	stored answer cannot be read               DataLoss (IDEMPOTENCY_RESULT_CORRUPT), handler not run, never retried
//
// Every error the interceptor answers by itself carries an
// [errdetails.ErrorInfo] with [ErrorDomain] and a Reason* constant (see
// [ReasonOf]). A call in progress gets Aborted, not Unavailable: it is a
// concurrency conflict on the key, which gRPC names Aborted (HTTP's 409),
// while Unavailable says the service could not be reached, which is what
// a store outage is; both are retried with the same key by the client
// interceptor ([UnaryClientInterceptor]) and mean "retry" to any gRPC
// client, with the delay of their RetryInfo. A gRPC service config retry
// policy that should cover both lists ABORTED among its
// retryableStatusCodes.
//
// Every managed call is scoped ([WithScope]); UnaryServerInterceptor
// refuses a configuration without a scope unless [WithSharedKeySpace]
// says so. Which methods are managed is [WithMethods]'s rule; which codes
// are stored is [Stored]'s. A replayed reply is rebuilt from its wire
// form through the global registry of generated types
// (protoregistry.GlobalTypes). Header and trailer metadata that the
// handler sets (grpc.SetHeader) are sent on the fresh answer only; they
// are neither stored nor replayed.
//
// The answer is stored before it is sent, so once it is stored every
// retry within retention gets the same answer. The handler's answer is
// sent to its caller even when it could not be stored, because its
// effect has happened: when the store fails after the handler ran
// ([idempotency.StoreError] with Ran set), the record stays STARTED, a
// retry gets Aborted until its lease ends, and a retry after that takes
// it over and runs the handler again; when the lease was lost while the
// handler ran, another call has already taken the record over. In both
// cases the second run has a greater fence and the recovery points
// ([idempotency.Step]) recorded so far: guard the handler's effects with
// those and with downstream keys ([idempotency.DownstreamKey]).
//
// The handler runs with the call's context wrapped by the runner:
// [idempotency.FromContext], [idempotency.DownstreamKey] and
// [idempotency.Step] work in it, and it is canceled with cause
// [idempotency.ErrLeaseLost] if the lease is lost. It is not canceled
// when the caller goes away or its deadline passes: a caller that timed
// out retries, and its retry must find the work done, not half done and
// released. The runner's store timeout bounds the store calls
// ([idempotency.WithStoreTimeout]), so a store that stops answering gives
// Unavailable in a few seconds, and the handler does not run.
//
// With an executor other than a Runner, a store failure whose
// [idempotency.StoreError] has Ran false after the handler ran (a
// transaction that did not commit) discards the handler's answer and
// gives Unavailable: its effects were rolled back with the key, and the
// caller's retry runs it again.
//
// UnaryServerInterceptor returns an error wrapping
// [idempotency.ErrInvalidArgument] for a nil executor, a missing scope or
// an invalid option.
func UnaryServerInterceptor(exec idempotency.Executor, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	if edge.IsNil(exec) {
		return nil, invalidArg("nil executor")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalidArg("nil option")
		}
		o.apply(&cfg)
	}
	if err := cfg.validateConfig(); err != nil {
		return nil, err
	}
	s := &server{exec: exec, cfg: cfg, replayMD: metadata.Pairs(cfg.replayMD, "true")}
	return s.intercept, nil
}

type server struct {
	exec     idempotency.Executor
	cfg      config
	replayMD metadata.MD
	levels   sync.Map // full method name -> bool: managed by its idempotency_level
}

// managed reports whether calls of fullMethod are managed.
func (s *server) managed(fullMethod string) bool {
	if s.cfg.methods != nil {
		if s.cfg.methods[fullMethod] {
			return true
		}
		i := strings.LastIndexByte(fullMethod, '/')
		return i > 0 && s.cfg.methods[fullMethod[:i+1]]
	}
	if v, ok := s.levels.Load(fullMethod); ok {
		return v.(bool)
	}
	m := managedByLevel(fullMethod)
	s.levels.Store(fullMethod, m)
	return m
}

// managedByLevel reports false for a method whose descriptor declares
// that it has no side effects or is idempotent by itself, true for any
// other method, also one whose descriptor is not registered.
func managedByLevel(fullMethod string) bool {
	name := strings.Replace(strings.TrimPrefix(fullMethod, "/"), "/", ".", 1)
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return true
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return true
	}
	o, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || o == nil {
		return true
	}
	switch o.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
		return false
	}
	return true
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := &s.cfg
	if !s.managed(info.FullMethod) {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(c.keyMD)
	switch {
	case len(values) == 0:
		if c.required == nil || c.required(ctx, info.FullMethod) {
			return nil, s.refuse(ctx, newStatus(codes.InvalidArgument, ReasonKeyMissing,
				"this method requires an "+c.keyMD+" metadata entry", 0, 0), nil)
		}
		return handler(ctx, req)
	case len(values) > 1:
		return nil, s.refuse(ctx, newStatus(codes.InvalidArgument, ReasonKeyMalformed,
			"the "+c.keyMD+" metadata entry must appear once", 0, 0), nil)
	}
	key := values[0]
	if c.validate != nil {
		if err := c.validate(key); err != nil {
			return nil, s.refuse(ctx, newStatus(codes.InvalidArgument, ReasonKeyMalformed, err.Error(), 0, 0), err)
		}
	}
	fp, err := c.fingerprint(info.FullMethod, req)
	if err != nil {
		return nil, s.refuse(ctx, newStatus(codes.InvalidArgument, ReasonBadRequest, err.Error(), 0, 0), err)
	}
	var scope []string
	if c.scope != nil {
		if scope, err = s.scopeOf(ctx, info.FullMethod); err != nil {
			return nil, err
		}
	}

	var (
		reply any
		herr  error
	)
	// A caller that gives up on a slow call will retry and should then
	// find the result: the handler is not canceled when its caller goes
	// away (only when its lease is lost).
	res, err := s.exec.Execute(context.WithoutCancel(ctx),
		idempotency.Request{Scope: scope, Key: key, Fingerprint: fp},
		func(ctx context.Context) ([]byte, error) {
			// The answer of the last run: an executor may run fn again (a
			// transaction retried after a serialization failure).
			reply, herr = handler(ctx, req)
			st := status.Convert(herr)
			if !Stored(st.Code()) {
				return nil, ErrTransient
			}
			if b, ok := encodeAnswer(reply, st, c.maxResponse); ok {
				return b, nil
			}
			return notStoredMarker, nil
		})
	route, outcome := edge.RouteOf(res, err)
	res.Outcome = outcome
	switch route {
	case edge.Own:
		return reply, herr
	case edge.Replay:
		return s.replay(ctx, res.Value)
	case edge.NotStored:
		return nil, s.notStored(ctx)
	}
	a := edge.Lookup(answers[:], outcome)
	msg := edge.Detail(a.msg, err)
	var lease time.Duration
	if res.Outcome == idempotency.OutcomeInProgress {
		lease = res.RetryAfter
	}
	retry := idempotency.RetryAfter(res, c.maxRetryAfter)
	return nil, s.answer(ctx, ErrorAnswer{Outcome: res.Outcome, Status: newStatus(a.code, a.reason, msg, retry, lease),
		Reason: a.reason, RetryAfter: retry, LeaseLeft: lease})
}

// answers are the interceptor's answers to the outcomes of a call whose
// handler did not run (see [idempotency.Outcome]); an empty message means
// the error's text. OutcomeUnknown answers every outcome not listed (an
// executor's error the interceptor cannot classify).
var answers = [...]struct {
	code   codes.Code
	reason string
	msg    string
}{
	idempotency.OutcomeUnknown: {codes.Internal, ReasonInternal,
		"the call failed and was not stored; retry with the same idempotency key"},
	// A replayed error: the record was not written by this interceptor.
	idempotency.OutcomeReplay: {codes.DataLoss, ReasonResultCorrupt,
		"the stored answer of this idempotency key is not an answer; the call is not run again"},
	idempotency.OutcomeInProgress: {codes.Aborted, ReasonInProgress,
		"a call with this idempotency key is being processed; retry later with the same key"},
	idempotency.OutcomeMismatch: {codes.FailedPrecondition, ReasonKeyReused,
		"this idempotency key was used with a different request (method or message)"},
	idempotency.OutcomeInvalidKey: {codes.InvalidArgument, ReasonKeyMalformed, ""},
	idempotency.OutcomeCorrupt: {codes.DataLoss, ReasonResultCorrupt,
		"the stored answer of this idempotency key cannot be read; the call is not run again"},
	// Also when the handler ran but its effects were rolled back together
	// with the key (an executor's transaction that did not commit): its
	// answer would tell of effects that did not happen.
	idempotency.OutcomeStoreError: {codes.Unavailable, ReasonStoreUnavailable,
		"the call was not processed; retry with the same idempotency key"},
}

// scopeOf returns the call's scope, or the error that rejects it.
func (s *server) scopeOf(ctx context.Context, fullMethod string) ([]string, error) {
	scope, err := s.cfg.scope(ctx, fullMethod)
	if err == nil {
		if why := edge.ScopeParts(scope); why != "" {
			return nil, s.refuse(ctx, newStatus(codes.PermissionDenied, ReasonScopeRejected, "the call "+why, 0, 0), nil)
		}
		return scope, nil
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.OK && st.Code() != codes.Unknown {
		// The scope function's own status, with the reason attached.
		return nil, s.refuse(ctx, withReason(st, ReasonScopeRejected), err)
	}
	return nil, s.refuse(ctx, newStatus(codes.PermissionDenied, ReasonScopeRejected, "the call's scope (tenant, peer) could not be established", 0, 0), err)
}

// refuse answers a call refused before the executor was called, and
// tells the observer, which the executor's runner never hears of it.
func (s *server) refuse(ctx context.Context, st *status.Status, err error) error {
	reason := reasonOf(st)
	if o := s.cfg.observer; o != nil {
		if err == nil {
			err = errors.New(st.Message())
		}
		o.Observe(ctx, idempotency.Event{Outcome: idempotency.OutcomeInvalidKey,
			Err: fmt.Errorf("%w: grpcidem: %s: %w", idempotency.ErrInvalidKey, reason, err)})
	}
	return s.answer(ctx, ErrorAnswer{Outcome: idempotency.OutcomeInvalidKey, Status: st, Reason: reason})
}

// answer sends an answer of the interceptor's own through the renderer.
func (s *server) answer(ctx context.Context, a ErrorAnswer) error {
	if s.cfg.render != nil {
		if err := s.cfg.render(ctx, a); err != nil {
			return err
		}
	}
	return a.Status.Err()
}

// replay answers with a stored answer, marked replayed.
func (s *server) replay(ctx context.Context, b []byte) (any, error) {
	d, err := decodeAnswer(b)
	if err != nil {
		a := answers[idempotency.OutcomeCorrupt]
		return nil, s.answer(ctx, ErrorAnswer{Outcome: idempotency.OutcomeCorrupt,
			Status: newStatus(a.code, a.reason, a.msg, 0, 0), Reason: a.reason})
	}
	if d.notStored {
		return nil, s.notStored(ctx)
	}
	grpc.SetHeader(ctx, s.replayMD)
	if d.err != nil {
		// An error is sent as a trailers-only response, whose metadata
		// some clients expose as trailer only: say it there too.
		grpc.SetTrailer(ctx, s.replayMD)
		return nil, d.err
	}
	return d.reply, nil
}

func (s *server) notStored(ctx context.Context) error {
	grpc.SetHeader(ctx, s.replayMD)
	grpc.SetTrailer(ctx, s.replayMD)
	return s.answer(ctx, ErrorAnswer{Outcome: idempotency.OutcomeResultNotStored, Reason: ReasonResponseNotStored,
		Status: newStatus(codes.FailedPrecondition, ReasonResponseNotStored,
			"the call with this idempotency key was processed, but its response could not be stored; it is not run again", 0, 0)})
}

// DefaultFingerprint is the default request fingerprint: a SHA-256 of the
// full method name and the request message marshalled deterministically
// (proto.MarshalOptions{Deterministic: true}: map entries sorted), so
// that two equal messages give the same fingerprint in one build of the
// service. Unknown fields count as they were received. It returns an
// error for a request that is not a protocol buffer message.
func DefaultFingerprint(fullMethod string, req any) (idempotency.Fingerprint, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", errors.New("grpcidem: the request is not a protocol buffer message; give WithFingerprint")
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", errors.New("grpcidem: the request cannot be marshalled: " + err.Error())
	}
	return idempotency.FingerprintParts(fullMethod, "proto", string(idempotency.FingerprintBytes(b))), nil
}
