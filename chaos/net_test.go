package chaos_test

// §2 of issue 14: network faults between the service and its store. An
// in-process toxiproxy sits between the store client and the server; each
// trial draws a fault (a connection reset mid-query, a cut after some
// bytes, a latency spike above the store timeout, a black hole, sliced
// packets), its stream, when it starts and how long it lasts, and runs
// concurrent duplicate requests on a few keys through it. Asserted per
// trial: no intent has two effects; a *StoreError's Ran is true exactly
// when fn ran (always false in the transactional mode, where fn's writes
// roll back with the key); every key is replayed or claimable again within
// one lease (plus one store call's retries) of the fault's removal; and
// every acknowledged completion is still in the store afterwards.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/chaos"
	idempg "github.com/exactlyonce/idempotency/store/postgres"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// Timing of the network trials: short leases so that a trial takes about
// two seconds, a store timeout within a third of the lease.
const (
	netLease        = time.Second
	netStoreTimeout = 250 * time.Millisecond
	netAttempts     = idempotency.DefaultStoreAttempts
	netPairs        = 2 // pairs of clients per trial, both of a pair asking for the same keys
	netTrials       = 8 // per backend in `make test` (the default seed draws every kind in 8); CHAOS_TRIALS for more
)

// netRecoveryBound is how long after a fault's removal a key may stay
// neither replayed nor claimable: the lease of a holder that could not
// complete, the store calls of a retry that were already under way (every
// attempt timing out, with backoff), and a margin for a loaded machine
// (the 1,000-trial runs met a first success 4.4 s after the removal, with
// a load average above 40 on 2 cores, where 250 ms store calls time out
// without any fault).
const netRecoveryBound = netLease + netAttempts*netStoreTimeout + 200*time.Millisecond + 4*time.Second

// The fault kinds, as the README's table names them.
const (
	netReset     = "reset mid-query"
	netCut       = "cut after N bytes"
	netLatency   = "latency above store timeout"
	netBlackHole = "black hole"
	netSlicer    = "sliced packets"
)

var netFaults = []string{netReset, netCut, netLatency, netBlackHole, netSlicer}

// A netMode is one backend and execution mode behind the proxy.
type netMode struct {
	backend string
	// tx: the transactional mode, where StoreError.Ran is always false.
	tx bool
	// call runs one request for key; it sets *ran when fn starts.
	call func(ctx context.Context, key string, ran *atomic.Bool) (idempotency.Result[int64], error)
	// effects counts the effects of key's intent, without the proxy.
	effects func(ctx context.Context, key string) (int, error)
	// completed reports whether key's record is COMPLETED, without the
	// proxy.
	completed func(ctx context.Context, key string) (bool, error)
}

// A netGateway stands for a payment gateway outside the store: it
// de-duplicates charges by the downstream key, as the README tells Do's
// users to arrange, and refuses a charge with a fence below the last one
// it saw for that key. Duplicates are counted per intent: a second charge
// for one intent under another downstream key is a duplicate effect.
type netGateway struct {
	mu      sync.Mutex
	fence   map[string]int64 // downstream key -> greatest fence seen
	intents map[string]int   // intent -> distinct charges
	resent  int              // charges sent again under a known downstream key
	stale   int              // charges refused for a stale fence
}

func newNetGateway() *netGateway {
	return &netGateway{fence: map[string]int64{}, intents: map[string]int{}}
}

var errNetStaleFence = errors.New("gateway: stale fence")

func (g *netGateway) Charge(intent, downstream string, fence int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	last, ok := g.fence[downstream]
	switch {
	case !ok:
		g.fence[downstream] = fence
		g.intents[intent]++
	case fence < last:
		g.stale++
		return errNetStaleFence
	default:
		g.fence[downstream] = fence
		g.resent++
	}
	return nil
}

func (g *netGateway) Effects(intent string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.intents[intent]
}

func (g *netGateway) Stats() (resent, stale int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resent, g.stale
}

// netRunner is a Runner on store with the trials' timing.
func netRunner(tb testing.TB, store idempotency.Store) *idempotency.Runner {
	tb.Helper()
	return netRunnerWith(tb, store, netLease, netStoreTimeout)
}

// netRunnerWith is a Runner on store with the lease and store timeout.
func netRunnerWith(tb testing.TB, store idempotency.Store, lease, storeTimeout time.Duration) *idempotency.Runner {
	tb.Helper()
	r, err := idempotency.New(store, idempotency.WithUnsafeShortDurations(),
		idempotency.WithLease(lease), idempotency.WithStoreTimeout(storeTimeout),
		idempotency.WithRetention(time.Minute))
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// netDoFn is fn of the Do modes: some work, then the charge as a recovery
// point, fence-guarded and sent under the request's downstream key.
func netDoFn(gw *netGateway, key string, work time.Duration, ran *atomic.Bool) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		ran.Store(true)
		info, _ := idempotency.FromContext(ctx)
		select {
		case <-time.After(work):
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
		return idempotency.Step(ctx, "charge", func(ctx context.Context) (int64, error) {
			dk, err := idempotency.DownstreamKey(ctx, "charge")
			if err != nil {
				return 0, err
			}
			return info.Fence, gw.Charge(key, dk, info.Fence)
		})
	}
}

func netRequest(key string) idempotency.Request {
	return idempotency.Request{Scope: []string{"chaos-net"}, Key: key, Fingerprint: idempotency.FingerprintParts("pay", key)}
}

// netCompleted reads key's record through a runner that bypasses the
// proxy.
func netCompleted(direct *idempotency.Runner) func(ctx context.Context, key string) (bool, error) {
	return func(ctx context.Context, key string) (bool, error) {
		info, err := direct.Inspect(ctx, netRequest(key), false)
		if errors.Is(err, idempotency.ErrNotFound) {
			return false, nil
		}
		return err == nil && info.State == idempotency.StateCompleted, err
	}
}

// netPostgres sets up the PostgreSQL modes: a store (and, for DoTx, the
// effect table) reached through the proxy, and a direct pool that reads
// what was written.
func netPostgres(t *testing.T, tx bool, work *atomic.Int64, gw *netGateway) (netMode, *srvProxy) {
	url := srvEnv(t, "IDEM_POSTGRES_URL")
	direct := netPool(t, url, nil)
	px := srvToxiproxy(t, "postgres", netHostPort(t, direct.Config().ConnConfig.Host, direct.Config().ConnConfig.Port))
	proxied := netPool(t, url, px)
	table := "chaos_net_keys"
	ctx := context.Background()
	for _, db := range []*pgxpool.Pool{direct} {
		s, err := idempg.New(db, &idempg.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := direct.Exec(ctx, `CREATE TABLE IF NOT EXISTS chaos_net_effects (intent text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	run := srvRunID(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = direct.Exec(ctx, `DELETE FROM chaos_net_effects WHERE intent LIKE $1`, run+"%")
	})
	store, err := idempg.New(proxied, &idempg.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	dstore, err := idempg.New(direct, &idempg.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	r, dr := netRunner(t, store), netRunner(t, dstore)
	m := netMode{backend: "postgres (Do)", completed: netCompleted(dr)}
	if !tx {
		m.call = func(ctx context.Context, key string, ran *atomic.Bool) (idempotency.Result[int64], error) {
			return idempotency.Do(ctx, r, netRequest(key), netDoFn(gw, key, time.Duration(work.Load()), ran))
		}
		m.effects = func(_ context.Context, key string) (int, error) { return gw.Effects(key), nil }
		return m, px
	}
	m.backend, m.tx = "postgres (DoTx)", true
	ex, err := idempg.NewTxExecutor(proxied, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.call = func(ctx context.Context, key string, ran *atomic.Bool) (idempotency.Result[int64], error) {
		res, err := ex.Execute(ctx, netRequest(key), func(ctx context.Context) ([]byte, error) {
			ran.Store(true)
			tx, _ := idempg.TxFromContext(ctx)
			info, _ := idempotency.FromContext(ctx)
			select {
			case <-time.After(time.Duration(work.Load())):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if _, err := tx.Exec(ctx, `INSERT INTO chaos_net_effects (intent, fence) VALUES ($1, $2)`, key, info.Fence); err != nil {
				return nil, err
			}
			return []byte(strconv.FormatInt(info.Fence, 10)), nil
		})
		return idempotency.Result[int64]{Replayed: res.Replayed, Fence: res.Fence, Attempt: res.Attempt}, err
	}
	m.effects = func(ctx context.Context, key string) (int, error) {
		var n int
		err := direct.QueryRow(ctx, `SELECT count(*) FROM chaos_net_effects WHERE intent = $1`, key).Scan(&n)
		return n, err
	}
	return m, px
}

// netPool is a small pool on url, dialing through via instead of the
// server when via is set.
func netPool(tb testing.TB, url string, via *srvProxy) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if via != nil {
		cfg.ConnConfig.DialFunc = via.Dial
		cfg.ConnConfig.Fallbacks = nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func netHostPort(tb testing.TB, host string, port uint16) string {
	tb.Helper()
	if host == "" || host[0] == '/' {
		tb.Fatalf("the chaos tests reach PostgreSQL over TCP; IDEM_POSTGRES_URL names host %q", host)
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// netRedis sets up the Redis mode: a store reached through the proxy and
// one reached directly.
func netRedis(t *testing.T, work *atomic.Int64, gw *netGateway) (netMode, *srvProxy) {
	addr := srvEnv(t, "IDEM_REDIS_ADDR")
	px := srvToxiproxy(t, "redis", addr)
	prefix := "chaos:net:" + srvRunID(t) + ":"
	mk := func(via *srvProxy) *idempotency.Runner {
		o := &goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 8,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}
		if via != nil {
			o.Dialer = via.Dial
		}
		c := goredis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		s, err := idemredis.New(c, &idemredis.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return netRunner(t, s)
	}
	r, dr := mk(px), mk(nil)
	return netMode{
		backend: "redis",
		call: func(ctx context.Context, key string, ran *atomic.Bool) (idempotency.Result[int64], error) {
			return idempotency.Do(ctx, r, netRequest(key), netDoFn(gw, key, time.Duration(work.Load()), ran))
		},
		effects:   func(_ context.Context, key string) (int, error) { return gw.Effects(key), nil },
		completed: netCompleted(dr),
	}, px
}

// netToxic draws the toxic of a fault kind.
func netToxic(tr chaos.Trial, kind string) srvToxic {
	stream := chaos.Pick(tr, "downstream", "upstream")
	ms := func(lo, hi time.Duration) int { return int(tr.Between(lo, hi).Milliseconds()) }
	switch kind {
	case netReset:
		// Closes a connection with RST once data flows: downstream, after
		// the server ran the statement and before the client has the reply.
		return srvToxic{Name: "fault", Type: "reset_peer", Stream: stream, Attributes: map[string]int{"timeout": ms(0, 30*time.Millisecond)}}
	case netCut:
		return srvToxic{Name: "fault", Type: "limit_data", Stream: stream, Attributes: map[string]int{"bytes": tr.Rand.IntN(400) + 1}}
	case netLatency:
		return srvToxic{Name: "fault", Type: "latency", Stream: stream, Attributes: map[string]int{
			"latency": ms(netStoreTimeout+50*time.Millisecond, 3*netStoreTimeout), "jitter": ms(0, 50*time.Millisecond)}}
	case netBlackHole:
		return srvToxic{Name: "fault", Type: "timeout", Stream: stream, Attributes: map[string]int{"timeout": 0}}
	case netSlicer:
		avg := tr.Rand.IntN(16) + 2
		return srvToxic{Name: "fault", Type: "slicer", Stream: stream, Attributes: map[string]int{
			"average_size": avg, "size_variation": tr.Rand.IntN(avg), "delay": int(tr.Between(0, 500*time.Microsecond).Microseconds())}}
	}
	panic("unknown fault " + kind)
}

// netKeyState is what the clients of one key saw in a trial.
type netKeyState struct {
	mu        sync.Mutex
	firstFail time.Time // the first failed call
	ok        time.Time // the first success (fresh or replayed)
	acked     bool      // a call returned success
}

// netTrial runs one trial of m through px.
func netTrial(t *testing.T, tr chaos.Trial, m netMode, px *srvProxy, work *atomic.Int64, tally *chaos.Tally, run string) {
	kind := chaos.Pick(tr, netFaults...)
	toxic := netToxic(tr, kind)
	delay := tr.Between(0, 150*time.Millisecond)                      // after the calls start
	length := tr.Between(100*time.Millisecond, 1200*time.Millisecond) // how long the fault lasts
	work.Store(int64(tr.Between(0, 40*time.Millisecond)))
	t.Logf("%s: %s %+v at +%v for %v, fn works %v", m.backend, kind, toxic, delay, length, time.Duration(work.Load()))

	var (
		mu       sync.Mutex
		keys     []string
		states   = map[string]*netKeyState{}
		failures []string
		calls    atomic.Int64
		failed   atomic.Int64
	)
	state := func(key string) *netKeyState {
		mu.Lock()
		defer mu.Unlock()
		st := states[key]
		if st == nil {
			st = &netKeyState{}
			states[key] = st
			keys = append(keys, key)
		}
		return st
	}
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var stopIssuing atomic.Bool // no new keys after the fault's removal
	deadline := time.Now().Add(delay + length + netRecoveryBound + 2*time.Second)
	var wg sync.WaitGroup
	// Pairs of clients go through keys one after another, both of a pair
	// asking for the same key at once (a client and its duplicate), each
	// retrying until it gets a result, so that requests are in every phase
	// (claim, fn, completion) when the fault comes and goes.
	for p := range netPairs {
		for range 2 {
			wg.Go(func() {
				for j := 0; j < 1000 && !stopIssuing.Load(); j++ {
					key := fmt.Sprintf("%s-%d-%d-%d-%d", run, tr.Seed, tr.Index, p, j)
					st := state(key)
					for time.Now().Before(deadline) {
						var ran atomic.Bool
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						_, err := m.call(ctx, key, &ran)
						cancel()
						calls.Add(1)
						now := time.Now()
						if err == nil {
							st.mu.Lock()
							if st.ok.IsZero() {
								st.ok = now
							}
							st.acked = true
							st.mu.Unlock()
							break
						}
						failed.Add(1)
						var se *idempotency.StoreError
						if errors.As(err, &se) {
							if m.tx && se.Ran {
								fail("key %s: transactional mode returned StoreError.Ran true: %v", key, err)
							}
							if !m.tx && se.Ran != ran.Load() {
								fail("key %s: StoreError.Ran = %v but fn ran = %v: %v", key, se.Ran, ran.Load(), err)
							}
						}
						st.mu.Lock()
						if st.firstFail.IsZero() && st.ok.IsZero() {
							st.firstFail = now
						}
						st.mu.Unlock()
						pause := 20 * time.Millisecond
						if ip := (*idempotency.InProgressError)(nil); errors.As(err, &ip) {
							pause = min(max(ip.RetryAfter, 10*time.Millisecond), 100*time.Millisecond)
						}
						time.Sleep(pause)
					}
				}
			})
		}
	}
	time.Sleep(delay)
	px.Add(toxic)
	time.Sleep(length)
	px.Clear()
	removedAt := time.Now()
	time.Sleep(50 * time.Millisecond) // a few requests after the fault, too
	stopIssuing.Store(true)
	wg.Wait()
	t.Logf("%d keys, %d calls, %d failed", len(keys), calls.Load(), failed.Load())

	row := chaos.Row{Backend: m.backend, Fault: kind, Trials: 1, Faults: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, key := range keys {
		st := states[key]
		if st.ok.IsZero() {
			fail("key %s: neither replayed nor claimable %v after the fault's removal", key, time.Since(removedAt).Round(time.Millisecond))
			continue
		}
		if after := st.ok.Sub(removedAt); after > netRecoveryBound {
			fail("key %s: first success %v after the fault's removal, bound %v", key, after.Round(time.Millisecond), netRecoveryBound)
		}
		if !st.firstFail.IsZero() {
			row.MaxUnavailable = max(row.MaxUnavailable, st.ok.Sub(st.firstFail))
		}
		n, err := m.effects(ctx, key)
		if err != nil {
			t.Fatalf("count effects: %v", err)
		}
		if n > 1 {
			row.DuplicateEffects += n - 1
			fail("key %s: %d effects", key, n)
		}
		done, err := m.completed(ctx, key)
		if err != nil {
			t.Fatalf("inspect: %v", err)
		}
		if st.acked && (!done || n == 0) {
			row.LostAcks++
			fail("key %s: success acknowledged, but completed=%v with %d effects", key, done, n)
		}
	}
	tally.Add(row)
	for _, f := range failures {
		t.Error(f)
	}
}

// netTest runs the schedule on one mode.
func netTest(t *testing.T, setup func(t *testing.T, work *atomic.Int64, gw *netGateway) (netMode, *srvProxy)) {
	t.Parallel()
	var work atomic.Int64
	gw := newNetGateway()
	m, px := setup(t, &work, gw)
	var tally chaos.Tally
	run := srvRunID(t)
	n := chaos.Run(t, chaos.FromEnv(t, netTrials), func(t *testing.T, tr chaos.Trial) {
		netTrial(t, tr, m, px, &work, &tally, run)
	})
	resent, stale := gw.Stats()
	t.Logf("%d trials; gateway: %d charges sent again under the same downstream key (de-duplicated), %d refused for a stale fence; toxiproxy replaced %d times", n, resent, stale, px.Wedged.Load())
	tally.Report(t)
}

func TestNetPostgresDo(t *testing.T) {
	netTest(t, func(t *testing.T, work *atomic.Int64, gw *netGateway) (netMode, *srvProxy) {
		return netPostgres(t, false, work, gw)
	})
}

func TestNetPostgresDoTx(t *testing.T) {
	netTest(t, func(t *testing.T, work *atomic.Int64, gw *netGateway) (netMode, *srvProxy) {
		return netPostgres(t, true, work, gw)
	})
}

func TestNetRedis(t *testing.T) {
	netTest(t, func(t *testing.T, work *atomic.Int64, gw *netGateway) (netMode, *srvProxy) {
		return netRedis(t, work, gw)
	})
}
