package mcpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/mcpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// memStore is memory.New for options the test knows to be valid.
func memStore(opts *memory.Options) *memory.Store {
	s, err := memory.New(opts)
	if err != nil {
		panic(err)
	}
	return s
}

func newRunner(t testing.TB, store idempotency.Store, opts ...idempotency.Option) *idempotency.Runner {
	t.Helper()
	r, err := idempotency.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// chargeIn is the charge tool's arguments.
type chargeIn struct {
	Amount int    `json:"amount"`
	To     string `json:"to,omitempty"`
	// Key is the key argument of the pay tool, which declares it.
	Key string `json:"idempotency_key,omitempty"`
}

type chargeOut struct {
	Charge int64  `json:"charge"`
	Amount int    `json:"amount"`
	To     string `json:"to"`
	Fence  int64  `json:"fence"`
}

// bank is the tools' world: every effect is a charge, numbered.
type bank struct {
	charges atomic.Int64 // effects of charge and pay
	runs    atomic.Int64 // runs of every tool (effects or not)
	// hold, if set, is received from by charge before its effect, so that
	// a test holds calls in flight.
	hold chan struct{}
	// entered is signalled (without blocking) when charge starts.
	entered chan struct{}
	// fail is what the flaky tool answers: "transient", "permanent" or
	// "protocol" (a JSON-RPC error).
	fail atomic.Value
}

func newBank() *bank {
	b := &bank{entered: make(chan struct{}, 100)}
	b.fail.Store("transient")
	return b
}

func (b *bank) charge(ctx context.Context, req *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, chargeOut, error) {
	b.runs.Add(1)
	select {
	case b.entered <- struct{}{}:
	default:
	}
	if b.hold != nil {
		select {
		case <-b.hold:
		case <-ctx.Done():
			return nil, chargeOut{}, ctx.Err()
		}
	}
	if in.Amount <= 0 {
		return nil, chargeOut{}, idempotency.Permanent(errors.New("the amount must be positive"))
	}
	info, _ := idempotency.FromContext(ctx)
	n := b.charges.Add(1)
	return nil, chargeOut{Charge: n, Amount: in.Amount, To: in.To, Fence: info.Fence}, nil
}

// waitEntered waits until a call enters charge.
func (b *bank) waitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-b.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no call reached the tool")
	}
}

// newServer returns an MCP server with the test tools behind the server
// middleware made with opts (none: no middleware).
func newServer(t testing.TB, b *bank, exec idempotency.Executor, opts ...mcpidem.Option) *mcp.Server {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "bank", Version: "v1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "charge", Description: "charges a card"}, b.charge)
	mcp.AddTool(s, &mcp.Tool{Name: "pay", Description: "charges a card, keyed by an argument",
		Meta: mcp.Meta{mcpidem.KeyArgumentMeta: "idempotency_key"}}, b.charge)
	mcp.AddTool(s, &mcp.Tool{Name: "balance", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, map[string]int64, error) {
			b.runs.Add(1)
			return nil, map[string]int64{"charges": b.charges.Load()}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "set_limit", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct {
			Limit int `json:"limit,omitempty"`
		}) (*mcp.CallToolResult, any, error) {
			b.runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "flaky"},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			n := b.runs.Add(1)
			switch b.fail.Load() {
			case "permanent":
				return nil, nil, idempotency.Permanent(fmt.Errorf("card declined (run %d)", n))
			case "protocol":
				return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no such card"}
			}
			return nil, nil, fmt.Errorf("gateway timeout (run %d)", n)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "big"},
		func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
			Size int `json:"size,omitempty"`
		}) (*mcp.CallToolResult, any, error) {
			b.runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", in.Size)}}}, nil, nil
		})
	if exec != nil {
		idem, err := mcpidem.ServerMiddleware(exec, opts...)
		if err != nil {
			t.Fatal(err)
		}
		s.AddReceivingMiddleware(idem)
	}
	return s
}

// connect connects a client (with the given sending middleware) to s over
// the SDK's in-memory transport.
func connect(t testing.TB, s *mcp.Server, mw ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	c.AddSendingMiddleware(mw...)
	cs, err := c.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// serveHTTP serves s over streamable HTTP on loopback, behind the SDK's
// bearer-token middleware that knows the tokens of tokens (token -> user).
// It returns the endpoint.
func serveHTTP(t testing.TB, s *mcp.Server, tokens map[string]string) string {
	t.Helper()
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: true})
	if tokens != nil {
		verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
			user, ok := tokens[token]
			if !ok {
				return nil, auth.ErrInvalidToken
			}
			return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
		}
		h = auth.RequireBearerToken(verify, nil)(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// connectHTTP connects a client to endpoint over streamable HTTP, with
// token as its bearer token ("" for none) and rt under it (nil: the
// default transport).
func connectHTTP(t testing.TB, endpoint, token string, rt http.RoundTripper, mw ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	if rt == nil {
		rt = http.DefaultTransport
	}
	if token != "" {
		rt = bearer{token: token, base: rt}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	c.AddSendingMiddleware(mw...)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: endpoint, HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// keyed returns params of a call of tool with args and key in its _meta
// ("" for none).
func keyed(tool, key string, args any) *mcp.CallToolParams {
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{mcpidem.DefaultKeyMeta: key}
	}
	return p
}

// out decodes a charge's structured result.
func out(t testing.TB, res *mcp.CallToolResult) chargeOut {
	t.Helper()
	if res == nil || res.IsError {
		t.Fatalf("result %+v, want a charge", res)
	}
	var o chargeOut
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &o)
	}
	if err != nil {
		t.Fatalf("structured content %v: %v", res.StructuredContent, err)
	}
	return o
}

func replayed(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[mcpidem.DefaultReplayMeta].(bool)
	return v
}

// wantError fails unless err is the middleware's answer with code and
// reason.
func wantError(t testing.TB, err error, code int64, reason string) mcpidem.ErrorData {
	t.Helper()
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("err = %v, want JSON-RPC code %d (%s)", err, code, reason)
	}
	d, ok := mcpidem.DataOf(err)
	if !ok || d.Reason != reason || d.Domain != mcpidem.ErrorDomain {
		t.Fatalf("err = %v: data %+v (%v), want reason %s in domain %s", err, d, ok, reason, mcpidem.ErrorDomain)
	}
	return d
}

// failingStore is a store that cannot be reached: every claim fails.
type failingStore struct {
	*memory.Store
	claims atomic.Int64
}

func (s *failingStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.claims.Add(1)
	return idempotency.ClaimResult{}, errors.New("dial tcp 127.0.0.1:1: connection refused")
}

// sleeps records the client middleware's waits instead of sleeping them.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}
