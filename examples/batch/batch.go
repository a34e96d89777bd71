// Package batch shows an HTTP endpoint that takes many items in one
// request, each with its own idempotency key, as some payment and
// messaging APIs accept: the items are run with idempotency.DoBatch, so a
// retried request replays the items that completed and runs the rest, and
// the whole request costs two store round trips however many items it
// carries.
//
//	POST /messages:batch
//	{"items": [{"key": "k1", "to": "+15550100", "text": "hello"}, ...]}
//
//	200 {"results": [{"key": "k1", "status": "sent", "id": "msg_1"}, ...]}
//
// Each item's status is "sent" (run now), "replayed" (sent by an earlier
// request with the same key), "in_progress" (another request with the key
// is running: retry it), "retry" (it failed and may be retried with the
// same key), "rejected" (a key reused with another item, or invalid: never
// retried as it is) or "error". The HTTP status is 200 whatever the items'
// outcomes, so that a client reads each item's answer; a malformed request
// gets 400 and runs nothing.
package batch

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/exactlyonce/idempotency"
)

// Item is one message of a batch request.
type Item struct {
	Key  string `json:"key"`
	To   string `json:"to"`
	Text string `json:"text"`
}

// Answer is one item's answer.
type Answer struct {
	Key    string `json:"key"`
	Status string `json:"status"`
	ID     string `json:"id,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Send sends one message and returns its ID: the effect that must happen
// once per key.
type Send func(ctx context.Context, it Item) (string, error)

// statuses are the answers to the outcomes of an item: the endpoint's
// table, as every edge has one (see idempotency.Outcome).
var statuses = map[idempotency.Outcome]string{
	idempotency.OutcomeCompleted:       "sent",
	idempotency.OutcomeReplay:          "replayed",
	idempotency.OutcomeInProgress:      "in_progress",
	idempotency.OutcomeReleased:        "retry",
	idempotency.OutcomeStoreError:      "retry",
	idempotency.OutcomeLeaseLost:       "retry",
	idempotency.OutcomeMismatch:        "rejected",
	idempotency.OutcomeInvalidKey:      "rejected",
	idempotency.OutcomeResultNotStored: "error",
	idempotency.OutcomeCorrupt:         "error",
}

// MaxItems bounds a batch request.
const MaxItems = 500

// Handler serves POST /messages:batch for the account scope returns (the
// verified caller: keys are scoped by it), running send once per key.
func Handler(r *idempotency.Runner, scope func(*http.Request) (string, bool), send Send) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		account, ok := scope(req)
		if !ok {
			http.Error(w, "no account", http.StatusUnauthorized)
			return
		}
		var body struct {
			Items []Item `json:"items"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<20))
		if err := dec.Decode(&body); err != nil || len(body.Items) == 0 || len(body.Items) > MaxItems {
			http.Error(w, "want {\"items\": [...]} with 1 to 500 items", http.StatusBadRequest)
			return
		}
		reqs := make([]idempotency.Request, len(body.Items))
		for i, it := range body.Items {
			fp, err := idempotency.FingerprintJSON(struct{ To, Text string }{it.To, it.Text})
			if err != nil {
				http.Error(w, "unreadable item", http.StatusBadRequest)
				return
			}
			reqs[i] = idempotency.Request{Scope: []string{account, "POST /messages:batch"}, Key: it.Key, Fingerprint: fp}
		}
		// A client that gives up will retry: the items are not canceled
		// when it goes away.
		out := idempotency.DoBatch(context.WithoutCancel(req.Context()), r, reqs, func(ctx context.Context, i int) (string, error) {
			return send(ctx, body.Items[i])
		})
		answers := make([]Answer, len(out))
		for i, o := range out {
			a := Answer{Key: body.Items[i].Key, Status: statuses[o.Outcome], ID: o.Value}
			var se *idempotency.StoredError
			switch {
			case a.Status == "":
				a.Status = "error"
			case errors.As(o.Err, &se):
				a.Status, a.ID = "failed", "" // a permanent failure, replayed
			}
			if o.Err != nil {
				a.Error = o.Err.Error()
				if a.Status == "sent" {
					a.Status, a.ID = "failed", "" // a permanent failure, now
				}
			}
			answers[i] = a
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct {
			Results []Answer `json:"results"`
		}{answers})
	})
}
