package redis_test

import (
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
)

// maxValue is a limit below the default, so the suite can check the exact
// boundary with small values.
const maxValue = 64 << 10

func conformanceCaps() conformancetest.Capabilities {
	return conformancetest.Capabilities{}
}

func TestConformanceSingle(t *testing.T) {
	c := newSingle(t)
	conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
		return newStore(t, c, &idemredis.Options{MaxValueSize: maxValue, Notify: true})
	}, conformanceCaps())
}

func TestConformanceCluster(t *testing.T) {
	c := newCluster(t)
	conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
		return newStore(t, c, &idemredis.Options{MaxValueSize: maxValue, Notify: true})
	}, conformanceCaps())
}

// TestConformanceReplicas runs the suite with WAIT for the single server's
// replica after every claim and completion.
// It needs a server with a replica (scripts/servers/redis.sh starts one);
// on a server without, it says so instead of failing every case.
func TestConformanceReplicas(t *testing.T) {
	c := newSingle(t)
	if len(onlineReplicas(t, c)) == 0 {
		t.Fatal("the Redis at IDEM_REDIS_ADDR has no online replica, and this test runs the conformance suite with WAIT for one: give it a replica (scripts/servers/redis.sh starts one on the next port)")
	}
	conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
		return newStore(t, c, &idemredis.Options{MaxValueSize: maxValue, Notify: true, Replicas: 1})
	}, conformanceCaps())
}
