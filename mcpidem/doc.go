// Package mcpidem brings idempotency keys to agent tool calls over the
// Model Context Protocol, on the official Go SDK
// (github.com/modelcontextprotocol/go-sdk): a server middleware that
// de-duplicates tools/call requests carrying a key, and a client
// middleware that gives each call a key and retries it safely.
//
// Agents retry: a host times out, a streamable HTTP connection drops
// after the server charged the card, an agent loop re-plans and calls
// send_invoice again. On the server, [ServerMiddleware] runs the tools it
// manages through an [idempotency.Executor] (an [*idempotency.Runner] on
// any store, or the PostgreSQL adapter's TxExecutor), so that a retry with
// the same key gets the first CallToolResult replayed, marked in its
// _meta, instead of a second charge. Its answers are those of the HTTP
// and gRPC middleware, as JSON-RPC errors with stable codes and an
// [ErrorData]:
//
//	outcome                          MCP (JSON-RPC)                                   data.reason                      HTTP (httpidem)      gRPC (grpcidem)
//	first call with a key            the tool's result, stored                        -                                the handler's        the handler's
//	retry, same call                 the stored result, _meta idempotent-replayed     -                                stored, replayed     stored, replayed
//	same key while the first runs    -33005 CodeInProgress + retryAfterMs             IDEMPOTENCY_IN_PROGRESS          409 + Retry-After    Aborted + RetryInfo
//	same key, other tool/arguments   -33006 CodeKeyReused                             IDEMPOTENCY_KEY_REUSED           422                  FailedPrecondition
//	missing key (see WithRequired)   -33001 CodeKeyMissing                            IDEMPOTENCY_KEY_MISSING          400                  InvalidArgument
//	malformed key                    -33002 CodeKeyMalformed                          IDEMPOTENCY_KEY_MALFORMED        400                  InvalidArgument
//	arguments not RFC 8785 JSON      -33003 CodeBadRequest                            IDEMPOTENCY_BAD_REQUEST          400                  InvalidArgument
//	scope rejected                   -33004 CodeScopeRejected                         IDEMPOTENCY_SCOPE_REJECTED       403                  PermissionDenied
//	tool error not marked permanent  the tool's result, key released                  -                                5xx, 408, 429        codes Stored refuses
//	store unreachable                -33007 CodeStoreUnavailable + retryAfterMs       IDEMPOTENCY_STORE_UNAVAILABLE    503 + Retry-After    Unavailable + RetryInfo
//	retry of a result not stored     -33008 CodeResponseNotStored, replayed: true     IDEMPOTENCY_RESPONSE_NOT_STORED  410                  FailedPrecondition
//	stored result unreadable         -33009 CodeResultCorrupt                         IDEMPOTENCY_RESULT_CORRUPT       500                  DataLoss
//	anything else                    -33010 CodeInternal                              IDEMPOTENCY_INTERNAL             500                  Internal
//
// The codes lie outside the range JSON-RPC reserves (-32768 to -32000),
// where MCP and its SDKs define theirs. The data is
// {"domain": "idempotency.exactlyonce.github.com", "reason": ..., "retryAfterMs": ..., "replayed": ...}.
//
// The key travels in the request's _meta ("idempotency-key"), or in an
// argument the tool declares ([KeyArgumentMeta]), so that a model can make
// the key of its intent itself. Tools annotated readOnlyHint or
// idempotentHint are not managed. Every call is scoped: [TokenScope]
// takes the user from the bearer token the SDK's auth.RequireBearerToken
// verified, so that one user's key never reaches another's result:
//
//	runner, err := idempotency.New(store)
//	idem, err := mcpidem.ServerMiddleware(runner, mcpidem.WithScope(mcpidem.TokenScope))
//	server.AddReceivingMiddleware(idem)
//
// On the client, [ClientMiddleware] attaches one key per CallTool (or
// keeps the caller's, see [WithKey]) and retries transport failures and
// the answers that mean "retry with the same key" with exponential
// backoff and full jitter, waiting at least the server's retryAfterMs,
// within bounded attempts and the call's deadline; it never retries a
// result, a replayed answer or any other error:
//
//	retry, err := mcpidem.ClientMiddleware()
//	client.AddSendingMiddleware(retry)
//
// The command in the example directory runs a server with a charge tool
// and an agent calling it over a connection that loses answers: go run
// github.com/exactlyonce/idempotency/mcpidem/example.
package mcpidem
