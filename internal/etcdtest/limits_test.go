package etcdtest_test

import (
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
)

// TestDefaultMinLease checks that on a member with etcd's default election
// settings (100ms heartbeat, 1s election timeout) the server's real minimum
// lease TTL is 2s (1.5 election timeouts, rounded up to whole seconds), as
// ServerMinLease reads it and the store reports by default
// (DefaultMinLease), and that idempotency.New refuses a shorter lease.
func TestDefaultMinLease(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Default)
	if got, err := idemetcd.ServerMinLease(t.Context(), c.Client(t)); err != nil || got != 2*time.Second {
		t.Errorf("ServerMinLease = %v, %v; want 2s", got, err)
	}
	s, err := idemetcd.New(c.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Capabilities().Limits.MinLease; got != 2*time.Second {
		t.Errorf("Capabilities().Limits.MinLease = %v, want 2s", got)
	}
	if _, err := idempotency.New(s, idempotency.WithLease(time.Second)); err == nil {
		t.Error("idempotency.New accepted a 1s lease on a server whose minimum is 2s")
	}
	if _, err := idempotency.New(s, idempotency.WithLease(2*time.Second)); err != nil {
		t.Errorf("idempotency.New with a 2s lease: %v", err)
	}
}
