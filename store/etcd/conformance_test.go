package etcd_test

import (
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
)

// maxValue is a limit below the default, so the suite can check the exact
// boundary with small values.
const maxValue = 64 << 10

// Caps is how the conformance suite runs the store: in real time (the
// store declares its whole-second leases itself).
var Caps = conformancetest.Capabilities{}

// TestConformance runs the suite against the server at
// IDEM_ETCD_ENDPOINTS (etcd 3.4 from Debian in scripts/test.sh; the 3.6
// run is in internal/etcdtest).
func TestConformance(t *testing.T) {
	c := newClient(t)
	conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
		return newStore(t, c, &idemetcd.Options{MaxValueSize: maxValue})
	}, Caps)
}
