package httpidem_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

func corsHandler(t *testing.T, o httpidem.CORSOptions, h http.Handler) http.Handler {
	t.Helper()
	cors, err := httpidem.CORS(o)
	if err != nil {
		t.Fatal(err)
	}
	return cors(h)
}

// A preflight from an allowed origin may send the key; the replay marker,
// Retry-After and the expiry are exposed on fresh answers, replays and the
// middleware's own answers; another origin's preflight is refused.
func TestCORS(t *testing.T) {
	p := &payments{}
	h := corsHandler(t, httpidem.CORSOptions{AllowedOrigins: []string{"https://shop.example"}}, wrap(t, newRunner(t, nil), p))
	pre := httptest.NewRequest("OPTIONS", "/payments", nil)
	pre.Header.Set("Origin", "https://shop.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "idempotency-key, content-type")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, pre)
	if w.Code != 204 || w.Header().Get("Access-Control-Allow-Origin") != "https://shop.example" ||
		!strings.Contains(w.Header().Get("Access-Control-Allow-Headers"), "Idempotency-Key") ||
		!strings.Contains(w.Header().Get("Access-Control-Allow-Methods"), "POST") || p.runs.Load() != 0 {
		t.Fatalf("preflight: %d %v", w.Code, w.Header())
	}
	pre.Header.Set("Origin", "https://evil.example")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, pre)
	if w.Code != 403 || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin's preflight: %d %v", w.Code, w.Header())
	}
	for i, want := range []int{201, 201, 422} {
		body := `{}`
		if want == 422 {
			body = `{"other":1}`
		}
		w := do(h, "POST", "/payments", "k", body, "Origin", "https://shop.example")
		exposed := w.Header().Get("Access-Control-Expose-Headers")
		if w.Code != want || w.Header().Get("Access-Control-Allow-Origin") != "https://shop.example" ||
			!strings.Contains(exposed, "Idempotent-Replayed") || !strings.Contains(exposed, "Retry-After") ||
			!strings.Contains(exposed, "Idempotency-Key-Expires") || !strings.Contains(w.Header().Get("Vary"), "Origin") {
			t.Fatalf("answer %d: %d %v", i+1, w.Code, w.Header())
		}
	}
	if w := do(h, "POST", "/payments", "k", `{}`, "Origin", "https://evil.example"); w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin: %v", w.Header())
	}
	for _, tc := range []struct {
		o    httpidem.CORSOptions
		want string
	}{
		{httpidem.CORSOptions{}, "AllowedOrigins"},
		{httpidem.CORSOptions{AllowedOrigins: []string{"https://shop.example/"}}, "not an origin"},
		{httpidem.CORSOptions{AllowedOrigins: []string{"shop.example"}}, "not an origin"},
		{httpidem.CORSOptions{AllowedOrigins: []string{"*"}, AllowCredentials: true}, "AllowCredentials"},
		{httpidem.CORSOptions{AllowedOrigins: []string{"*"}, AllowedHeaders: []string{"bad header"}}, "header name"},
	} {
		if _, err := httpidem.CORS(tc.o); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.o, err, tc.want)
		}
	}
}
