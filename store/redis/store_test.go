package redis_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

func claimReq(key string, tok idempotency.Token, lease time.Duration) idempotency.ClaimRequest {
	return claimGrace(key, tok, lease, lease)
}

func claimGrace(key string, tok idempotency.Token, lease, grace time.Duration) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: tok, Lease: lease, Grace: grace}
}

// Timing of the tests that wait for a lease or a record to end. A wait
// meant to pass a deadline sleeps past it (a sleep never ends early, so
// that side needs no margin beyond clock noise); a step that must happen
// before a later deadline gets a grace of seconds, which a loaded machine
// running -race does not eat up.
const (
	shortLease = 200 * time.Millisecond // a lease the test lets run out
	longGrace  = 10 * time.Second       // keeps a record after shortLease, for a takeover
	pastLease  = shortLease + 50*time.Millisecond
)

func mustClaim(t *testing.T, s *idemredis.Store, r idempotency.ClaimRequest, want idempotency.Outcome) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), r)
	if err != nil {
		t.Fatalf("claim %q: %v", r.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("claim %q: outcome %v, want %v (%+v)", r.Key, res.Outcome, want, res)
	}
	return res
}

func TestNewRejects(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never dialed
	defer c.Close()
	type wrapped struct{ goredis.Scripter }
	cases := []struct {
		name   string
		client idemredis.Client
		opts   *idemredis.Options
	}{
		{"nil client", nil, nil},
		{"brace in prefix", c, &idemredis.Options{Prefix: "a{b"}},
		{"closing brace in prefix", c, &idemredis.Options{Prefix: "a}b"}},
		{"negative MaxValueSize", c, &idemredis.Options{MaxValueSize: -1}},
		{"negative Replicas", c, &idemredis.Options{Replicas: -1}},
		{"ReplicaTimeout below 1ms", c, &idemredis.Options{Replicas: 1, ReplicaTimeout: time.Microsecond}},
		{"Replicas on a client without one connection per node", wrapped{c}, &idemredis.Options{Replicas: 1}},
		{"Notify on a client without SSubscribe", wrapped{c}, &idemredis.Options{Notify: true}},
		{"negative FenceMemory", c, &idemredis.Options{FenceMemory: -time.Hour}},
		{"FenceMemory below 1ms", c, &idemredis.Options{FenceMemory: time.Microsecond}},
	}
	for _, tc := range cases {
		s, err := idemredis.New(tc.client, tc.opts)
		if !errors.Is(err, idempotency.ErrInvalidArgument) || s != nil {
			t.Errorf("%s: New = %v, %v; want nil, ErrInvalidArgument", tc.name, s, err)
		}
	}
	for _, opts := range []*idemredis.Options{nil, {}, {Replicas: 2, Notify: true, Prefix: "x:"}} {
		if _, err := idemredis.New(c, opts); err != nil {
			t.Errorf("New(%+v): %v", opts, err)
		}
	}
	if _, err := idemredis.New(wrapped{c}, nil); err != nil {
		t.Errorf("New(any Scripter): %v", err)
	}
}

// TestKeyLayout checks the hash tag: one slot for every operation on a
// storage key (the tag depends on nothing else), three hex digits naming
// one of the 1024 shards, braces inside the storage key never change it,
// and the prefix starts the key.
func TestKeyLayout(t *testing.T) {
	s, err := idemredis.New(goredis.NewClient(&goredis.Options{}), &idemredis.Options{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sk := range []string{"3:abc", "6:tenant3:abc", "1:{1:}", "5:}{x}{", strings.Repeat("é", 300)} {
		k := s.Key(sk)
		if !strings.HasPrefix(k, "p:{") || !strings.HasSuffix(k, "}"+sk) || len(k) != len("p:{")+3+1+len(sk) {
			t.Errorf("Key(%q) = %q: want p:{3 hex digits}%s", sk, k, sk)
		}
		// Redis hashes what lies between the first '{' and the next '}'.
		tag := k[strings.IndexByte(k, '{')+1:]
		tag = tag[:strings.IndexByte(tag, '}')]
		if n, err := strconv.ParseUint(tag, 16, 16); err != nil || len(tag) != 3 || n >= idemredis.Shards {
			t.Errorf("Key(%q): hash tag %q is not 3 hex digits below %x", sk, tag, idemredis.Shards)
		}
		if s.Key(sk) != k {
			t.Errorf("Key(%q) is not stable", sk)
		}
	}
	if s.Key("1:a1:b") == s.Key("3:a1:b") {
		t.Error("different storage keys share a key")
	}
	if got, want := s.Key("6:tenant3:abc"), "p:{1a2}6:tenant3:abc"; got != want {
		t.Errorf("Key changed: %q, want %q (the layout is persisted: a change loses every record)", got, want)
	}
}

// TestKeysSpreadOverMasters claims 600 keys through a cluster client and
// counts, on each master, the records that landed there: all three
// masters must hold a fair share, or the hash tag pins keys to few slots.
// The shards' indexes of STARTED records and the keys' fence marks are
// counted apart (one mark per record).
func TestKeysSpreadOverMasters(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	prefix := uniquePrefix()
	s := newStore(t, c, &idemredis.Options{Prefix: prefix})
	const n = 600
	for i := range n {
		mustClaim(t, s, claimReq(fmt.Sprintf("6:tenant3:k%d", i), "tok", time.Minute), idempotency.OutcomeAcquired)
	}
	var mu sync.Mutex
	counts, marks := map[string]int{}, 0
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		keys, err := scanAll(ctx, m, prefix+"*")
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if strings.HasSuffix(k, "}\x00fence") {
				marks++
			} else {
				counts[m.Options().Addr]++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, k := range counts {
		total += k
	}
	t.Logf("records per master: %v; %d shard fence marks", counts, marks)
	if len(counts) != 3 || total != n {
		t.Fatalf("found %d records on %d masters, want %d on 3: %v", total, len(counts), n, counts)
	}
	for addr, k := range counts {
		// 200 expected per master; 120 is over 6 standard deviations below.
		if k < 120 {
			t.Errorf("master %s holds %d of %d keys: keys do not spread", addr, k, n)
		}
	}
	// 600 keys over 1024 shards use about 1024 × (1 - e^(-600/1024)) ≈ 453.
	if marks < 400 || marks > 500 {
		t.Errorf("600 keys use %d shards, want about 453: the shard hash does not spread", marks)
	}
}

func scanAll(ctx context.Context, c *goredis.Client, match string) ([]string, error) {
	var keys []string
	var cursor uint64
	for {
		ks, next, err := c.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return nil, err
		}
		keys = append(keys, ks...)
		if cursor = next; cursor == 0 {
			return keys, nil
		}
	}
}

// flushScripts empties the script cache of every server behind c.
func flushScripts(ctx context.Context, c idemredis.Client) error {
	switch c := c.(type) {
	case *goredis.ClusterClient:
		return c.ForEachShard(ctx, func(ctx context.Context, n *goredis.Client) error {
			return n.ScriptFlush(ctx).Err()
		})
	case *goredis.Client:
		return c.ScriptFlush(ctx).Err()
	}
	return fmt.Errorf("cannot flush %T", c)
}

// TestScriptFlushMidRun flushes the servers' script caches while workers
// run whole request lifecycles: every operation must still succeed with
// the right outcome (EVALSHA's NOSCRIPT falls back to EVAL, which loads
// the script again).
//
// Waiting for a replica pipelines the script with WAIT, which takes a path
// of its own after NOSCRIPT; on a server without replicas, that path is
// checked by TestScriptFlushWithoutReplica instead.
func TestScriptFlushMidRun(t *testing.T) {
	type flushCase struct {
		name   string
		client idemredis.Client
		opts   idemredis.Options
	}
	cases := []flushCase{
		{"single", newSingle(t), idemredis.Options{}},
		{"cluster", newCluster(t), idemredis.Options{Notify: true}},
	}
	if single := newSingle(t); len(onlineReplicas(t, single)) > 0 {
		cases = append(cases, flushCase{"single_wait_replica", single, idemredis.Options{Replicas: 1}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := newStore(t, tc.client, &tc.opts)
			var stop atomic.Bool
			var flushes atomic.Int64
			done := make(chan error, 1)
			go func() {
				for !stop.Load() {
					if err := flushScripts(ctx, tc.client); err != nil {
						done <- err
						return
					}
					flushes.Add(1)
					time.Sleep(time.Millisecond)
				}
				done <- nil
			}()
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for w := range 8 {
				wg.Go(func() {
					for i := range 40 {
						if err := lifecycle(ctx, s, fmt.Sprintf("w%d-%d", w, i)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			stop.Store(true)
			if err := <-done; err != nil {
				t.Fatalf("SCRIPT FLUSH: %v", err)
			}
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if flushes.Load() < 5 {
				t.Fatalf("only %d flushes happened during the run", flushes.Load())
			}
			t.Logf("%d script flushes during 320 lifecycles", flushes.Load())
		})
	}
}

// TestScriptFlushWithoutReplica: after SCRIPT FLUSH, a claim that waits
// for more replicas than the server has still runs its script (EVAL after
// NOSCRIPT, in the pipeline with WAIT): it fails with ErrNotReplicated,
// not NOSCRIPT, and the record is written.
func TestScriptFlushWithoutReplica(t *testing.T) {
	c := newSingle(t)
	ctx := context.Background()
	s := newStore(t, c, &idemredis.Options{Replicas: len(onlineReplicas(t, c)) + 1, ReplicaTimeout: 10 * time.Millisecond})
	for i := range 3 {
		if err := flushScripts(ctx, c); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("3:f%02d", i)
		if _, err := s.Claim(ctx, claimReq(key, "a", time.Minute)); !errors.Is(err, idemredis.ErrNotReplicated) {
			t.Fatalf("claim after SCRIPT FLUSH: %v, want ErrNotReplicated", err)
		}
		if n, err := c.Exists(ctx, s.Key(key)).Result(); err != nil || n != 1 {
			t.Fatalf("claim after SCRIPT FLUSH not written: %d, %v", n, err)
		}
	}
}

// lifecycle runs every operation on a fresh key and checks each outcome.
func lifecycle(ctx context.Context, s *idemredis.Store, key string) error {
	r := claimReq(key, "a", time.Minute)
	res, err := s.Claim(ctx, r)
	if err != nil || res.Outcome != idempotency.OutcomeAcquired {
		return fmt.Errorf("%s: first claim: %+v, %v", key, res, err)
	}
	if err := s.Renew(ctx, key, "a", time.Minute); err != nil {
		return fmt.Errorf("%s: renew: %w", key, err)
	}
	if err := s.Checkpoint(ctx, key, "a", "step", []byte("v")); err != nil {
		return fmt.Errorf("%s: checkpoint: %w", key, err)
	}
	if err := s.Release(ctx, key, "a"); err != nil {
		return fmt.Errorf("%s: release: %w", key, err)
	}
	r.Token = "b"
	res2, err := s.Claim(ctx, r)
	if err != nil || res2.Outcome != idempotency.OutcomeAcquired || res2.Fence <= res.Fence {
		return fmt.Errorf("%s: claim after release: %+v, %v (fence before %d)", key, res2, err, res.Fence)
	}
	if err := s.Complete(ctx, key, "b", []byte("result"), time.Minute); err != nil {
		return fmt.Errorf("%s: complete: %w", key, err)
	}
	r.Token = "c"
	res3, err := s.Claim(ctx, r)
	if err != nil || res3.Outcome != idempotency.OutcomeReplay || string(res3.Result) != "result" {
		return fmt.Errorf("%s: replay: %+v, %v", key, res3, err)
	}
	return nil
}

// TestClusterConcurrentClaims: 64 goroutines on 4 cluster clients claim
// the same 200 keys in different orders; every key must be acquired
// exactly once, every other claim must see it in progress.
func TestClusterConcurrentClaims(t *testing.T) {
	const clients, goroutines, keys = 4, 64, 200
	prefix := uniquePrefix()
	stores := make([]*idemredis.Store, clients)
	for i := range stores {
		stores[i] = newStore(t, newCluster(t), &idemredis.Options{Prefix: prefix})
	}
	ctx := context.Background()
	var acquired [keys]atomic.Int64
	var inProgress atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		s := stores[g%clients]
		order := rand.Perm(keys)
		wg.Go(func() {
			<-start
			for _, k := range order {
				tok := idempotency.Token(fmt.Sprintf("g%d", g))
				res, err := s.Claim(ctx, claimReq(fmt.Sprintf("6:tenant3:k%d", k), tok, time.Minute))
				if err != nil {
					errs <- err
					return
				}
				switch res.Outcome {
				case idempotency.OutcomeAcquired:
					acquired[k].Add(1)
				case idempotency.OutcomeInProgress:
					if res.RetryAfter <= 0 || res.RetryAfter > time.Minute {
						errs <- fmt.Errorf("key %d: RetryAfter %v", k, res.RetryAfter)
						return
					}
					inProgress.Add(1)
				default:
					errs <- fmt.Errorf("key %d: outcome %v", k, res.Outcome)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range acquired {
		if n := acquired[k].Load(); n != 1 {
			t.Errorf("key %d acquired %d times", k, n)
		}
	}
	if got, want := inProgress.Load(), int64(keys*(goroutines-1)); got != want {
		t.Errorf("%d in-progress outcomes, want %d", got, want)
	}
}

// serverMicros reads the server's clock.
func serverMicros(t *testing.T, c goredis.Cmdable) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// TestFencesFromServerClock checks where fences come from: a fresh record
// gets the server's TIME in microseconds, so the fence of a record created
// after another one was deleted or expired is greater even though nothing
// of the old record is left; a takeover adds at least one.
func TestFencesFromServerClock(t *testing.T) {
	c := newSingle(t)
	s := newStore(t, c, nil)
	const key = "3:abc"
	before := serverMicros(t, c)
	first := mustClaim(t, s, claimGrace(key, "a", shortLease, longGrace), idempotency.OutcomeAcquired)
	after := serverMicros(t, c)
	if first.Fence < before || first.Fence > after {
		t.Fatalf("fresh fence %d not within the server's clock [%d, %d] µs", first.Fence, before, after)
	}
	time.Sleep(pastLease) // lease over; the record stays for longGrace more
	took := mustClaim(t, s, claimReq(key, "b", shortLease), idempotency.OutcomeAcquired)
	if took.Fence <= first.Fence || took.Attempt != 2 {
		t.Fatalf("takeover: fence %d attempt %d after fence %d", took.Fence, took.Attempt, first.Fence)
	}
	// Let the record expire entirely (lease + grace = 2*shortLease): the
	// key is gone.
	time.Sleep(2*shortLease + 100*time.Millisecond)
	if n, err := c.Exists(context.Background(), s.Key(key)).Result(); err != nil || n != 0 {
		t.Fatalf("record still exists after lease and grace: %d, %v", n, err)
	}
	fresh := mustClaim(t, s, claimReq(key, "c", time.Minute), idempotency.OutcomeAcquired)
	if fresh.Fence <= took.Fence || fresh.Attempt != 1 {
		t.Fatalf("after expiry: fence %d attempt %d, previous fence %d", fresh.Fence, fresh.Attempt, took.Fence)
	}
	if err := s.Release(context.Background(), key, "c"); err != nil {
		t.Fatal(err)
	}
	again := mustClaim(t, s, claimReq(key, "d", time.Minute), idempotency.OutcomeAcquired)
	if again.Fence <= fresh.Fence {
		t.Fatalf("after release: fence %d, previous %d", again.Fence, fresh.Fence)
	}
}

// TestTakeoverFenceAboveClock: a stored fence ahead of the server's clock
// (written by a server whose clock ran ahead, before a failover) still
// grows by one on takeover, never goes back to the clock.
func TestTakeoverFenceAboveClock(t *testing.T) {
	c := newSingle(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	const key = "3:abc"
	mustClaim(t, s, claimGrace(key, "a", shortLease, longGrace), idempotency.OutcomeAcquired)
	future := serverMicros(t, c) + int64(time.Hour/time.Microsecond)
	if err := c.HSet(ctx, s.Key(key), "n", future).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pastLease) // lease over; the record stays for longGrace more
	res := mustClaim(t, s, claimReq(key, "b", time.Minute), idempotency.OutcomeAcquired)
	if res.Fence != future+1 {
		t.Fatalf("takeover fence %d, want %d", res.Fence, future+1)
	}
}

// TestDeadlinesByServerClock shows what the store's decisions are made of.
// It could not skew a clock here (libfaketime crashes redis-server at
// start-up, and Go reads time through the vDSO), so it proves two things
// instead: the package's code never reads the Go clock (a syntax check of
// every non-test file; the one timer allowed, in call.go's worker, only
// ends an idle goroutine), and the lease deadline and expiry stored for a
// claim are the server's TIME plus the durations given, so a client clock
// that is wrong by hours has no input into any decision.
func TestDeadlinesByServerClock(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	banned := map[string]bool{"Now": true, "Since": true, "Until": true, "Unix": true, "UnixMilli": true, "UnixMicro": true, "Date": true, "After": true, "Tick": true, "NewTimer": true, "NewTicker": true, "AfterFunc": true}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, d := range file.Decls {
			fn, _ := d.(*ast.FuncDecl)
			ast.Inspect(d, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && banned[sel.Sel.Name] {
						if f == "call.go" && fn != nil && fn.Name.Name == "worker" && sel.Sel.Name == "NewTimer" {
							return true // the idle timeout of a goroutine, no decision
						}
						t.Errorf("%s uses time.%s: decisions must be judged by the server's TIME", f, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if checked < 3 {
		t.Fatalf("checked only %d source files", checked)
	}

	c := newSingle(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	const lease, grace = 10 * time.Hour, 3 * time.Hour
	before := serverMicros(t, c) / 1000
	if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: "3:abc", Fingerprint: "fp", Token: "a", Lease: lease, Grace: grace}); err != nil {
		t.Fatal(err)
	}
	after := serverMicros(t, c) / 1000
	v, err := c.HGet(ctx, s.Key("3:abc"), "l").Result()
	if err != nil {
		t.Fatal(err)
	}
	deadline, _, _ := strings.Cut(v, ":")
	l, err := strconv.ParseInt(deadline, 10, 64)
	if err != nil || v != fmt.Sprintf("%d:%d:0", l, grace.Milliseconds()) {
		t.Fatalf("field l is %q, want <deadline>:<grace>:0 (%v)", v, err)
	}
	if l < before+lease.Milliseconds() || l > after+lease.Milliseconds() {
		t.Fatalf("lease deadline %d not server time + lease: [%d, %d]", l, before+lease.Milliseconds(), after+lease.Milliseconds())
	}
	exp, err := c.PExpireTime(ctx, s.Key("3:abc")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ms := exp.Milliseconds(); ms < before+(lease+grace).Milliseconds() || ms > after+(lease+grace).Milliseconds() {
		t.Fatalf("expiry %d not server time + lease + grace", ms)
	}
	res := mustClaim(t, s, claimReq("3:abc", "b", time.Minute), idempotency.OutcomeInProgress)
	if res.RetryAfter > lease || res.RetryAfter < lease-time.Minute {
		t.Fatalf("RetryAfter %v, want about %v", res.RetryAfter, lease)
	}
}

// TestServerDown: a server that goes away gives errors that wrap
// go-redis's (here a *net.OpError), never an outcome.
func TestServerDown(t *testing.T) {
	addr := singleAddr(t)
	p := newProxy(t, addr)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), MaxRetries: 1, DialerRetries: 1})
	defer c.Close()
	s := newStore(t, c, nil)
	ctx := context.Background()
	mustClaim(t, s, claimReq("3:abc", "a", time.Minute), idempotency.OutcomeAcquired)
	p.Close()
	res, err := s.Claim(ctx, claimReq("3:abc", "a", time.Minute))
	var op *net.OpError
	if err == nil || res.Outcome != idempotency.OutcomeUnknown || !errors.As(err, &op) {
		t.Fatalf("claim on a stopped server: %+v, %v (%T); want an error wrapping *net.OpError", res, err, errors.Unwrap(err))
	}
	if !strings.HasPrefix(err.Error(), "redis: claim: ") {
		t.Errorf("error %q does not name the operation", err)
	}
	for name, err := range map[string]error{
		"renew":      s.Renew(ctx, "3:abc", "a", time.Minute),
		"checkpoint": s.Checkpoint(ctx, "3:abc", "a", "n", []byte("v")),
		"complete":   s.Complete(ctx, "3:abc", "a", []byte("r"), time.Minute),
		"release":    s.Release(ctx, "3:abc", "a"),
	} {
		if !errors.As(err, &op) || errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s on a stopped server: %v; want an error wrapping *net.OpError", name, err)
		}
	}

	cl := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{p.Addr()}, MaxRetries: 1, DialerRetries: 1})
	defer cl.Close()
	cs := newStore(t, cl, nil)
	if res, err := cs.Claim(ctx, claimReq("3:abc", "a", time.Minute)); err == nil || res.Outcome != idempotency.OutcomeUnknown {
		t.Fatalf("claim on an unreachable cluster: %+v, %v", res, err)
	}
}

// TestLostReply: the server applies a claim but its reply is lost. The
// store must report an error (the claim may have been applied), and
// repeating the claim with the same token must acquire with the same
// fence, as the core does after an ambiguous error.
func TestLostReply(t *testing.T) {
	c := newSingle(t)
	p := newProxy(t, singleAddr(t))
	pc := goredis.NewClient(&goredis.Options{Addr: p.Addr(), MaxRetries: 2, DialerRetries: 1, PoolSize: 1})
	defer pc.Close()
	prefix := uniquePrefix()
	direct := newStore(t, c, &idemredis.Options{Prefix: prefix})
	viaProxy := newStore(t, pc, &idemredis.Options{Prefix: prefix})
	ctx := context.Background()
	// loseNextReply opens a connection through the proxy, then makes the
	// proxy lose every reply: the next command reaches the server on that
	// connection, and go-redis's retries fail on new connections (their
	// handshake's reply is lost too).
	loseNextReply := func() {
		p.dropReplies.Store(false)
		if err := pc.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		p.dropReplies.Store(true)
	}
	// Load every script, so the lost reply is the script's, not NOSCRIPT.
	if err := lifecycle(ctx, direct, "warm-up"); err != nil {
		t.Fatal(err)
	}
	loseNextReply()
	res, err := viaProxy.Claim(ctx, claimReq("3:abc", "a", time.Minute))
	if err == nil {
		t.Fatalf("claim whose reply was lost: %+v, no error", res)
	}
	t.Logf("claim with a lost reply: %v", err)
	// The claim was applied: another holder sees it in progress, and the
	// same token acquires it again with the same fence.
	mustClaim(t, direct, claimReq("3:abc", "b", time.Minute), idempotency.OutcomeInProgress)
	again := mustClaim(t, direct, claimReq("3:abc", "a", time.Minute), idempotency.OutcomeAcquired)
	if again.Attempt != 1 {
		t.Fatalf("repeated claim: attempt %d, want 1", again.Attempt)
	}
	// A complete whose reply is lost is an error too, and repeating it
	// succeeds.
	loseNextReply()
	if err := viaProxy.Complete(ctx, "3:abc", "a", []byte("r"), time.Minute); err == nil || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("complete whose reply was lost: %v", err)
	}
	if err := direct.Complete(ctx, "3:abc", "a", []byte("other"), time.Minute); err != nil {
		t.Fatalf("repeated complete: %v", err)
	}
	rep := mustClaim(t, direct, claimReq("3:abc", "b", time.Minute), idempotency.OutcomeReplay)
	if string(rep.Result) != "r" || rep.Fence != again.Fence {
		t.Fatalf("replay %q fence %d, want %q fence %d", rep.Result, rep.Fence, "r", again.Fence)
	}
}

// TestCanceledContextSendsNothing: a canceled context returns its error
// without a command reaching the server.
func TestCanceledContextSendsNothing(t *testing.T) {
	c := newSingle(t)
	var h countHook
	s := newStore(t, c, nil)
	addHook(t, s, &h)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Claim(ctx, claimReq("3:abc", "a", time.Minute)); err != context.Canceled {
		t.Errorf("claim: %v", err)
	}
	if err := s.Complete(ctx, "3:abc", "a", nil, time.Minute); err != context.Canceled {
		t.Errorf("complete: %v", err)
	}
	if err := s.Watch(ctx, "3:abc"); err != context.Canceled {
		t.Errorf("watch: %v", err)
	}
	if n := h.n.Load(); n != 0 {
		t.Errorf("%d commands sent with a canceled context", n)
	}
}

// TestWaitForReplicas: with Replicas set, claims and completions wait on
// the connection that wrote; a shortfall is ErrNotReplicated, after which
// the write is in place and repeating it is safe. With n online replicas
// of the single server (one, from scripts/servers/redis.sh), waiting for
// n succeeds and the replicas have the write; waiting for n+1 fails. A
// server without replicas checks only the failing side.
func TestWaitForReplicas(t *testing.T) {
	c := newSingle(t)
	ctx := context.Background()
	replicas := onlineReplicas(t, c)
	n := len(replicas)
	t.Logf("the single server has %d online replicas: %v", n, replicas)
	prefix := uniquePrefix()
	direct := newStore(t, c, &idemredis.Options{Prefix: prefix})
	short := newStore(t, c, &idemredis.Options{Prefix: prefix, Replicas: n + 1, ReplicaTimeout: 50 * time.Millisecond})

	if n > 0 {
		// The WAIT for the replicas returns as soon as they acknowledge;
		// the timeout (below the client's 5s ReadTimeout) only bounds a
		// slow acknowledgement on a loaded machine.
		enough := newStore(t, c, &idemredis.Options{Prefix: prefix, Replicas: n, ReplicaTimeout: 2500 * time.Millisecond})
		mustClaim(t, enough, claimReq("3:abc", "a", time.Minute), idempotency.OutcomeAcquired)
		if err := enough.Complete(ctx, "3:abc", "a", []byte("r"), time.Minute); err != nil {
			t.Fatalf("complete waiting for %d replicas: %v", n, err)
		}
		for _, addr := range replicas {
			replica := goredis.NewClient(&goredis.Options{Addr: addr})
			got, err := replica.HGet(ctx, enough.Key("3:abc"), "r").Result()
			_ = replica.Close()
			if err != nil || got != "r" {
				t.Fatalf("replica %s has %q, %v right after the completion was acknowledged", addr, got, err)
			}
		}
		direct = enough
	}

	_, err := short.Claim(ctx, claimReq("3:def", "a", time.Minute))
	if !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("claim waiting for %d replicas of %d: %v, want ErrNotReplicated", n+1, n, err)
	}
	again := mustClaim(t, direct, claimReq("3:def", "a", time.Minute), idempotency.OutcomeAcquired)
	if again.Attempt != 1 {
		t.Fatalf("repeated claim: attempt %d", again.Attempt)
	}
	if err := short.Complete(ctx, "3:def", "a", []byte("r"), time.Minute); !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("complete waiting for %d replicas of %d: %v, want ErrNotReplicated", n+1, n, err)
	}
	if err := direct.Complete(ctx, "3:def", "a", []byte("r"), time.Minute); err != nil {
		t.Fatalf("repeated complete: %v", err)
	}
	// Outcomes that write nothing do not judge the WAIT.
	mustClaim(t, short, claimReq("3:def", "b", time.Minute), idempotency.OutcomeReplay)

	// In a cluster the WAIT goes to the master of the key's slot (a MOVED
	// reply would show otherwise); no master has 64 replicas.
	cl := newCluster(t)
	cs := newStore(t, cl, &idemredis.Options{Replicas: 64, ReplicaTimeout: 20 * time.Millisecond})
	for i := range 6 {
		key := fmt.Sprintf("3:k%02d", i)
		if _, err := cs.Claim(ctx, claimReq(key, "a", time.Minute)); !errors.Is(err, idemredis.ErrNotReplicated) {
			t.Fatalf("cluster claim of %s waiting for 64 replicas: %v, want ErrNotReplicated", key, err)
		}
		if n, err := cl.Exists(ctx, cs.Key(key)).Result(); err != nil || n != 1 {
			t.Fatalf("cluster claim of %s not written: %d, %v", key, n, err)
		}
	}
}

// TestWatchWithoutNotify: without Notify, Watch fails at once, so callers
// poll instead of waiting for a message that never comes.
func TestWatchWithoutNotify(t *testing.T) {
	s := newStore(t, newSingle(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.Watch(ctx, "3:abc"); err == nil || ctx.Err() != nil {
		t.Fatalf("Watch without Notify: %v after %v", err, ctx.Err())
	}
}

// TestWatchCluster: a waiter on a cluster wakes when another client
// completes the key, through the shard channel of the key's node.
func TestWatchCluster(t *testing.T) {
	prefix := uniquePrefix()
	a := newStore(t, newCluster(t), &idemredis.Options{Prefix: prefix, Notify: true})
	b := newStore(t, newCluster(t), &idemredis.Options{Prefix: prefix, Notify: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 6 { // keys on different nodes
		key := fmt.Sprintf("3:w%02d", i)
		mustClaim(t, a, claimReq(key, "a", time.Minute), idempotency.OutcomeAcquired)
		woke := make(chan error, 1)
		go func() { woke <- b.Watch(ctx, key) }()
		select {
		case err := <-woke:
			t.Fatalf("%s: Watch returned before any change: %v", key, err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := a.Complete(ctx, key, "a", []byte("r"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := <-woke; err != nil {
			t.Fatalf("%s: Watch: %v", key, err)
		}
		// Watching a record that is no longer STARTED returns at once.
		if err := b.Watch(ctx, key); err != nil {
			t.Fatalf("%s: Watch of a completed record: %v", key, err)
		}
	}
}
