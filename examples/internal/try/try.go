// Package try sends the requests of the examples.
package try

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
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
