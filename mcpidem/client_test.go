package mcpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/mcpidem"
)

// dropping is an HTTP transport that loses the answers of the first drop
// tools/call requests after the server has made them (the request went
// through, the connection broke on the way back), and records the key of
// every tools/call it sends.
type dropping struct {
	base http.RoundTripper
	drop atomic.Int64
	mu   sync.Mutex
	keys []string
}

func (d *dropping) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Meta map[string]any `json:"_meta"`
		} `json:"params"`
	}
	json.Unmarshal(body, &msg)
	resp, err := d.base.RoundTrip(r)
	if msg.Method != "tools/call" || err != nil {
		return resp, err
	}
	key, _ := msg.Params.Meta[mcpidem.DefaultKeyMeta].(string)
	d.mu.Lock()
	d.keys = append(d.keys, key)
	d.mu.Unlock()
	if d.drop.Add(-1) < 0 {
		return resp, nil
	}
	io.Copy(io.Discard, resp.Body) // the server answered in full...
	resp.Body.Close()
	return nil, errors.New("read: connection reset by peer") // ...and the answer was lost
}

func (d *dropping) sent() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.keys...)
}

// attempts counts the attempts the client middleware makes: installed
// inside it, it sees each one.
type attempts struct{ n atomic.Int64 }

func (a *attempts) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "tools/call" {
			a.n.Add(1)
		}
		return next(ctx, method, req)
	}
}

func clientMW(t testing.TB, opts ...mcpidem.ClientOption) mcp.Middleware {
	t.Helper()
	mw, err := mcpidem.ClientMiddleware(append([]mcpidem.ClientOption{mcpidem.WithBackoff(time.Millisecond, 10*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// Answers lost on the way back are retried with the call's one key, and
// the retry gets the stored result: one charge, over streamable HTTP.
func TestClientRetriesLostAnswersWithOneKey(t *testing.T) {
	b := newBank()
	endpoint := serveHTTP(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace()), nil)
	flaky := &dropping{base: http.DefaultTransport}
	flaky.drop.Store(2)
	cs := connectHTTP(t, endpoint, "", flaky, clientMW(t))
	params := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 4, "to": "dee"}}
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	keys := flaky.sent()
	if o := out(t, res); o.Charge != 1 || !replayed(res) || b.charges.Load() != 1 {
		t.Errorf("result %+v (replayed %v), %d charges; want charge 1 replayed, 1 charge", o, replayed(res), b.charges.Load())
	}
	if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Errorf("keys sent %q, want one key three times", keys)
	}
	if _, ok := params.Meta[mcpidem.DefaultKeyMeta]; ok {
		t.Errorf("the caller's params were changed: %v", params.Meta)
	}
	// The next CallTool is another intent: another key.
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	if keys := flaky.sent(); len(keys) != 4 || keys[3] == keys[0] || b.charges.Load() != 2 {
		t.Errorf("keys sent %q, %d charges; want a new key and a second charge", keys, b.charges.Load())
	}
}

// A key given by the caller, in the params or the context, is the one
// sent.
func TestClientKeepsTheCallersKey(t *testing.T) {
	b := newBank()
	endpoint := serveHTTP(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace()), nil)
	flaky := &dropping{base: http.DefaultTransport}
	cs := connectHTTP(t, endpoint, "", flaky, clientMW(t))
	ctx := context.Background()
	if _, err := cs.CallTool(ctx, keyed("charge", "from-params", map[string]any{"amount": 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(mcpidem.WithKey(ctx, "from-context"), keyed("charge", "", map[string]any{"amount": 2})); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(mcpidem.WithKey(ctx, "from-context"), keyed("charge", "params-win", map[string]any{"amount": 3})); err != nil {
		t.Fatal(err)
	}
	if keys := flaky.sent(); len(keys) != 3 || keys[0] != "from-params" || keys[1] != "from-context" || keys[2] != "params-win" {
		t.Errorf("keys sent %q", keys)
	}
}

// The client waits at least the server's hint before retrying an answer
// in progress, and its retry gets the first call's result.
func TestClientHonoursTheServersHint(t *testing.T) {
	b := newBank()
	b.hold = make(chan struct{})
	s := newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace())
	first := connect(t, s)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := first.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 6}))
		done <- err
	}()
	b.waitEntered(t)
	var waits sleeps
	var n attempts
	cs := connect(t, s, clientMW(t, mcpidem.WithJitter(func(time.Duration) time.Duration { return 0 }),
		mcpidem.WithSleep(func(ctx context.Context, d time.Duration) error {
			waits.sleep(ctx, d)
			close(b.hold) // the first call ends while the second waits
			return <-done
		})), n.middleware)
	res, err := cs.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 6}))
	if err != nil {
		t.Fatal(err)
	}
	if w := waits.waits(); len(w) != 1 || w[0] != mcpidem.DefaultMaxRetryAfter {
		t.Errorf("waits %v, want one of the server's hint, %v", w, mcpidem.DefaultMaxRetryAfter)
	}
	if !replayed(res) || n.n.Load() != 2 || b.charges.Load() != 1 {
		t.Errorf("replayed %v after %d attempts, %d charges; want a replay after 2, 1 charge", replayed(res), n.n.Load(), b.charges.Load())
	}
}

// Final answers are not retried: a result (also a tool error, permanent
// or not), a key reused, an answer marked replayed, another JSON-RPC
// error, a closed session. A store that stays down is retried until the
// attempts run out, each wait at least its hint.
func TestClientRetriesOnlyWhatMayChange(t *testing.T) {
	b := newBank()
	s := newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(), mcpidem.WithMaxResponseSize(100))
	var n attempts
	cs := connect(t, s, clientMW(t), n.middleware)
	ctx := context.Background()
	call := func(key, tool string, args any) error {
		t.Helper()
		n.n.Store(0)
		_, err := cs.CallTool(ctx, keyed(tool, key, args))
		if got := n.n.Load(); got != 1 {
			t.Errorf("%s with key %q: %d attempts (%v), want 1", tool, key, got, err)
		}
		return err
	}
	call("k1", "charge", map[string]any{"amount": 1})
	wantError(t, call("k1", "charge", map[string]any{"amount": 2}), mcpidem.CodeKeyReused, mcpidem.ReasonKeyReused)
	call("k2", "flaky", nil) // a transient tool error: the model reads it
	b.fail.Store("permanent")
	call("k3", "flaky", nil)
	call("k3", "flaky", nil)
	b.fail.Store("protocol")
	if err := call("k4", "flaky", nil); err == nil {
		t.Error("protocol error: no error")
	}
	call("k5", "big", map[string]any{"size": 200})
	wantError(t, call("k5", "big", map[string]any{"size": 200}), mcpidem.CodeResponseNotStored, mcpidem.ReasonResponseNotStored)
	wantError(t, call(strings.Repeat("k", 300), "charge", map[string]any{"amount": 1}), mcpidem.CodeKeyMalformed, mcpidem.ReasonKeyMalformed)

	var waits sleeps
	down := connect(t, newServer(t, newBank(), newRunner(t, &failingStore{Store: memStore(nil)}), mcpidem.WithSharedKeySpace()),
		clientMW(t, mcpidem.WithMaxAttempts(3), mcpidem.WithSleep(waits.sleep)), n.middleware)
	n.n.Store(0)
	_, err := down.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 1}))
	wantError(t, err, mcpidem.CodeStoreUnavailable, mcpidem.ReasonStoreUnavailable)
	if w := waits.waits(); n.n.Load() != 3 || len(w) != 2 || w[0] < time.Second || w[1] < time.Second {
		t.Errorf("%d attempts, waits %v; want 3 attempts, each wait at least the 1s hint", n.n.Load(), w)
	}

	cs.Close()
	n.n.Store(0)
	if _, err := cs.CallTool(ctx, keyed("charge", "k6", map[string]any{"amount": 1})); !errors.Is(err, mcp.ErrConnectionClosed) || n.n.Load() != 1 {
		t.Errorf("closed session: %v after %d attempts, want ErrConnectionClosed after 1", err, n.n.Load())
	}
}

// A canceled context stops the retries at once.
func TestClientStopsWhenCanceled(t *testing.T) {
	var n attempts
	cs := connect(t, newServer(t, newBank(), newRunner(t, &failingStore{Store: memStore(nil)}), mcpidem.WithSharedKeySpace()),
		clientMW(t, mcpidem.WithMaxAttempts(100)), n.middleware)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := cs.CallTool(ctx, keyed("charge", "k", map[string]any{"amount": 1}))
	if err == nil || time.Since(start) > 5*time.Second || n.n.Load() > 2 {
		t.Errorf("%v after %v and %d attempts; want an error within the first 1s wait", err, time.Since(start), n.n.Load())
	}
}

// Configurations that cannot work are refused, naming the option.
func TestConfigurationRefused(t *testing.T) {
	runner := newRunner(t, memStore(nil))
	var nilRunner *idempotency.Runner
	for _, tc := range []struct {
		name string
		exec idempotency.Executor
		opts []mcpidem.Option
		want string
	}{
		{"nil executor", nil, []mcpidem.Option{mcpidem.WithSharedKeySpace()}, "nil executor"},
		{"typed nil runner", nilRunner, []mcpidem.Option{mcpidem.WithSharedKeySpace()}, "nil executor"},
		{"no scope", runner, nil, "WithSharedKeySpace"},
		{"both", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithScope(mcpidem.TokenScope)}, "choose one"},
		{"nil option", runner, []mcpidem.Option{nil}, "nil option"},
		{"bad key meta", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithKeyMeta("-key")}, "WithKeyMeta"},
		{"reserved prefix", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithKeyMeta("io.modelcontextprotocol/key")}, "WithKeyMeta"},
		{"same names", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithReplayMeta(mcpidem.DefaultKeyMeta)}, "both name"},
		{"no tools", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithTools()}, "WithTools"},
		{"empty tool", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithTools("")}, "WithTools"},
		{"nil fingerprint", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithFingerprint(nil)}, "WithFingerprint"},
		{"response size", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithMaxResponseSize(0)}, "WithMaxResponseSize"},
		{"retry after", runner, []mcpidem.Option{mcpidem.WithSharedKeySpace(), mcpidem.WithMaxRetryAfter(time.Millisecond)}, "WithMaxRetryAfter"},
	} {
		_, err := mcpidem.ServerMiddleware(tc.exec, tc.opts...)
		if !errors.Is(err, idempotency.ErrInvalidArgument) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := mcpidem.ServerMiddleware(runner, mcpidem.WithSharedKeySpace(), mcpidem.WithKeyMeta("com.example/idempotency.key")); err != nil {
		t.Errorf("a prefixed _meta key: %v", err)
	}
	for _, tc := range []struct {
		name string
		opts []mcpidem.ClientOption
		want string
	}{
		{"nil option", []mcpidem.ClientOption{nil}, "nil option"},
		{"attempts", []mcpidem.ClientOption{mcpidem.WithMaxAttempts(-1)}, "WithMaxAttempts"},
		{"elapsed", []mcpidem.ClientOption{mcpidem.WithMaxElapsed(-time.Second)}, "WithMaxElapsed"},
		{"backoff", []mcpidem.ClientOption{mcpidem.WithBackoff(time.Second, time.Millisecond)}, "WithBackoff"},
		{"attempt timeout", []mcpidem.ClientOption{mcpidem.WithAttemptTimeout(-1)}, "WithAttemptTimeout"},
		{"meta", []mcpidem.ClientOption{mcpidem.WithClientKeyMeta("key/")}, "WithClientKeyMeta"},
		{"tools", []mcpidem.ClientOption{mcpidem.WithClientTools()}, "WithClientTools"},
	} {
		_, err := mcpidem.ClientMiddleware(tc.opts...)
		if !errors.Is(err, idempotency.ErrInvalidArgument) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("client, %s: %v, want ErrInvalidArgument naming %q", tc.name, err, tc.want)
		}
	}
}

// An attempt that times out is retried with the same key while the tool
// goes on running; the retry waits for it and gets its result.
func TestClientAttemptTimeout(t *testing.T) {
	b := newBank()
	b.hold = make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(b.hold) })
	var n attempts
	cs := connect(t, newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(),
		mcpidem.WithMaxRetryAfter(50*time.Millisecond)),
		clientMW(t, mcpidem.WithAttemptTimeout(100*time.Millisecond), mcpidem.WithMaxAttempts(50)), n.middleware)
	res, err := cs.CallTool(context.Background(), keyed("charge", "", map[string]any{"amount": 3}))
	if err != nil {
		t.Fatal(err)
	}
	if !replayed(res) || b.charges.Load() != 1 || n.n.Load() < 2 {
		t.Errorf("replayed %v, %d charges, %d attempts; want the first attempt's result replayed after a retry, one charge",
			replayed(res), b.charges.Load(), n.n.Load())
	}
}

// A server and client configured with another _meta entry for the key
// agree; a client on the default entry sends no key the server reads.
func TestCustomKeyMeta(t *testing.T) {
	b := newBank()
	s := newServer(t, b, newRunner(t, memStore(nil)), mcpidem.WithSharedKeySpace(), mcpidem.WithKeyMeta("com.example/op-id"))
	ctx := mcpidem.WithKey(context.Background(), "intent-9")
	cs := connect(t, s, clientMW(t, mcpidem.WithClientKeyMeta("com.example/op-id")))
	for range 2 {
		if _, err := cs.CallTool(ctx, keyed("charge", "", map[string]any{"amount": 2})); err != nil {
			t.Fatal(err)
		}
	}
	_, err := connect(t, s, clientMW(t)).CallTool(ctx, keyed("charge", "", map[string]any{"amount": 2}))
	wantError(t, err, mcpidem.CodeKeyMissing, mcpidem.ReasonKeyMissing)
	if b.charges.Load() != 1 {
		t.Errorf("%d charges, want 1", b.charges.Load())
	}
}
