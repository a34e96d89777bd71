// Package try sends the requests of the examples.
package try

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// Post sends a JSON POST as account acct_1 (header X-Account) with an
// Idempotency-Key (none when key is empty) and returns its status,
// its Idempotent-Replayed header and its body on one line.
func Post(url, key, body string) string {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account", "acct_1")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
}

// Charges counts the effect of the examples' payment handlers.
type Charges struct{ n atomic.Int64 }

// Charge charges once and returns the payment's number.
func (c *Charges) Charge() int64 { return c.n.Add(1) }

// Count returns how many charges were made.
func (c *Charges) Count() int64 { return c.n.Load() }

// CrossOrigin sends what a browser on origin sends for a JSON POST with
// an Idempotency-Key to url: the preflight, then the request twice (a
// retry). It returns one line per answer with what the browser checks:
// the allowed origin and headers, and which headers a script can read.
func CrossOrigin(url, origin string) []string {
	pre, _ := http.NewRequest(http.MethodOptions, url, nil)
	pre.Header.Set("Origin", origin)
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "content-type,idempotency-key")
	resp, err := http.DefaultClient.Do(pre)
	if err != nil {
		return []string{err.Error()}
	}
	resp.Body.Close()
	lines := []string{fmt.Sprintf("preflight %d origin=%s headers=%q", resp.StatusCode,
		resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get("Access-Control-Allow-Headers"))}
	for range 2 {
		req, _ := http.NewRequest("POST", url, strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Origin", origin)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set("Idempotency-Key", "cors-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return append(lines, err.Error())
		}
		resp.Body.Close()
		lines = append(lines, fmt.Sprintf("%d replayed=%q origin=%s exposed=%q", resp.StatusCode,
			resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("Access-Control-Allow-Origin"),
			resp.Header.Get("Access-Control-Expose-Headers")))
	}
	return lines
}

// Middleware is the examples' idempotency middleware: the memory store,
// every key scoped to its account (header X-Account).
func Middleware() func(http.Handler) http.Handler {
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		return []string{r.Header.Get("X-Account")}, nil
	}))
	if err != nil {
		panic(err)
	}
	return idem
}
