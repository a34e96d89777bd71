package chaos_test

// §3 of issue 14, etcd: a three-member cluster embedded in the test
// (internal/etcdtest, etcd's default election timing: 100 ms heartbeats,
// a 1 s election timeout; with etcdtest.Fast, 50 ms and 500 ms, some keys
// stayed unavailable for over 20 s after a leader stop on a machine with
// a load average above 40 on 2 cores); clients run Do on
// fresh keys while the leader is stopped, and it comes back after a drawn
// while. etcd commits a write on a majority before it answers, so no
// acknowledged claim or completion may be lost: asserted. Effects that run
// twice are counted as in the Redis trials (a completion that failed while
// there was no leader leaves the key STARTED; after its lease a retry
// takes it over and runs fn again).

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/chaos"
	"github.com/exactlyonce/idempotency/internal/etcdtest"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
)

const (
	foEtcdWorkers = 8
	foEtcdTrials  = 2 // in `make test`
	// The timing of internal/etcdtest's leader-loss test: a new leader
	// takes a second or two, and a store call's attempt must be able to
	// outlast a few elections' worth of retries inside the client.
	foEtcdLease        = 3 * time.Second
	foEtcdStoreTimeout = time.Second
)

func TestFailoverEtcdLeader(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 3, etcdtest.Default)
	cli := c.Client(t)
	prefix := "chaos/fo/" + srvRunID(t) + "/"
	store, err := idemetcd.New(cli, &idemetcd.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	r := netRunnerWith(t, store, foEtcdLease, foEtcdStoreTimeout)
	// Whether the record exists and is completed, through the store's
	// Inspector.
	lookup := func(ctx context.Context, key string) (bool, bool, error) {
		sk, err := r.StorageKey(netRequest(key))
		if err != nil {
			return false, false, err
		}
		info, err := store.Inspect(ctx, sk)
		if errors.Is(err, idempotency.ErrNotFound) {
			return false, false, nil
		}
		return err == nil, info.State == idempotency.StateCompleted, err
	}
	var tally chaos.Tally
	chaos.Run(t, chaos.FromEnv(t, foEtcdTrials), func(t *testing.T, tr chaos.Trial) {
		at := tr.Between(50*time.Millisecond, 400*time.Millisecond)
		down := tr.Between(0, 2*time.Second) // until the old leader restarts
		work := tr.Between(0, 10*time.Millisecond)
		const fault = "leader stopped"
		t.Logf("etcd: %s after %v, back after %v, fn works %v", fault, at, down, work)
		leader, err := c.WaitLeader(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		w := foStart(r, foEtcdWorkers, work, fmt.Sprintf("%d-%d-", tr.Seed, tr.Index))
		time.Sleep(at)
		failAt := time.Now()
		c.Stop(leader)
		time.Sleep(down)
		w.Stop()
		if err := c.Restart(leader); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		row := chaos.Row{Backend: "etcd (3 members)", Fault: fault, Trials: 1, Faults: 1}
		readAt := time.Now() // the clock of unavailability stops while the test reads every key
		claims, completions, acked := w.Lost(t, ctx, lookup)
		failAt = failAt.Add(time.Since(readAt))
		row.LostAcks = claims + completions
		row.MaxUnavailable, row.DuplicateEffects = w.Recover(t, r, failAt, down+foEtcdLease+3*foEtcdStoreTimeout+20*time.Second, foEtcdWorkers)
		t.Logf("%d keys, %d acknowledged writes, lost: %d claims, %d completions; %d effects ran again", w.Keys(), acked, claims, completions, row.DuplicateEffects)
		tally.Add(row)
		if row.LostAcks > 0 {
			t.Errorf("etcd lost %d acknowledged claims and %d completions", claims, completions)
		}
	})
	tally.Report(t)
}
