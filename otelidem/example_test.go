package otelidem_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/otelidem"
	"github.com/exactlyonce/idempotency/store/memory"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace/noop"
)

// A Prometheus scrape endpoint through the OpenTelemetry Prometheus
// exporter: a first call and its retry, then what Prometheus scrapes.
func Example_prometheus() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	tel, err := otelidem.New(&otelidem.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		TracerProvider: noop.NewTracerProvider(), // metrics only here
		// The scope is [account, route]: the route may be a label, the
		// account may not (one time series per account).
		ScopeAttributes: []string{"", "http.route"},
	})
	if err != nil {
		panic(err)
	}
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	runner, err := idempotency.New(tel.Store(store), idempotency.WithObserver(tel))
	if err != nil {
		panic(err)
	}

	req := idempotency.Request{Scope: []string{"acct_1", "POST /payments"}, Key: "key-1"}
	for range 2 {
		idempotency.Do(context.Background(), runner, req, func(ctx context.Context) (string, error) {
			return "pay_1", nil
		})
	}

	// In a service: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "idempotency_calls_total") || strings.HasPrefix(line, "idempotency_leases_active") ||
			strings.HasPrefix(line, "idempotency_store_operation_duration_seconds_count") {
			fmt.Println(line)
		}
	}
	// Output:
	// idempotency_calls_total{http_route="POST /payments",idempotency_outcome="completed",idempotency_scope_class="scoped"} 1
	// idempotency_calls_total{http_route="POST /payments",idempotency_outcome="replayed",idempotency_scope_class="scoped"} 1
	// idempotency_leases_active{http_route="POST /payments",idempotency_scope_class="scoped"} 0
	// idempotency_store_operation_duration_seconds_count{idempotency_store_operation="claim"} 2
	// idempotency_store_operation_duration_seconds_count{idempotency_store_operation="complete"} 1
}
