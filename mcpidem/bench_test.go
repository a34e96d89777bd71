package mcpidem_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/exactlyonce/idempotency/mcpidem"
)

// BenchmarkServerMiddleware measures the middleware's overhead on the
// memory store, without a transport, in front of a handler that lists 20
// tools and answers every call: "bare" is the handler alone, "unmanaged"
// a call of a read-only tool (the definition's lookup only), "fresh" a
// new key per call (lookup, claim, run, store), "replay" one key (lookup,
// claim finds the stored result). Compare within one run:
//
//	go test -run '^$' -bench ServerMiddleware -benchmem -count 6 ./mcpidem/
func BenchmarkServerMiddleware(b *testing.B) {
	list := &mcp.ListToolsResult{}
	for i := range 19 {
		list.Tools = append(list.Tools, &mcp.Tool{Name: "tool_" + strconv.Itoa(i)})
	}
	list.Tools = append(list.Tools, &mcp.Tool{Name: "balance", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		&mcp.Tool{Name: "charge"})
	result := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: `{"charge":"ch_1","amount":1000}`}},
		StructuredContent: json.RawMessage(`{"charge":"ch_1","amount":1000}`)}
	next := func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "tools/list" {
			return list, nil
		}
		return result, nil
	}
	idem, err := mcpidem.ServerMiddleware(newRunner(b, memStore(nil)), mcpidem.WithSharedKeySpace())
	if err != nil {
		b.Fatal(err)
	}
	h := idem(next)
	args := json.RawMessage(`{"amount":1000,"currency":"EUR","to":"bookshop"}`)
	call := func(tool, key string) *mcp.CallToolRequest {
		return &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: tool, Arguments: args,
			Meta: mcp.Meta{mcpidem.DefaultKeyMeta: key}}}
	}
	ctx := context.Background()
	run := func(b *testing.B, h mcp.MethodHandler, req func() *mcp.CallToolRequest) {
		for b.Loop() {
			if _, err := h(ctx, "tools/call", req()); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) {
		req := call("charge", "k")
		run(b, next, func() *mcp.CallToolRequest { return req })
	})
	b.Run("unmanaged", func(b *testing.B) {
		req := call("balance", "k")
		run(b, h, func() *mcp.CallToolRequest { return req })
	})
	b.Run("fresh", func(b *testing.B) {
		run(b, h, func() *mcp.CallToolRequest { return call("charge", mcpidem.NewKey()) })
	})
	b.Run("replay", func(b *testing.B) {
		req := call("charge", "replay")
		run(b, h, func() *mcp.CallToolRequest { return req })
	})
}

// BenchmarkToolCall measures a whole tools/call over the SDK's in-memory
// transport (client, JSON-RPC framing, the server's schema validation):
// "bare" without the middleware, "fresh" a new key per call, "replay" one
// key.
//
//	go test -run '^$' -bench ToolCall -benchmem -count 6 ./mcpidem/
func BenchmarkToolCall(b *testing.B) {
	ctx := context.Background()
	args := map[string]any{"amount": 5, "to": "ann"}
	b.Run("bare", func(b *testing.B) {
		cs := connect(b, newServer(b, newBank(), nil))
		for b.Loop() {
			if _, err := cs.CallTool(ctx, keyed("charge", "k", args)); err != nil {
				b.Fatal(err)
			}
		}
	})
	cs := connect(b, newServer(b, newBank(), newRunner(b, memStore(nil)), mcpidem.WithSharedKeySpace()))
	b.Run("fresh", func(b *testing.B) {
		for b.Loop() {
			if _, err := cs.CallTool(ctx, keyed("charge", mcpidem.NewKey(), args)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		for b.Loop() {
			if _, err := cs.CallTool(ctx, keyed("charge", "replay", args)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
