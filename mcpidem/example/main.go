// Command example is an MCP server exposing a charge tool behind the
// mcpidem server middleware, and an agent calling it through the client
// middleware over a flaky connection that loses answers after the server
// has made them: every intent is charged once. The same agent then retries
// the same way without idempotency keys, against the same server without
// the middleware, to show what the middleware prevents.
//
//	go run github.com/exactlyonce/idempotency/mcpidem/example
//
// (or go run ./mcpidem/example in the repository). Everything runs in one
// process on loopback, on the in-memory store; -intents, -lose and -seed
// change the run. It exits with status 1 if an intent with a key was
// charged other than once.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/mcpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

func main() {
	var cfg config
	flag.IntVar(&cfg.intents, "intents", 12, "payments the agent decides to make")
	flag.Float64Var(&cfg.lose, "lose", 0.4, "probability that the connection loses a tool call's answer")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the flaky connection")
	flag.Parse()
	ok, err := run(os.Stdout, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

type config struct {
	intents int
	lose    float64
	seed    uint64
}

// A report is what one agent run saw.
type report struct {
	attempts, lost int
	charges        map[string]int // order -> charges made
	failed         int            // intents that got no result
}

// run plays the scenario twice, with and without idempotency, and reports
// whether every intent of the first was charged exactly once.
func run(w io.Writer, cfg config) (bool, error) {
	fmt.Fprintf(w, "an agent makes %d payments through a connection that loses %.0f%% of the answers\n\n", cfg.intents, 100*cfg.lose)
	with, err := play(w, cfg, true)
	if err != nil {
		return false, err
	}
	without, err := play(io.Discard, cfg, false)
	if err != nil {
		return false, err
	}
	ok := with.failed == 0
	for _, n := range with.charges {
		ok = ok && n == 1
	}
	fmt.Fprintf(w, "\nwith mcpidem:     %s\n", with.summary(cfg.intents))
	fmt.Fprintf(w, "without (the same retries, no keys, no middleware): %s\n", without.summary(cfg.intents))
	if ok {
		fmt.Fprintln(w, "\nok: with mcpidem every intent was charged exactly once")
	} else {
		fmt.Fprintln(w, "\nFAIL: with mcpidem an intent was charged other than once")
	}
	return ok, nil
}

func (r report) summary(intents int) string {
	total, twice := 0, 0
	for _, n := range r.charges {
		total += n
		if n > 1 {
			twice++
		}
	}
	return fmt.Sprintf("%d attempts (%d answers lost), %d charges for %d intents, %d intents charged more than once, %d without a result",
		r.attempts, r.lost, total, intents, twice, r.failed)
}

// play runs the payments server (with the middleware, or without) and the
// agent (with the client middleware, or retrying by hand) once.
func play(w io.Writer, cfg config, idem bool) (report, error) {
	gw := &gateway{charges: map[string]int{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "charge", Description: "Charges the user's card for an order."}, gw.charge)
	if idem {
		store, err := memory.New(nil) // or postgres.New, redis.New: a store that outlives the process
		if err != nil {
			return report{}, err
		}
		runner, err := idempotency.New(store)
		if err != nil {
			return report{}, err
		}
		mw, err := mcpidem.ServerMiddleware(runner, mcpidem.WithScope(mcpidem.TokenScope))
		if err != nil {
			return report{}, err
		}
		server.AddReceivingMiddleware(mw)
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verifyToken, nil)(
		mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true})))
	defer srv.Close()

	link := &flaky{base: http.DefaultTransport, lose: cfg.lose, rng: rand.New(rand.NewPCG(cfg.seed, 0))}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	if idem {
		retry, err := mcpidem.ClientMiddleware(mcpidem.WithMaxAttempts(8), mcpidem.WithBackoff(5*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			return report{}, err
		}
		client.AddSendingMiddleware(retry)
	}
	ctx := context.Background()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL,
		HTTPClient: &http.Client{Transport: bearer{"token-of-ann", link}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return report{}, err
	}
	defer cs.Close()

	var r report
	for i := 1; i <= cfg.intents; i++ {
		order := fmt.Sprintf("order-%d", i)
		call := &mcp.CallToolParams{Name: "charge", Arguments: chargeArgs{Order: order, AmountCents: 100 * i, Merchant: "bookshop"}}
		var res *mcp.CallToolResult
		if idem {
			res, err = cs.CallTool(ctx, call) // the middleware retries, with the call's one key
		} else {
			for range 8 { // what an agent loop does without keys: call again
				if res, err = cs.CallTool(ctx, call); err == nil {
					break
				}
			}
		}
		if err != nil {
			r.failed++
			fmt.Fprintf(w, "%-9s no result: %v\n", order, err)
			continue
		}
		var out chargeOut
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
		replayed, _ := res.Meta[mcpidem.DefaultReplayMeta].(bool)
		fmt.Fprintf(w, "%-9s %s after %d attempt(s), replayed: %v\n", order, out.Charge, link.attemptsOf(order), replayed)
	}
	r.attempts, r.lost = link.totals()
	r.charges = gw.snapshot()
	return r, nil
}

type chargeArgs struct {
	Order       string `json:"order" jsonschema:"the order to pay"`
	AmountCents int    `json:"amount_cents" jsonschema:"the amount, in cents"`
	Merchant    string `json:"merchant" jsonschema:"who is paid"`
}

type chargeOut struct {
	Charge string `json:"charge"`
}

// gateway is the payment gateway the charge tool calls: every call is a
// charge.
type gateway struct {
	mu      sync.Mutex
	n       int
	charges map[string]int
}

func (g *gateway) charge(ctx context.Context, _ *mcp.CallToolRequest, in chargeArgs) (*mcp.CallToolResult, chargeOut, error) {
	if in.AmountCents <= 0 {
		return nil, chargeOut{}, idempotency.Permanent(errors.New("the amount must be positive"))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n++
	g.charges[in.Order]++
	return nil, chargeOut{Charge: fmt.Sprintf("ch_%03d", g.n)}, nil
}

func (g *gateway) snapshot() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := make(map[string]int, len(g.charges))
	for k, v := range g.charges {
		m[k] = v
	}
	return m
}

// verifyToken is the server's bearer-token check: one agent, acting for
// ann.
func verifyToken(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	if token != "token-of-ann" {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: "ann", Expiration: time.Now().Add(time.Hour)}, nil
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

// flaky is the agent's connection: it loses the answer of a tool call with
// probability lose, after the server has made it.
type flaky struct {
	base     http.RoundTripper
	lose     float64
	mu       sync.Mutex
	rng      *rand.Rand
	attempts map[string]int
	total    int
	lost     int
}

func (f *flaky) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Arguments struct {
				Order string `json:"order"`
			} `json:"arguments"`
		} `json:"params"`
	}
	json.Unmarshal(body, &msg)
	resp, err := f.base.RoundTrip(r)
	if err != nil || msg.Method != "tools/call" {
		return resp, err
	}
	f.mu.Lock()
	if f.attempts == nil {
		f.attempts = map[string]int{}
	}
	f.attempts[msg.Params.Arguments.Order]++
	f.total++
	lose := f.rng.Float64() < f.lose
	if lose {
		f.lost++
	}
	f.mu.Unlock()
	if !lose {
		return resp, nil
	}
	io.Copy(io.Discard, resp.Body) // the server made its answer...
	resp.Body.Close()
	return nil, errors.New("read: connection reset by peer") // ...and it was lost
}

func (f *flaky) attemptsOf(order string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts[order]
}

func (f *flaky) totals() (attempts, lost int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total, f.lost
}
