package etcdtest_test

import (
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
)

const maxValue = 64 << 10

// TestConformance36 runs the conformance suite on an etcd 3.6 member with
// fast elections (a minimum lease TTL of 1s), in a process of its own: the
// suite's bursts of 8,000 claims would time out on a server slowed by this
// binary's race detector (see etcdtest.StartProcess).
func TestConformance36(t *testing.T) {
	cli := etcdtest.StartProcess(t, etcdtest.Fast).Client(t)
	conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
		s, err := idemetcd.New(cli, &idemetcd.Options{Prefix: "ct/" + t.Name() + "/", MaxValueSize: maxValue})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, conformancetest.Capabilities{})
}
