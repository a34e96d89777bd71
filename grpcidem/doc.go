// Package grpcidem brings idempotency keys to gRPC: a unary server
// interceptor that de-duplicates calls carrying an idempotency-key
// metadata entry, and a unary client interceptor that gives each call a
// key and retries it safely.
//
// On the server, [UnaryServerInterceptor] runs the methods it manages
// through an [idempotency.Executor] (an [*idempotency.Runner] on any
// store, or the PostgreSQL adapter's TxExecutor), so that a client
// retrying Pay with the same key gets the first reply replayed (with the
// header idempotent-replayed: true) instead of a second charge. The
// outcomes map to the codes gRPC clients expect:
//
//	outcome                            code                     reason (errdetails.ErrorInfo)    HTTP (httpidem)
//	first call with a key              the handler's answer     -                                the handler's response
//	retry, same request                stored answer, replayed  -                                stored response, replayed
//	same key while the first one runs  Aborted + RetryInfo      IDEMPOTENCY_IN_PROGRESS          409 + Retry-After
//	same key, other method or message  FailedPrecondition       IDEMPOTENCY_KEY_REUSED           422
//	missing key (see WithRequired)     InvalidArgument          IDEMPOTENCY_KEY_MISSING          400
//	malformed or repeated key          InvalidArgument          IDEMPOTENCY_KEY_MALFORMED        400
//	request cannot be fingerprinted    InvalidArgument          IDEMPOTENCY_BAD_REQUEST          400
//	scope rejected                     PermissionDenied         IDEMPOTENCY_SCOPE_REJECTED       403
//	handler fails, transient code      its error, key released  -                                5xx, 408, 429 released
//	store unreachable                  Unavailable + RetryInfo  IDEMPOTENCY_STORE_UNAVAILABLE    503 + Retry-After
//	retry of an answer not stored      FailedPrecondition       IDEMPOTENCY_RESPONSE_NOT_STORED  410
//
// A replayed answer carries the header idempotent-replayed: true (a
// replayed error also in its trailer); transient codes are those
// [Stored] refuses.
//
// Every call is scoped: give [WithScope] a function of the call's context
// (the authenticated peer, a tenant in the metadata), so that one client's
// key never reaches another's answer:
//
//	runner, err := idempotency.New(store)
//	idem, err := grpcidem.UnaryServerInterceptor(runner, grpcidem.WithScope(
//		func(ctx context.Context, fullMethod string) ([]string, error) {
//			account, ok := accountOf(ctx) // from the verified credential
//			if !ok {
//				return nil, status.Error(codes.Unauthenticated, "log in first")
//			}
//			return []string{account, fullMethod}, nil
//		}))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idem))
//
// On the client, [UnaryClientInterceptor] attaches one key per call
// (or keeps the caller's, see [WithKey]) and retries Unavailable, Aborted
// and the other transient codes with exponential backoff and full jitter,
// waiting at least the server's RetryInfo delay, within bounded attempts
// and the call's deadline; it never retries a replayed answer.
package grpcidem
