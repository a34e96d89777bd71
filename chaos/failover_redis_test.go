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
	"errors"
	"fmt"
	"sync"
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

// foRedisRunner is a runner on a client as a service would configure it, with the
// runner the trials use.
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

// foKey is what the test knows of one key.
type foKey struct {
	claimAcked    atomic.Bool  // fn started: the store acknowledged a claim
	completeAcked atomic.Bool  // Do returned a result from fn: the store acknowledged the completion
	effects       atomic.Int32 // fn's effect, once per run of fn
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

	var (
		current atomic.Pointer[idempotency.Runner]
		stop    atomic.Bool
		mu      sync.Mutex
		keys    = map[string]*foKey{}
		order   []string
		wg      sync.WaitGroup
	)
	current.Store(oldR)
	fn := func(k *foKey) func(ctx context.Context) (int64, error) {
		return func(ctx context.Context) (int64, error) {
			k.claimAcked.Store(true)
			info, _ := idempotency.FromContext(ctx)
			time.Sleep(work)
			k.effects.Add(1)
			return info.Fence, nil
		}
	}
	for w := range foRedisWorkers {
		wg.Go(func() {
			for j := 0; j < 100000 && !stop.Load(); j++ {
				key := fmt.Sprintf("%d-%d", w, j)
				k := &foKey{}
				mu.Lock()
				keys[key], order = k, append(order, key)
				mu.Unlock()
				for !stop.Load() {
					res, err := idempotency.Do(context.Background(), current.Load(), netRequest(key), fn(k))
					if err == nil {
						if !res.Replayed {
							k.completeAcked.Store(true)
						}
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	time.Sleep(at)
	failAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
	stop.Store(true)
	wg.Wait()
	current.Store(newR)
	primary.Kill()

	// What the new primary lacks of what was acknowledged.
	row := chaos.Row{Backend: backend, Fault: kind, Trials: 1, Faults: 1}
	for _, key := range order {
		k := keys[key]
		if !k.claimAcked.Load() {
			continue
		}
		ackedWrites++
		if k.completeAcked.Load() {
			ackedWrites++
		}
		info, err := newR.Inspect(ctx, netRequest(key), false)
		switch {
		case errors.Is(err, idempotency.ErrNotFound):
			lostClaims++
			if k.completeAcked.Load() {
				lostCompletions++
			}
		case err != nil:
			t.Fatalf("inspect %s on the new primary: %v", key, err)
		case k.completeAcked.Load() && info.State != idempotency.StateCompleted:
			lostCompletions++
		}
	}
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
	bound := netLease + 3*netStoreTimeout + 2*time.Second
	var rwg sync.WaitGroup
	var unavailable atomic.Int64
	for _, key := range order {
		k := keys[key]
		rwg.Go(func() {
			var err error
			for time.Since(failAt) < bound+time.Second {
				_, err = idempotency.Do(context.Background(), newR, netRequest(key), fn(k))
				if err == nil {
					d := int64(time.Since(failAt))
					for {
						cur := unavailable.Load()
						if d <= cur || unavailable.CompareAndSwap(cur, d) {
							break
						}
					}
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Errorf("key %s: not claimable or replayed %v after the failover: %v", key, time.Since(failAt).Round(time.Millisecond), err)
		})
	}
	rwg.Wait()
	row.MaxUnavailable = time.Duration(unavailable.Load())
	for _, key := range order {
		if n := keys[key].effects.Load(); n > 1 {
			row.DuplicateEffects += int(n) - 1
		}
	}
	t.Logf("%d keys, %d acknowledged writes, lost: %d claims, %d completions; %d effects ran again", len(order), ackedWrites, lostClaims, lostCompletions, row.DuplicateEffects)
	tally.Add(row)
	if replicas > 0 && row.LostAcks > 0 {
		t.Errorf("Replicas: %d: %d acknowledged writes lost (%d claims, %d completions); every acknowledged write waited for the replica", replicas, row.LostAcks, lostClaims, lostCompletions)
	}
	if row.MaxUnavailable > bound {
		t.Errorf("a key stayed unavailable %v after the failover, bound %v", row.MaxUnavailable, bound)
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
