package mcpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"

	"github.com/exactlyonce/idempotency/mcpidem"
)

// A retry with the same key gets the first call's CallToolResult, the
// same JSON but for the replay mark in its _meta, and the tool does not
// run again.
func TestReplayIsTheStoredResult(t *testing.T) {
	b := newBank()
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace()))
	ctx := context.Background()
	first, err := cs.CallTool(ctx, keyed("charge", "k1", map[string]any{"amount": 5, "to": "ann"}))
	if err != nil {
		t.Fatal(err)
	}
	// The same arguments in another order and spelling: the same call.
	again, err := cs.CallTool(ctx, keyed("charge", "k1", json.RawMessage(`{"to":"ann","amount":5.0}`)))
	if err != nil {
		t.Fatal(err)
	}
	if replayed(first) || !replayed(again) {
		t.Errorf("replay marks: first %v, again %v; want false, true", first.Meta, again.Meta)
	}
	if n := b.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
	delete(again.Meta, mcpidem.DefaultReplayMeta)
	j1, _ := json.Marshal(first)
	j2, _ := json.Marshal(again)
	if string(j1) != string(j2) {
		t.Errorf("replayed result differs:\n first %s\n again %s", j1, j2)
	}
	t.Logf("%s", j1)
}

// Ten concurrent calls of one intent (one key, the same arguments) make
// one charge, over the in-memory transport and over streamable HTTP: the
// first runs the tool, the others get CodeInProgress, which the client
// middleware retries with the server's hint until the result is stored,
// and then get it replayed.
func TestConcurrentDuplicatesOneEffect(t *testing.T) {
	for _, transport := range []string{"in-memory", "streamable HTTP"} {
		t.Run(transport, func(t *testing.T) {
			b := newBank()
			b.hold = make(chan struct{})
			s := newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace())
			retry, err := mcpidem.ClientMiddleware(mcpidem.WithBackoff(time.Millisecond, 20*time.Millisecond),
				mcpidem.WithMaxAttempts(1000), mcpidem.WithMaxElapsed(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var cs *mcp.ClientSession
			if transport == "in-memory" {
				cs = connect(t, s, retry)
			} else {
				cs = connectHTTP(t, serveHTTP(t, s, nil), "", nil, retry)
			}
			const n = 10
			ctx := mcpidem.WithKey(context.Background(), mcpidem.NewKey())
			results := make([]*mcp.CallToolResult, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], errs[i] = cs.CallTool(ctx, keyed("charge", "", map[string]any{"amount": 7, "to": "bob"}))
				}()
			}
			select {
			case <-b.entered:
			case <-time.After(10 * time.Second):
				close(b.hold)
				wg.Wait()
				t.Fatalf("no call reached the tool: %v", errs)
			}
			time.Sleep(50 * time.Millisecond) // the duplicates meet the held call
			close(b.hold)
			wg.Wait()
			fresh := 0
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("call %d: %v", i, errs[i])
				}
				if o := out(t, results[i]); o.Charge != 1 || o.Amount != 7 {
					t.Errorf("call %d: %+v, want charge 1 of 7", i, o)
				}
				if !replayed(results[i]) {
					fresh++
				}
			}
			if got := b.charges.Load(); got != 1 || fresh != 1 || b.runs.Load() != 1 {
				t.Errorf("%d charges, %d runs, %d fresh results; want 1, 1, 1", got, b.runs.Load(), fresh)
			}
		})
	}
}

// While a call runs, a second one with its key gets CodeInProgress with
// the time left on the lease as its hint, clamped to WithMaxRetryAfter.
func TestInProgressAnswer(t *testing.T) {
	b := newBank()
	b.hold = make(chan struct{})
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(),
		mcpidem.WithMaxRetryAfter(300*time.Millisecond)))
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 1}))
		done <- err
	}()
	b.waitEntered(t)
	_, err := cs.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 1}))
	d := wantError(t, err, mcpidem.CodeInProgress, mcpidem.ReasonInProgress)
	if d.RetryAfterMs != 300 || d.Replayed {
		t.Errorf("data %+v, want retryAfterMs 300 (the 30s lease clamped), not replayed", d)
	}
	if got, ok := mcpidem.RetryDelay(err); !ok || got != 300*time.Millisecond {
		t.Errorf("RetryDelay = %v, %v", got, ok)
	}
	close(b.hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A key reused with other arguments, or for another tool, is refused and
// the tool does not run.
func TestKeyReusedForAnotherCall(t *testing.T) {
	b := newBank()
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace()))
	ctx := context.Background()
	if _, err := cs.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 5, "to": "ann"})); err != nil {
		t.Fatal(err)
	}
	_, err := cs.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 50, "to": "ann"}))
	wantError(t, err, mcpidem.CodeKeyReused, mcpidem.ReasonKeyReused)
	_, err = cs.CallTool(ctx, keyed("pay", "k", map[string]any{"amount": 5, "to": "ann"}))
	wantError(t, err, mcpidem.CodeKeyReused, mcpidem.ReasonKeyReused)
	if n := b.runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

// A managed tool called without a key is refused, unless the server opts
// it out by name; tools annotated read-only or idempotent are not managed.
func TestWhichCallsAreManaged(t *testing.T) {
	b := newBank()
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(),
		mcpidem.WithRequired(func(_ context.Context, tool string) bool { return tool != "big" })))
	ctx := context.Background()
	_, err := cs.CallTool(ctx, keyed("charge", "", map[string]any{"amount": 5}))
	wantError(t, err, mcpidem.CodeKeyMissing, mcpidem.ReasonKeyMissing)
	_, err = cs.CallTool(ctx, keyed("pay", "", map[string]any{"amount": 5}))
	d := wantError(t, err, mcpidem.CodeKeyMissing, mcpidem.ReasonKeyMissing)
	if !strings.Contains(err.Error(), "idempotency_key") {
		t.Errorf("%v (%+v): the message does not name the tool's key argument", err, d)
	}
	if n := b.runs.Load(); n != 0 {
		t.Fatalf("%d runs of refused calls", n)
	}
	for range 2 {
		for tool, key := range map[string]string{"balance": "same-key", "set_limit": "same-key", "big": ""} {
			res, err := cs.CallTool(ctx, keyed(tool, key, map[string]any{}))
			if err != nil || res.IsError || replayed(res) {
				t.Fatalf("%s: %+v, %v; want a fresh result", tool, res, err)
			}
		}
	}
	if n := b.runs.Load(); n != 6 {
		t.Errorf("%d runs, want 6: unmanaged tools, and calls without a key opted out, run every time", n)
	}
	// WithTools manages a tool whatever its annotations say.
	b2 := newBank()
	cs2 := connect(t, newServer(t, b2, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(), mcpidem.WithTools("balance")))
	for range 2 {
		if _, err := cs2.CallTool(ctx, keyed("balance", "k", map[string]any{})); err != nil {
			t.Fatal(err)
		}
		if _, err := cs2.CallTool(ctx, keyed("charge", "", map[string]any{"amount": 1})); err != nil {
			t.Fatalf("charge, not among WithTools: %v", err)
		}
	}
	if n := b2.runs.Load(); n != 3 {
		t.Errorf("%d runs, want 3 (balance once, charge twice)", n)
	}
	// An unknown tool passes through, and the server refuses it.
	if _, err := cs.CallTool(ctx, keyed("nope", "k", nil)); err == nil || mcpidem.ReasonOf(err) != "" {
		t.Errorf("unknown tool: %v, want the SDK's error", err)
	}
}

// The key of a tool that declares a key argument comes from that
// argument when the call has it, also over a _meta key; a key that is
// not a string, or breaks the rules, is refused.
func TestKeys(t *testing.T) {
	b := newBank()
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(),
		mcpidem.WithKeyValidator(func(k string) error {
			if strings.HasPrefix(k, "bad") {
				return errors.New("keys never start with bad")
			}
			return nil
		})))
	ctx := context.Background()
	args := map[string]any{"amount": 3, "to": "cy", "idempotency_key": "intent-1"}
	if _, err := cs.CallTool(ctx, keyed("pay", "", args)); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, keyed("pay", "meta-key-of-this-attempt", args))
	if err != nil || !replayed(res) {
		t.Fatalf("%+v, %v: want the argument's key to win and replay", res, err)
	}
	for _, tc := range []struct {
		name string
		p    *mcp.CallToolParams
	}{
		{"a number in _meta", &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 1},
			Meta: mcp.Meta{mcpidem.DefaultKeyMeta: 42}}},
		{"a number as the argument", keyed("pay", "", map[string]any{"amount": 1, "idempotency_key": 42})},
		{"empty", keyed("charge", "", map[string]any{"amount": 1})},
		{"too long", keyed("charge", strings.Repeat("k", 256), map[string]any{"amount": 1})},
		{"a control character", keyed("charge", "k\x01", map[string]any{"amount": 1})},
		{"refused by the validator", keyed("charge", "bad-1", map[string]any{"amount": 1})},
	} {
		if tc.name == "empty" {
			tc.p.Meta = mcp.Meta{mcpidem.DefaultKeyMeta: ""}
		}
		_, err := cs.CallTool(ctx, tc.p)
		wantError(t, err, mcpidem.CodeKeyMalformed, mcpidem.ReasonKeyMalformed)
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

// A tool error the tool marks permanent is stored and replayed; a
// transient one, and a JSON-RPC error, release the key, so the retry runs
// the tool again.
func TestToolErrors(t *testing.T) {
	b := newBank()
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace()))
	ctx := context.Background()
	call := func(key string) (*mcp.CallToolResult, error) { return cs.CallTool(ctx, keyed("flaky", key, nil)) }

	for i := 1; i <= 2; i++ { // transient: runs every time
		res, err := call("t")
		if err != nil || !res.IsError || replayed(res) {
			t.Fatalf("transient, call %d: %+v, %v", i, res, err)
		}
	}
	b.fail.Store("protocol")
	for i := 1; i <= 2; i++ {
		if _, err := call("p"); err == nil || mcpidem.ReasonOf(err) != "" || !strings.Contains(err.Error(), "no such card") {
			t.Fatalf("protocol error, call %d: %v", i, err)
		}
	}
	if n := b.runs.Load(); n != 4 {
		t.Fatalf("%d runs, want 4", n)
	}
	b.fail.Store("permanent")
	first, err := call("d")
	if err != nil || !first.IsError {
		t.Fatalf("permanent: %+v, %v", first, err)
	}
	b.fail.Store("transient") // the state changed: the retry must not see it
	again, err := call("d")
	if err != nil || !again.IsError || !replayed(again) {
		t.Fatalf("permanent, again: %+v, %v; want the stored tool error", again, err)
	}
	if first.Content[0].(*mcp.TextContent).Text != again.Content[0].(*mcp.TextContent).Text {
		t.Errorf("replayed %v, want %v", again.Content[0], first.Content[0])
	}
	if n := b.runs.Load(); n != 5 {
		t.Errorf("%d runs, want 5", n)
	}
}

// A result larger than WithMaxResponseSize reaches its caller; retries
// get CodeResponseNotStored, marked replayed, and the tool does not run
// again.
func TestResultTooLargeToStore(t *testing.T) {
	b := newBank()
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(), mcpidem.WithMaxResponseSize(1000)))
	ctx := context.Background()
	res, err := cs.CallTool(ctx, keyed("big", "k", map[string]any{"size": 2000}))
	if err != nil || len(res.Content[0].(*mcp.TextContent).Text) != 2000 {
		t.Fatalf("%v, %v", res, err)
	}
	_, err = cs.CallTool(ctx, keyed("big", "k", map[string]any{"size": 2000}))
	if d := wantError(t, err, mcpidem.CodeResponseNotStored, mcpidem.ReasonResponseNotStored); !d.Replayed {
		t.Errorf("data %+v: not marked replayed", d)
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

// A store that cannot be reached gives CodeStoreUnavailable with a retry
// hint, and the tool does not run.
func TestStoreDown(t *testing.T) {
	b := newBank()
	fs := &failingStore{Store: memStore(nil)}
	cs := connect(t, newServer(t, b, newRunner(t, fs), mcpidem.WithSharedKeySpace()))
	_, err := cs.CallTool(context.Background(), keyed("charge", "k", map[string]any{"amount": 1}))
	d := wantError(t, err, mcpidem.CodeStoreUnavailable, mcpidem.ReasonStoreUnavailable)
	if d.RetryAfterMs != 1000 {
		t.Errorf("retryAfterMs %d, want 1000", d.RetryAfterMs)
	}
	if b.runs.Load() != 0 || fs.claims.Load() == 0 {
		t.Errorf("%d runs, %d claims; want 0 runs and a claim tried", b.runs.Load(), fs.claims.Load())
	}
}

// Two authenticated users who send the same key have two key spaces: each
// gets a charge of their own, over streamable HTTP behind the SDK's
// bearer-token middleware; a call without a verified user is refused.
func TestScopeIsolationBetweenUsers(t *testing.T) {
	b := newBank()
	s := newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithScope(mcpidem.TokenScope))
	endpoint := serveHTTP(t, s, map[string]string{"t-alice": "alice", "t-bob": "bob", "t-anon": ""})
	ctx := context.Background()
	alice := connectHTTP(t, endpoint, "t-alice", nil)
	bob := connectHTTP(t, endpoint, "t-bob", nil)
	got := map[string][]chargeOut{}
	for range 2 {
		for name, cs := range map[string]*mcp.ClientSession{"alice": alice, "bob": bob} {
			res, err := cs.CallTool(ctx, keyed("charge", "shared-key", map[string]any{"amount": 9, "to": "shop"}))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got[name] = append(got[name], out(t, res))
		}
	}
	if b.charges.Load() != 2 || got["alice"][0] != got["alice"][1] || got["bob"][0] != got["bob"][1] ||
		got["alice"][0].Charge == got["bob"][0].Charge {
		t.Errorf("charges %d, alice %+v, bob %+v: want one charge each, replayed to each", b.charges.Load(), got["alice"], got["bob"])
	}
	anon := connectHTTP(t, endpoint, "t-anon", nil)
	_, err := anon.CallTool(ctx, keyed("charge", "shared-key", map[string]any{"amount": 9, "to": "shop"}))
	wantError(t, err, mcpidem.CodeScopeRejected, mcpidem.ReasonScopeRejected)
	if b.runs.Load() != 2 {
		t.Errorf("%d runs, want 2", b.runs.Load())
	}
}

// A result that asks the client for input (multi round-trip) is not
// stored: the call that carries the input runs the tool under the same
// key, and its result is the one stored and replayed.
func TestInputRequiredIsNotStored(t *testing.T) {
	b := newBank()
	s := newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace())
	mcp.AddTool(s, &mcp.Tool{Name: "confirm_charge"}, func(ctx context.Context, req *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, chargeOut, error) {
		if len(req.Params.InputResponses) == 0 {
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{
				Message:         fmt.Sprintf("charge %d?", in.Amount),
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}},
			}}}, chargeOut{}, nil
		}
		if r, ok := req.Params.InputResponses["confirm"].(*mcp.ElicitResult); !ok || r.Action != "accept" {
			return nil, chargeOut{}, idempotency.Permanent(errors.New("not confirmed"))
		}
		return b.charge(ctx, req, in)
	})
	var asked atomic.Int64
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		}})
	cs, err := c.Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for i := range 2 {
		res, err := cs.CallTool(context.Background(), keyed("confirm_charge", "k", map[string]any{"amount": 8}))
		if err != nil {
			t.Fatal(err)
		}
		if o := out(t, res); o.Charge != 1 || replayed(res) != (i == 1) {
			t.Errorf("call %d: %+v, replayed %v", i, o, replayed(res))
		}
	}
	if asked.Load() != 1 || b.charges.Load() != 1 || b.runs.Load() != 1 {
		t.Errorf("%d confirmations asked, %d charges, %d runs of charge; want 1, 1, 1", asked.Load(), b.charges.Load(), b.runs.Load())
	}
	if mcpidem.Stored(&mcp.CallToolResult{InputRequests: mcp.InputRequestMap{}}) {
		t.Error("Stored: true for a result with input requests (load shedding)")
	}
}
