package chi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/go-chi/chi/v5"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/examples/internal/try"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// The middleware is a plain func(http.Handler) http.Handler: chi takes it
// with Use or, for some routes only, With.
func Example() {
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		account := r.Header.Get("X-Account") // in a real service: from the verified credential
		if account == "" {
			return nil, httpidem.RejectScope(http.StatusUnauthorized, "no account")
		}
		return []string{account}, nil
	}))
	if err != nil {
		panic(err)
	}
	var charges try.Charges
	r := chi.NewRouter()
	r.With(idem).Post("/payments", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":"pay_%d"}`, charges.Charge())
	})
	r.Post("/search", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"results":[]}`) // not idempotency-managed
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1000}`))
	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1000}`))
	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":2000}`)[:3])
	fmt.Println("charges:", charges.Count())
	// Output:
	// 201 replayed="" {"payment":"pay_1"}
	// 201 replayed="true" {"payment":"pay_1"}
	// 422
	// charges: 1
}

// For browsers on another origin: httpidem.CORS on the router (r.Use
// runs for every request, the preflight included), outside the
// idempotency middleware so that its answers carry the CORS headers.
func Example_cors() {
	idem := try.Middleware() // as in Example
	// A page on https://shop.example calls this API on another origin.
	cors, err := httpidem.CORS(httpidem.CORSOptions{AllowedOrigins: []string{"https://shop.example"}})
	if err != nil {
		panic(err)
	}
	var charges try.Charges
	r := chi.NewRouter()
	r.Use(cors)
	r.With(idem).Post("/payments", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":"pay_%d"}`, charges.Charge())
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	for _, line := range try.CrossOrigin(srv.URL+"/payments", "https://shop.example") {
		fmt.Println(line)
	}
	// Output:
	// preflight 204 origin=https://shop.example headers="Idempotency-Key, Content-Type"
	// 201 replayed="" origin=https://shop.example exposed="Idempotent-Replayed, Retry-After, Idempotency-Key-Expires, Idempotency-Lease-Remaining"
	// 201 replayed="true" origin=https://shop.example exposed="Idempotent-Replayed, Retry-After, Idempotency-Key-Expires, Idempotency-Lease-Remaining"
}
