package gin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/examples/internal/try"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A gin engine is an http.Handler, so the middleware wraps it whole;
// WithRequired says which routes must carry a key (others are
// de-duplicated only when they carry one). gin's own middleware chain
// has no slot for a net/http middleware that replaces the response
// writer, which is why it goes in front of the engine.
func Example() {
	gin.SetMode(gin.ReleaseMode)
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
	}), httpidem.WithRequired(func(r *http.Request) bool {
		return r.URL.Path == "/payments"
	}))
	if err != nil {
		panic(err)
	}
	var charges try.Charges
	engine := gin.New()
	engine.POST("/payments", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"payment": fmt.Sprintf("pay_%d", charges.Charge())})
	})
	srv := httptest.NewServer(idem(engine))
	defer srv.Close()

	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1000}`))
	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1000}`))
	fmt.Println(try.Post(srv.URL+"/payments", "order-1", `{"amount":1}`)[:3])
	fmt.Println("charges:", charges.Count())
	// Output:
	// 201 replayed="" {"payment":"pay_1"}
	// 201 replayed="true" {"payment":"pay_1"}
	// 422
	// charges: 1
}

// For browsers on another origin: httpidem.CORS in front of the
// idempotency middleware and the engine.
func Example_cors() {
	gin.SetMode(gin.ReleaseMode)
	idem := try.Middleware() // as in Example
	// A page on https://shop.example calls this API on another origin.
	cors, err := httpidem.CORS(httpidem.CORSOptions{AllowedOrigins: []string{"https://shop.example"}})
	if err != nil {
		panic(err)
	}
	var charges try.Charges
	engine := gin.New()
	engine.POST("/payments", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"payment": fmt.Sprintf("pay_%d", charges.Charge())})
	})
	srv := httptest.NewServer(cors(idem(engine)))
	defer srv.Close()

	for _, line := range try.CrossOrigin(srv.URL+"/payments", "https://shop.example") {
		fmt.Println(line)
	}
	// Output:
	// preflight 204 origin=https://shop.example headers="Idempotency-Key, Content-Type"
	// 201 replayed="" origin=https://shop.example exposed="Idempotent-Replayed, Retry-After, Idempotency-Key-Expires, Idempotency-Lease-Remaining"
	// 201 replayed="true" origin=https://shop.example exposed="Idempotent-Replayed, Retry-After, Idempotency-Key-Expires, Idempotency-Lease-Remaining"
}
