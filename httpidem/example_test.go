package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A payments endpoint behind the middleware: the client's retry with the
// same key gets the first response, and the card is charged once.
func ExampleNew() {
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	// Every key lives in its account's key space: another account that
	// sends the same key never gets this account's response.
	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		account := r.Header.Get("X-Account") // normally: the authenticated account
		if account == "" {
			return nil, httpidem.RejectScope(http.StatusUnauthorized, "no account")
		}
		return []string{account, r.Pattern}, nil
	}))
	if err != nil {
		panic(err)
	}
	var charges atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1) // the effect
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":"pay_%d"}`, n)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem(pay)) // r.Pattern, in the scope, is the route
	srv := httptest.NewServer(mux)
	defer srv.Close()

	key := httpidem.NewKey() // one key per user intent
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		httpidem.SetKey(req, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// 201 replayed="" {"payment":"pay_1"}
	// 201 replayed="true" {"payment":"pay_1"}
	// charges: 1
}

// A client whose first attempt meets an overloaded server: the transport
// retries with the same key and body, and the payment happens once.
func ExampleTransport() {
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	// One trusted client that makes random keys: a shared key space, said
	// by name.
	idem, err := httpidem.New(runner, httpidem.WithSharedKeySpace())
	if err != nil {
		panic(err)
	}
	var attempts, charges atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) == 1 {
			// A 5xx is not stored: the key is released for the retry.
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	})
	srv := httptest.NewServer(idem(pay))
	defer srv.Close()

	tr, err := httpidem.NewTransport(httpidem.WithMaxAttempts(4))
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}
	req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{"amount":1000}`))
	httpidem.SetKey(req, httpidem.NewKey())
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", attempts.Load(), "charges:", charges.Load())
	// Output:
	// 201 paid
	// attempts: 2 charges: 1
}
