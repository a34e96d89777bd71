package chaos_test

// §3 of issue 14, Redis: a primary with one replica, both of the test's
// own; clients run Do on fresh keys until the replica is promoted
// (REPLICAOF NO ONE) and the clients are repointed to it. Two ways:
//
//   - "primary killed": the primary is SIGKILLed, then the replica is
//     promoted: what the primary acknowledged and had not yet sent is
//     lost (a crash under Sentinel or Cluster);
//   - "split": the replica is promoted while the primary keeps accepting
//     writes for a drawn while before the clients are repointed (a
//     partition until down-after-milliseconds): everything written to the
//     old primary meanwhile is lost.
//
// The trials measure, with Options.Replicas 0 and 1, how many acknowledged
// claims (fn started) and completions (Do returned a result) the new
// primary does not have, and how many intents then ran their effect twice
// when the clients retried (the effect here is a plain fenced write
// without a downstream key, so a lost claim or completion shows). With
// Replicas: 1 every acknowledged write waited for the replica, so none may
// be lost; that is asserted. With Replicas: 0 the losses are measured and
// reported, not asserted: the README says they happen.

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/chaos"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

const (
	foRedisWorkers = 8
	foRedisTrials  = 4 // per Replicas setting in `make test`
)

const (
	foKill  = "primary killed, replica promoted"
	foSplit = "replica promoted, primary still written"
)

func TestFailoverRedisReplicas0(t *testing.T) { foRedisTest(t, 0) }
func TestFailoverRedisReplicas1(t *testing.T) { foRedisTest(t, 1) }

func foRedisTest(t *testing.T, replicas int) {
	t.Parallel()
	var tally chaos.Tally
	run := srvRunID(t)
	var lostClaims, lostCompletions, acked atomic.Int64
	chaos.Run(t, chaos.FromEnv(t, foRedisTrials), func(t *testing.T, tr chaos.Trial) {
		c, p, a := foRedisTrial(t, tr, replicas, &tally, run)
		lostClaims.Add(int64(c))
		lostCompletions.Add(int64(p))
		acked.Add(int64(a))
	})
	t.Logf("Replicas: %d: %d acknowledged writes, %d claims and %d completions lost", replicas, acked.Load(), lostClaims.Load(), lostCompletions.Load())
	tally.Report(t)
}

// foRedisRunner is the trials' runner on a client to addr, configured as
// a service would.
func foRedisRunner(t *testing.T, addr string, replicas int, prefix string) (*idempotency.Runner, *goredis.Client) {
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: foRedisWorkers * 2,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	s, err := idemredis.New(c, &idemredis.Options{Prefix: prefix, Replicas: replicas, ReplicaTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return netRunner(t, s), c
}

func foRedisTrial(t *testing.T, tr chaos.Trial, replicas int, tally *chaos.Tally, run string) (lostClaims, lostCompletions, ackedWrites int) {
	kind := chaos.Pick(tr, foKill, foSplit)
	at := tr.Between(50*time.Millisecond, 400*time.Millisecond)
	repoint := tr.Between(0, 100*time.Millisecond) // split: writes to the old primary meanwhile
	work := tr.Between(0, 10*time.Millisecond)
	backend := fmt.Sprintf("redis (Replicas: %d)", replicas)
	t.Logf("%s: %s after %v (repoint after %v), fn works %v", backend, kind, at, repoint, work)

	primary := srvStartRedis(t)
	replica := srvStartRedis(t, "--replicaof", "127.0.0.1", portOf(primary.Addr))
	prefix := fmt.Sprintf("chaos:fo:%s:%d:", run, tr.Index)
	oldR, oldC := foRedisRunner(t, primary.Addr, replicas, prefix)
	newR, newC := foRedisRunner(t, replica.Addr, replicas, prefix)
	srvWaitReplica(t, oldC, newC, 10*time.Second)

	w := foStart(oldR, foRedisWorkers, work, "")
	time.Sleep(at)
	failAt := time.Now()
	// A bound on the trial's own calls (promotion, inspection of every
	// key): generous, for a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	switch kind {
	case foKill:
		primary.Kill()
		if err := newC.ReplicaOf(ctx, "no", "one").Err(); err != nil {
			t.Fatal(err)
		}
	case foSplit:
		if err := newC.ReplicaOf(ctx, "no", "one").Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(repoint)
	}
	w.Stop()
	w.Current.Store(newR)
	primary.Kill()

	// What the new primary lacks of what was acknowledged.
	row := chaos.Row{Backend: backend, Fault: kind, Trials: 1, Faults: 1}
	// The clock of unavailability stops while the test reads every key.
	readAt := time.Now()
	lostClaims, lostCompletions, ackedWrites = w.Lost(t, ctx, foInspect(newR))
	failAt = failAt.Add(time.Since(readAt))
	row.LostAcks = lostClaims + lostCompletions

	// With Replicas: 1 the new primary needs a replica of its own before
	// it acknowledges anything: the time to attach one counts as
	// unavailability.
	if replicas > 0 {
		again := srvStartRedis(t, "--replicaof", "127.0.0.1", portOf(replica.Addr))
		c := goredis.NewClient(&goredis.Options{Addr: again.Addr})
		srvWaitReplica(t, newC, c, 10*time.Second)
		_ = c.Close()
	}

	// The clients, repointed, retry every key until it completes: a key
	// whose claim was lost runs fn again at once, one whose completion was
	// lost after its lease.
	bound := netLease + 3*netStoreTimeout + 10*time.Second
	row.MaxUnavailable, row.DuplicateEffects = w.Recover(t, newR, failAt, bound, foRedisWorkers)
	t.Logf("%d keys, %d acknowledged writes, lost: %d claims, %d completions; %d effects ran again", w.Keys(), ackedWrites, lostClaims, lostCompletions, row.DuplicateEffects)
	tally.Add(row)
	if replicas > 0 && row.LostAcks > 0 {
		t.Errorf("Replicas: %d: %d acknowledged writes lost (%d claims, %d completions); every acknowledged write waited for the replica", replicas, row.LostAcks, lostClaims, lostCompletions)
	}
	return lostClaims, lostCompletions, ackedWrites
}

func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}
