package echo_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/labstack/echo/v4"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/examples/internal/try"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// echo.WrapMiddleware turns the net/http middleware into an echo one, for
// one route or the whole server.
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
	e := echo.New()
	e.POST("/payments", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"payment": fmt.Sprintf("pay_%d", charges.Charge())})
	}, echo.WrapMiddleware(idem))
	srv := httptest.NewServer(e)
	defer srv.Close()

	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1000}`))
	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1000}`))
	fmt.Println(try.Post(srv.URL+"/payments", "", `{"amount":1000}`)[:3])
	fmt.Println("charges:", charges.Count())
	// Output:
	// 201 replayed="" {"payment":"pay_1"}
	// 201 replayed="true" {"payment":"pay_1"}
	// 400
	// charges: 1
}

// For browsers on another origin: httpidem.CORS as a Pre middleware, so
// that it answers the preflight before routing (no OPTIONS route needed).
func Example_cors() {
	idem := try.Middleware() // as in Example
	// A page on https://shop.example calls this API on another origin.
	cors, err := httpidem.CORS(httpidem.CORSOptions{AllowedOrigins: []string{"https://shop.example"}})
	if err != nil {
		panic(err)
	}
	var charges try.Charges
	e := echo.New()
	e.Pre(echo.WrapMiddleware(cors))
	e.POST("/payments", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"payment": fmt.Sprintf("pay_%d", charges.Charge())})
	}, echo.WrapMiddleware(idem))
	srv := httptest.NewServer(e)
	defer srv.Close()

	for _, line := range try.CrossOrigin(srv.URL+"/payments", "https://shop.example") {
		fmt.Println(line)
	}
	// Output:
	// preflight 204 origin=https://shop.example headers="Idempotency-Key, Content-Type"
	// 201 replayed="" origin=https://shop.example exposed="Idempotent-Replayed, Retry-After, Idempotency-Key-Expires, Idempotency-Lease-Remaining"
	// 201 replayed="true" origin=https://shop.example exposed="Idempotent-Replayed, Retry-After, Idempotency-Key-Expires, Idempotency-Lease-Remaining"
}
