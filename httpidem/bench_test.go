package httpidem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

// discard is a ResponseWriter that keeps nothing, so that the benchmark
// measures the middleware and not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkMiddleware measures a small JSON POST on the memory store:
// bare is the handler alone, fresh a first request with a new key,
// replay a retry of a stored response; the -raw variants fingerprint the
// body's bytes (RawFingerprint) instead of its RFC 8785 form. The middleware's overhead is
// fresh (or replay) minus bare. core-fresh and core-replay call
// idempotency.Do directly with the same store, for the share of the
// overhead that is the core's and the store's.
func BenchmarkMiddleware(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"EUR","customer":"cus_42"}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"payment":"pay_1","status":"succeeded"}`))
	})
	mw, err := httpidem.New(newRunner(b, nil), httpidem.WithScope(oneTenant))
	if err != nil {
		b.Fatal(err)
	}
	wrapped := mw(handler)
	rawMW, err := httpidem.New(newRunner(b, nil), httpidem.WithScope(oneTenant), httpidem.WithFingerprint(httpidem.RawFingerprint))
	if err != nil {
		b.Fatal(err)
	}
	rawWrapped := rawMW(handler)

	run := func(b *testing.B, h http.Handler, key func(i int) string) {
		req := httptest.NewRequest("POST", "/payments", nil)
		req.Header.Set("Content-Type", "application/json")
		w := &discard{h: make(http.Header)}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			req.Body = io.NopCloser(bytes.NewReader(body))
			req.ContentLength = int64(len(body))
			req.Header["Idempotency-Key"] = []string{key(i)}
			clear(w.h)
			h.ServeHTTP(w, req)
		}
	}
	b.Run("bare", func(b *testing.B) {
		run(b, handler, func(int) string { return "k" })
	})
	b.Run("fresh", func(b *testing.B) {
		prefix := httpidem.NewKey() + "-" // keys never seen by an earlier run
		keys := make([]string, b.N)
		for i := range keys {
			keys[i] = prefix + strconv.Itoa(i)
		}
		run(b, wrapped, func(i int) string { return keys[i] })
	})
	b.Run("fresh-raw", func(b *testing.B) {
		prefix := httpidem.NewKey() + "-"
		keys := make([]string, b.N)
		for i := range keys {
			keys[i] = prefix + strconv.Itoa(i)
		}
		run(b, rawWrapped, func(i int) string { return keys[i] })
	})
	b.Run("replay-raw", func(b *testing.B) {
		req := httptest.NewRequest("POST", "/payments", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "replayed")
		rawWrapped.ServeHTTP(httptest.NewRecorder(), req)
		run(b, rawWrapped, func(int) string { return "replayed" })
	})
	b.Run("replay", func(b *testing.B) {
		req := httptest.NewRequest("POST", "/payments", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "replayed")
		wrapped.ServeHTTP(httptest.NewRecorder(), req)
		run(b, wrapped, func(int) string { return "replayed" })
	})
	runner := newRunner(b, nil)
	fp := idempotency.FingerprintBytes(body)
	stored := []byte("a stored response of about the same size...")
	core := func(b *testing.B, key func(i int) string) {
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			_, err := idempotency.Do(ctx, runner, idempotency.Request{Key: key(i), Fingerprint: fp},
				func(context.Context) ([]byte, error) { return stored, nil })
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("core-fresh", func(b *testing.B) {
		prefix := httpidem.NewKey() + "-" // keys never seen by an earlier run
		keys := make([]string, b.N)
		for i := range keys {
			keys[i] = prefix + strconv.Itoa(i)
		}
		core(b, func(i int) string { return keys[i] })
	})
	b.Run("core-replay", func(b *testing.B) {
		core(b, func(int) string { return "core-replayed" })
	})
}
