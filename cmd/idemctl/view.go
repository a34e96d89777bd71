package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/exactlyonce/idempotency"
)

// recordView is a record as idemctl prints it.
type recordView struct {
	Scope       []string `json:"scope"`
	Key         string   `json:"key"`
	StorageKey  string   `json:"storage_key"`
	State       string   `json:"state"`
	Fingerprint string   `json:"fingerprint"`
	Fence       int64    `json:"fence"`
	Attempt     int      `json:"attempt"`
	LeaseLeft   string   `json:"lease_left,omitempty"`
	ExpiresIn   string   `json:"expires_in"`
	ResultSize  int      `json:"result_size"`
	ResultKind  string   `json:"result_kind,omitempty"`
	Result      string   `json:"result,omitempty"`
	Checkpoints []string `json:"checkpoints,omitempty"`
}

func view(info idempotency.RecordInfo, withResult bool) recordView {
	v := recordView{
		Key: info.Key, StorageKey: info.Key, State: string(info.State), Fingerprint: string(info.Fingerprint),
		Fence: info.Fence, Attempt: info.Attempt, ExpiresIn: info.ExpiresIn.Round(time.Millisecond).String(),
		ResultSize: info.ResultSize, Scope: []string{},
	}
	if scope, key, err := idempotency.ParseStorageKey(info.Key); err == nil {
		v.Scope, v.Key = scope, key
	}
	if info.State == idempotency.StateStarted {
		v.LeaseLeft = info.LeaseLeft.Round(time.Millisecond).String()
	}
	v.Checkpoints = slices.Sorted(maps.Keys(info.Checkpoints))
	if withResult && info.Result != nil {
		kind, payload, err := idempotency.DescribeResult(info.Result)
		if err != nil {
			kind, payload = "corrupt", info.Result
		}
		v.ResultKind, v.Result = kind, string(payload)
	}
	return v
}

func (c *cmd) printJSON(v any) {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// printResult prints v as JSON with -json, else the text.
func (c *cmd) printResult(v any, format string, args ...any) {
	if c.json {
		c.printJSON(v)
		return
	}
	fmt.Fprintf(c.out, format, args...)
}

func (c *cmd) printRecord(r recordView) {
	if c.json {
		c.printJSON(r)
		return
	}
	fmt.Fprintf(c.out, "key:          %q (scope %s)\n", r.Key, strings.Join(quoteAll(r.Scope), " "))
	fmt.Fprintf(c.out, "state:        %s\n", r.State)
	fmt.Fprintf(c.out, "fence:        %d\n", r.Fence)
	fmt.Fprintf(c.out, "attempt:      %d\n", r.Attempt)
	if r.LeaseLeft != "" {
		fmt.Fprintf(c.out, "lease left:   %s\n", r.LeaseLeft)
	}
	fmt.Fprintf(c.out, "expires in:   %s\n", r.ExpiresIn)
	fmt.Fprintf(c.out, "fingerprint:  %s\n", r.Fingerprint)
	if r.State == string(idempotency.StateCompleted) {
		fmt.Fprintf(c.out, "result size:  %d bytes\n", r.ResultSize)
	}
	if len(r.Checkpoints) > 0 {
		fmt.Fprintf(c.out, "checkpoints:  %s\n", strings.Join(r.Checkpoints, ", "))
	}
	if r.ResultKind != "" {
		fmt.Fprintf(c.out, "result:       %s %s\n", r.ResultKind, r.Result)
	}
	switch {
	case r.State == string(idempotency.StateCompleted):
		fmt.Fprintln(c.out, "meaning:      completed; every retry with the same request gets the stored result")
	case r.LeaseLeft != "0s":
		fmt.Fprintf(c.out, "meaning:      a holder is running (or died less than a lease ago); retries get 409 for up to %s more, then take it over\n", r.LeaseLeft)
	default:
		fmt.Fprintln(c.out, "meaning:      the holder stopped renewing; the next retry takes it over (attempt+1, greater fence), or resolve it (reconcile -dry-run, complete, release) or purge it")
	}
}

func quoteAll(parts []string) []string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = strconv.Quote(p)
	}
	return q
}

// printable is s as it is when it is text, quoted otherwise.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}
