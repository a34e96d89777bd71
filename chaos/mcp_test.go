package chaos_test

// The MCP edge's fault trials (issue 29): the payments service of
// internal/paysvc serves its charge tool over streamable HTTP behind the
// mcpidem middleware, on PostgreSQL, and agents call it through mcpidem's
// client middleware. The harness SIGKILLs the service at each phase of a
// call (or lets the store black-hole), restarts it on the same port and
// lets the agents retry: each intent gets one charge, the one every agent
// is told of.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/mcpidem"
	idempg "github.com/exactlyonce/idempotency/store/postgres"
)

// mcpScope is the scope paysvc's MCP edge gives every call.
var mcpScope = []string{"chaos", "tools/call charge"}

func TestMCPProcessKill(t *testing.T) {
	pgURL := killEnv(t, "IDEM_POSTGRES_URL")
	bin := killBuild(t)
	pool := killPool(t, pgURL)
	run := fmt.Sprintf("chaosmcp_%d_%08x", os.Getpid(), rand.Uint32())

	// The control: without the gateway's de-duplication by downstream key,
	// a kill between the charge and its recovery point must show up as a
	// second charge, or the trials below could not see one either.
	t.Run("control", func(t *testing.T) {
		ledger := run + "_control_ledger"
		killCreateLedger(t, pool, ledger)
		table := run + "_control_keys"
		killPGStore(t, pool, table)
		args := []string{"-edge", "mcp", "-mode", "pg-do", "-table", table, "-postgres", pgURL, "-ledger", ledger,
			"-lease", killLease.String(), "-hooks", "-unsafe-no-downstream-dedup"}
		answers, key, kills := mcpKillTrial(t, bin, args, 1, killEffectUnrecorded)
		charges := killLedgerRows(t, context.Background(), pool, ledger, []string{key})[key]
		a := answers[0]
		if kills != 1 || a.err != nil || len(charges) != 2 || a.payment != charges[1].id || charges[1].fence <= charges[0].fence {
			t.Errorf("%d kills, answer %+v, charges %+v: want 2 charges, the second with a greater fence and told to the agent", kills, a, charges)
		}
	})

	for _, mode := range []string{"pg-do", "pg-tx"} {
		t.Run(mode, func(t *testing.T) {
			name := run + "_" + map[string]string{"pg-do": "do", "pg-tx": "tx"}[mode]
			ledger, table := name+"_ledger", name+"_keys"
			killCreateLedger(t, pool, ledger)
			store := killPGStore(t, pool, table)
			inspect, err := idempotency.New(store) // never runs fn
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"-edge", "mcp", "-mode", mode, "-table", table, "-postgres", pgURL, "-ledger", ledger,
				"-lease", killLease.String(), "-hooks"}
			points := []string{killBeforeEffect, killEffectUnrecorded, killAfterEffect, killAfterCompletion}
			if mode == "pg-tx" {
				points = []string{killBeforeEffect, killAfterEffect, killAfterCompletion}
			}
			for _, point := range points {
				t.Run(point, func(t *testing.T) {
					answers, key, kills := mcpKillTrial(t, bin, args, 2, point)
					if kills != 1 {
						t.Errorf("%d kills at %s, want 1", kills, point)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					charges := killLedgerRows(t, ctx, pool, ledger, []string{key})[key]
					if len(charges) != 1 {
						t.Fatalf("%d charges %+v, want 1", len(charges), charges)
					}
					for i, a := range answers {
						if a.err != nil || a.payment != charges[0].id {
							t.Errorf("agent %d: payment %d, error %v; want payment %d", i, a.payment, a.err, charges[0].id)
						}
					}
					info, err := inspect.Inspect(ctx, idempotency.Request{Scope: mcpScope, Key: key}, false)
					if err != nil || info.State != idempotency.StateCompleted {
						t.Errorf("the key is %+v (%v) after every agent got its answer, want completed", info, err)
					}
					t.Logf("charge %+v; the record's attempt %d, fence %d", charges[0], info.Attempt, info.Fence)
				})
			}
		})
	}
}

// mcpKillTrial starts the service with a kill planned at point, has agents
// agents call the charge tool for one intent (the second 0-20 ms after
// the first, a double click), restarts the service on the same address
// after each kill until every agent has its answer, and returns the
// answers, the intent's key and how many kills there were.
func mcpKillTrial(t *testing.T, bin string, args []string, agents int, point string) ([]killAnswer, string, int) {
	key := mcpidem.NewKey()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := killStart(t, bin, args, "127.0.0.1:0", &killPlan{point: point})
	addr := p.addr
	answers := make([]killAnswer, agents)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * time.Duration(rand.Int64N(int64(20*time.Millisecond))))
			answers[i] = mcpCharge(ctx, "http://"+addr+"/mcp", key)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	kills := 0
	for {
		select {
		case <-p.exited:
		case <-done:
			p.stop()
		}
		if p.killed().IsZero() {
			select {
			case <-done:
			default:
				t.Fatalf("the service exited on its own: %v\n%s", p.err, p.stderr.String())
			}
			return answers, key, kills
		}
		kills++
		p = killStart(t, bin, args, addr, nil)
		defer func(p *killProc) {
			if s := p.stderr.String(); s != "" {
				t.Logf("the restarted service's stderr:\n%s", s)
			}
		}(p)
	}
}

// mcpCharge is an agent: it calls the charge tool through the client
// middleware with the intent's key, and returns its answer. A tool error
// (the charge failed: the key was released) is the model's to read, which
// the client middleware leaves to it; this agent calls again for the same
// intent, with its key, as an agent loop does.
func mcpCharge(ctx context.Context, endpoint, key string) killAnswer {
	retry, err := mcpidem.ClientMiddleware(mcpidem.WithMaxAttempts(400), mcpidem.WithMaxElapsed(30*time.Second),
		mcpidem.WithBackoff(5*time.Millisecond, 50*time.Millisecond), mcpidem.WithAttemptTimeout(10*time.Second))
	if err != nil {
		return killAnswer{err: err}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	client.AddSendingMiddleware(retry)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, DisableStandaloneSSE: true,
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}, nil)
	if err != nil {
		return killAnswer{err: err, at: time.Now()}
	}
	defer cs.Close()
	var a killAnswer
	for range 20 {
		res, err := cs.CallTool(mcpidem.WithKey(ctx, key), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 100}})
		a = killAnswer{at: time.Now(), err: err}
		if err == nil {
			a.payment, a.err = mcpPayment(res)
		}
		if err != nil || !res.IsError {
			return a
		}
	}
	return a
}

// mcpPayment reads the charge tool's result.
func mcpPayment(res *mcp.CallToolResult) (int64, error) {
	if res.IsError {
		var text string
		if len(res.Content) > 0 {
			if c, ok := res.Content[0].(*mcp.TextContent); ok {
				text = c.Text
			}
		}
		return 0, fmt.Errorf("tool error: %s", text)
	}
	var v struct{ Payment int64 }
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	return v.Payment, err
}

// A store that stops answering (a black hole between the service and
// PostgreSQL) gives the agent CodeStoreUnavailable with a retry hint,
// within the store timeout's bound, and no charge; the client middleware
// retries it, and once the store is back the call runs once.
func TestMCPStoreDown(t *testing.T) {
	url := srvEnv(t, "IDEM_POSTGRES_URL")
	direct := netPool(t, url, nil)
	px := srvToxiproxy(t, "postgres-mcp", netHostPort(t, direct.Config().ConnConfig.Host, direct.Config().ConnConfig.Port))
	table := "chaos_mcp_" + srvRunID(t) + "_keys"
	killPGStore(t, direct, table)
	store, err := idempg.New(netPool(t, url, px), &idempg.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	runner := netRunner(t, store)
	idem, err := mcpidem.ServerMiddleware(runner, mcpidem.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	var charges atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "charge"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, map[string]int64, error) {
		return nil, map[string]int64{"payment": charges.Add(1)}, nil
	})
	server.AddReceivingMiddleware(idem)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(srv.Close)
	connect := func(mw ...mcp.Middleware) *mcp.ClientSession {
		c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
		c.AddSendingMiddleware(mw...)
		cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	call := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{}}
	ctx := mcpidem.WithKey(context.Background(), mcpidem.NewKey())

	px.Add(srvToxic{Name: "down", Type: "timeout", Stream: "upstream", Attributes: map[string]int{"timeout": 0}})
	plain := connect()
	start := time.Now()
	_, err = plain.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{},
		Meta: mcp.Meta{mcpidem.DefaultKeyMeta: "while-down"}})
	took := time.Since(start)
	d, ok := mcpidem.DataOf(err)
	if !ok || d.Reason != mcpidem.ReasonStoreUnavailable || d.RetryAfterMs <= 0 {
		t.Fatalf("while the store is down: %v (data %+v), want %s with a retry hint", err, d, mcpidem.ReasonStoreUnavailable)
	}
	bound := time.Duration(netAttempts)*netStoreTimeout + 2*time.Second
	if took > bound {
		t.Errorf("the answer took %v, more than the store calls' bound %v", took, bound)
	}

	var seen struct {
		mu      sync.Mutex
		reasons []string
	}
	spy := func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if method == "tools/call" {
				seen.mu.Lock()
				seen.reasons = append(seen.reasons, mcpidem.ReasonOf(err))
				seen.mu.Unlock()
			}
			return res, err
		}
	}
	retry, err := mcpidem.ClientMiddleware(mcpidem.WithMaxAttempts(50), mcpidem.WithMaxElapsed(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	agent := connect(retry, spy)
	time.AfterFunc(2*time.Second, px.Clear)
	res, err := agent.CallTool(ctx, call)
	if err != nil {
		t.Fatalf("after the store came back: %v (attempts: %q)", err, seen.reasons)
	}
	payment, err := mcpPayment(res)
	if err != nil || payment != 1 || charges.Load() != 1 {
		t.Errorf("payment %d (%v), %d charges; want payment 1, one charge", payment, err, charges.Load())
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if n := len(seen.reasons); n < 2 || seen.reasons[0] != mcpidem.ReasonStoreUnavailable || seen.reasons[n-1] != "" {
		t.Errorf("attempts answered %q, want %s until the store was back, then the result", seen.reasons, mcpidem.ReasonStoreUnavailable)
	}
	t.Logf("attempts answered %q; the first answer while down took %v", seen.reasons, took.Round(time.Millisecond))
}
