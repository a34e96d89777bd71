package etcdtest_test

import (
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
)

// TestDefaultMinLease checks that on a member with etcd's default election
// settings (100ms heartbeat, 1s election timeout) the store reports the
// server's real minimum lease TTL, 2s (1.5 election timeouts, rounded up
// to whole seconds), and that idempotency.New refuses a shorter lease.
func TestDefaultMinLease(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Default)
	s, err := idemetcd.New(c.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Limits().MinLease; got != 2*time.Second {
		t.Errorf("Limits().MinLease = %v, want 2s", got)
	}
	if _, err := idempotency.New(s, idempotency.WithLease(time.Second)); err == nil {
		t.Error("idempotency.New accepted a 1s lease on a server whose minimum is 2s")
	}
	if _, err := idempotency.New(s, idempotency.WithLease(2*time.Second)); err != nil {
		t.Errorf("idempotency.New with a 2s lease: %v", err)
	}
}
