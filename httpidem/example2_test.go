package httpidem_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

func exampleRunner() *idempotency.Runner {
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	return runner
}

func examplePost(url, key, body string) (*http.Response, string) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A large export is stored by reference: the first client gets the whole
// report, a retry gets the report as it is now, re-rendered from its ID
// and marked replayed; a report deleted since answers what the service
// decides (here 410).
func ExampleStoreReference() {
	var mu sync.Mutex
	reports := map[string]string{}
	render := func(w http.ResponseWriter, r *http.Request, ref httpidem.Reference) error {
		mu.Lock()
		body, ok := reports[ref.Ref]
		mu.Unlock()
		if !ok {
			http.Error(w, "report "+ref.Ref+" was deleted", http.StatusGone)
			return nil
		}
		w.WriteHeader(ref.Status)
		io.WriteString(w, body)
		return nil
	}
	idem, err := httpidem.New(exampleRunner(), httpidem.WithSharedKeySpace(), httpidem.WithReferenceRenderer(render))
	if err != nil {
		panic(err)
	}
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reports["rep_1"] = "report v1 " + strings.Repeat(".", 1<<20) // 1 MiB: too large to store
		mu.Unlock()
		httpidem.StoreReference(w, "rep_1")
		w.WriteHeader(http.StatusCreated)
		mu.Lock()
		io.WriteString(w, reports["rep_1"])
		mu.Unlock()
	})
	srv := httptest.NewServer(idem(export))
	defer srv.Close()

	_, body := examplePost(srv.URL, "export-1", `{}`)
	fmt.Println(len(body), "bytes")
	mu.Lock()
	reports["rep_1"] = "report v2"
	mu.Unlock()
	resp, body := examplePost(srv.URL, "export-1", `{}`)
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
	mu.Lock()
	delete(reports, "rep_1")
	mu.Unlock()
	resp, body = examplePost(srv.URL, "export-1", `{}`)
	fmt.Println(resp.StatusCode, strings.TrimSpace(body))
	// Output:
	// 1048586 bytes
	// 201 true report v2
	// 410 report rep_1 was deleted
}

// The replay hook adds a header to every replay, naming the request that
// made the response; it cannot change the stored body.
func ExampleWithReplayHook() {
	hook := func(r *http.Request, resp *httpidem.ReplayedResponse) {
		resp.Header.Set("X-Replay-Of", "the first request")
	}
	idem, err := httpidem.New(exampleRunner(), httpidem.WithSharedKeySpace(), httpidem.WithReplayHook(hook))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "paid")
	})))
	defer srv.Close()
	for range 2 {
		resp, body := examplePost(srv.URL, "k", `{}`)
		fmt.Printf("%s replayed=%q replay-of=%q\n", body, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("X-Replay-Of"))
	}
	// Output:
	// paid replayed="" replay-of=""
	// paid replayed="true" replay-of="the first request"
}

// The key's expiry is on the stored response and every replay; a
// Transport stops retrying once it has passed (ErrKeyExpired).
func ExampleWithExpiresHeader() {
	idem, err := httpidem.New(exampleRunner(), httpidem.WithSharedKeySpace())
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "paid")
	})))
	defer srv.Close()
	resp, _ := examplePost(srv.URL, "k", `{}`)
	expires, err := http.ParseTime(resp.Header.Get(httpidem.DefaultExpiresHeader))
	fmt.Println(err, "the key is honoured for", time.Until(expires).Round(time.Hour)) // the runner's retention
	// Output:
	// <nil> the key is honoured for 24h0m0s
}

// An error renderer for clients that want {"error": {...}} instead of
// RFC 9457 problems.
func ExampleWithErrorRenderer() {
	render := func(w http.ResponseWriter, r *http.Request, a httpidem.ErrorAnswer) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.Problem.Status)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": a.Outcome.String(), "message": a.Problem.Detail}})
	}
	idem, err := httpidem.New(exampleRunner(), httpidem.WithSharedKeySpace(), httpidem.WithErrorRenderer(render))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "paid")
	})))
	defer srv.Close()
	examplePost(srv.URL, "k", `{"amount":1}`)
	resp, body := examplePost(srv.URL, "k", `{"amount":2}`)
	fmt.Print(resp.StatusCode, " ", body)
	// Output:
	// 422 {"error":{"code":"mismatch","message":"this key was used with a different request (method, path, query or body)"}}
}

// CORS for pages on another origin: the preflight allows the key, and a
// page's script can read the replay marker, Retry-After and the expiry.
func ExampleCORS() {
	idem, err := httpidem.New(exampleRunner(), httpidem.WithSharedKeySpace())
	if err != nil {
		panic(err)
	}
	cors, err := httpidem.CORS(httpidem.CORSOptions{AllowedOrigins: []string{"https://shop.example"}})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(cors(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "paid")
	}))))
	defer srv.Close()
	pre, _ := http.NewRequest("OPTIONS", srv.URL, nil)
	pre.Header.Set("Origin", "https://shop.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "idempotency-key")
	resp, err := http.DefaultClient.Do(pre)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get("Access-Control-Allow-Headers"))
	// Output:
	// 204 https://shop.example Idempotency-Key, Content-Type
}

// The Transport makes the key of a POST that has none, once per call, and
// every retry of the call sends it: the server runs the payment once.
func ExampleWithAutoKey() {
	var mu sync.Mutex
	keys := map[string]int{}
	idem, err := httpidem.New(exampleRunner(), httpidem.WithSharedKeySpace())
	if err != nil {
		panic(err)
	}
	attempts := 0
	srv := httptest.NewServer(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys[r.Header.Get("Idempotency-Key")]++
		if attempts++; attempts == 1 {
			http.Error(w, "try again", http.StatusServiceUnavailable) // released
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	tr, err := httpidem.NewTransport() // WithAutoKey(POST, PATCH) by default
	if err != nil {
		panic(err)
	}
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	for _, n := range keys {
		fmt.Println(resp.StatusCode, "after", n, "attempts with one key")
	}
	// Output:
	// 201 after 2 attempts with one key
}
