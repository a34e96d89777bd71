package mcpidem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/mcpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

type chargeArgs struct {
	Amount int    `json:"amount" jsonschema:"the amount, in cents"`
	To     string `json:"to" jsonschema:"the merchant"`
}

type chargeResult struct {
	Charge string `json:"charge"`
}

// paymentsServer is an MCP server with a charge tool, which charges once
// per call that reaches it.
func paymentsServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	var charges atomic.Int64
	mcp.AddTool(s, &mcp.Tool{Name: "charge", Description: "Charges the user's card."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in chargeArgs) (*mcp.CallToolResult, chargeResult, error) {
			if in.Amount <= 0 {
				// Stored and replayed: a retry must not succeed later.
				return nil, chargeResult{}, idempotency.Permanent(errors.New("the amount must be positive"))
			}
			n := charges.Add(1)
			fmt.Println("charging", in.Amount, "to", in.To)
			return nil, chargeResult{Charge: fmt.Sprintf("ch_%d", n)}, nil
		})
	return s
}

// serveWithTokens serves s over streamable HTTP behind the SDK's
// bearer-token check; a token names its user.
func serveWithTokens(s *mcp.Server, users map[string]string) *httptest.Server {
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		user, ok := users[token]
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	return httptest.NewServer(auth.RequireBearerToken(verify, nil)(h))
}

func agentSession(url, token string, mw ...mcp.Middleware) *mcp.ClientSession {
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	c.AddSendingMiddleware(mw...)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{token: token, base: http.DefaultTransport}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		panic(err)
	}
	return cs
}

func ExampleServerMiddleware() {
	store, err := memory.New(nil) // or postgres.New, redis.New
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	// Every key is the verified user's: one user's key never reaches
	// another's result.
	idem, err := mcpidem.ServerMiddleware(runner, mcpidem.WithScope(mcpidem.TokenScope))
	if err != nil {
		panic(err)
	}
	server := paymentsServer()
	server.AddReceivingMiddleware(idem)
	srv := serveWithTokens(server, map[string]string{"token-of-ann": "ann"})
	defer srv.Close()

	cs := agentSession(srv.URL, "token-of-ann")
	defer cs.Close()
	call := &mcp.CallToolParams{
		Name:      "charge",
		Arguments: chargeArgs{Amount: 1000, To: "bookshop"},
		Meta:      mcp.Meta{mcpidem.DefaultKeyMeta: "order-7-payment"}, // one key per intent
	}
	for range 2 { // a call and its retry
		res, err := cs.CallTool(context.Background(), call)
		fmt.Println(res.StructuredContent, res.Meta[mcpidem.DefaultReplayMeta], err)
	}
	// The same key with other arguments is refused, never replayed.
	call.Arguments = chargeArgs{Amount: 2000, To: "bookshop"}
	_, err = cs.CallTool(context.Background(), call)
	var je *jsonrpc.Error
	fmt.Println(errors.As(err, &je) && je.Code == mcpidem.CodeKeyReused, mcpidem.ReasonOf(err))
	// Output:
	// charging 1000 to bookshop
	// map[charge:ch_1] <nil> <nil>
	// map[charge:ch_1] true <nil>
	// true IDEMPOTENCY_KEY_REUSED
}

func ExampleClientMiddleware() {
	runner, err := idempotency.New(memStore(nil))
	if err != nil {
		panic(err)
	}
	idem, err := mcpidem.ServerMiddleware(runner, mcpidem.WithScope(mcpidem.TokenScope))
	if err != nil {
		panic(err)
	}
	server := paymentsServer()
	server.AddReceivingMiddleware(idem)
	srv := serveWithTokens(server, map[string]string{"token-of-ann": "ann"})
	defer srv.Close()

	// Every CallTool through the client gets a key of its own, kept for
	// its retries: a lost answer or a call in progress is retried with
	// backoff, waiting at least the server's hint, and gets the first
	// attempt's result.
	retry, err := mcpidem.ClientMiddleware(mcpidem.WithMaxAttempts(5))
	if err != nil {
		panic(err)
	}
	cs := agentSession(srv.URL, "token-of-ann", retry)
	defer cs.Close()
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: chargeArgs{Amount: 500, To: "cafe"}})
	fmt.Println(res.StructuredContent, err)
	// An agent that re-plans and calls the tool again for the same intent
	// passes the intent's key; a new intent gets a new key.
	key := mcpidem.NewKey()
	for range 2 {
		res, err = cs.CallTool(mcpidem.WithKey(ctx, key), &mcp.CallToolParams{Name: "charge", Arguments: chargeArgs{Amount: 700, To: "cinema"}})
		fmt.Println(res.StructuredContent, err)
	}
	// A permanent tool error is the tool's answer: stored, replayed, never
	// retried.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: chargeArgs{Amount: -1, To: "cinema"}})
	fmt.Println(res.IsError, res.Content[0].(*mcp.TextContent).Text, err)
	// Output:
	// charging 500 to cafe
	// map[charge:ch_1] <nil>
	// charging 700 to cinema
	// map[charge:ch_2] <nil>
	// map[charge:ch_2] <nil>
	// true the amount must be positive <nil>
}
