package mcpidem

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TokenScope is a [ScopeFunc] for servers that authenticate their clients
// with bearer tokens, through the SDK's auth.RequireBearerToken in front
// of its streamable HTTP handler: it scopes each call by the verified
// token's user (auth.TokenInfo.UserID, which the token verifier sets) and
// the tool. A call without a verified token that names its user (over
// stdio or the in-memory transport, or a verifier that leaves UserID
// empty) is rejected with [CodeScopeRejected] before anything is claimed:
// callers that cannot be told apart must not share a key space.
//
//	idem, err := mcpidem.ServerMiddleware(runner, mcpidem.WithScope(mcpidem.TokenScope))
func TokenScope(ctx context.Context, req *mcp.CallToolRequest) ([]string, error) {
	user, ok := TokenUser(req)
	if !ok {
		return nil, fail(CodeScopeRejected, ReasonScopeRejected,
			"this tool requires a verified bearer token that names its user", 0)
	}
	return []string{user, req.Params.Name}, nil
}

// TokenUser returns the user of the call's verified bearer token, as
// [TokenScope] takes it, and reports false when the call has no verified
// token or its token names no user.
func TokenUser(req *mcp.CallToolRequest) (string, bool) {
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil || req.Extra.TokenInfo.UserID == "" {
		return "", false
	}
	return req.Extra.TokenInfo.UserID, true
}
