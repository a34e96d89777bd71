package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/chaos"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

// The process-kill trials (issue 14, §1): the payments service of
// internal/paysvc runs as a child process, clients with httpidem's
// retrying Transport pay through it, and the harness SIGKILLs it at a
// drawn phase of a request (or at a drawn time), restarts it on the same
// port and lets the clients retry until each gets its killAnswer.

// killLease is the service's lease: a crashed holder's key is taken over
// this long after its last renewal.
const killLease = 500 * time.Millisecond

// killTrials is how many trials each backend runs by default (`make
// test`, under -race on a shared 2-core machine: 10-20 s per backend).
const killTrials = 10

// Kill points: the phases the service announces (internal/paysvc), and a
// kill at a drawn time.
const (
	killBeforeEffect     = "before-effect"
	killEffectUnrecorded = "effect-unrecorded"
	killAfterEffect      = "after-effect"
	killAfterCompletion  = "after-completion"
	killRandom           = "random"
)

// killRandomMax bounds the drawn time of a random kill, from the start of
// the service (the clients start then too).
const killRandomMax = 40 * time.Millisecond

var killFault = map[string]string{
	killBeforeEffect:     "SIGKILL before the effect",
	killEffectUnrecorded: "SIGKILL after the effect, before its recovery point",
	killAfterEffect:      "SIGKILL after the effect, before completion",
	killAfterCompletion:  "SIGKILL after completion, before the response",
	killRandom:           "SIGKILL at a random time",
}

// scope is the scope the service's middleware gives every request.
var killScope = []string{"chaos", "POST /pay"}

// A killBackend is one way the service runs.
type killBackend struct {
	name   string // subtest name and the service's -mode
	label  string // the tally's backend column
	args   []string
	runner *idempotency.Runner // on the service's store, to inspect keys (never runs fn)
	ledger string              // the ledger table
	points []string
}

func TestProcessKill(t *testing.T) {
	pgURL, redisAddr := killEnv(t, "IDEM_POSTGRES_URL"), killEnv(t, "IDEM_REDIS_ADDR")
	bin := killBuild(t)
	ctx := context.Background()
	pool := killPool(t, pgURL)
	rdb := goredis.NewClient(&goredis.Options{Addr: redisAddr, PoolSize: 2})
	t.Cleanup(func() { rdb.Close() })
	run := fmt.Sprintf("chaoskill_%d_%08x", os.Getpid(), rand.Uint32())

	// The control: without the gateway's de-duplication by downstream key,
	// a kill between the charge and its recovery point must show up as a
	// second charge, or the trials below could not see one either.
	t.Run("control", func(t *testing.T) {
		ledger := run + "_control_ledger"
		killCreateLedger(t, pool, ledger)
		table := run + "_control_keys"
		killPGStore(t, pool, table)
		args := []string{"-mode", "pg-do", "-table", table, "-postgres", pgURL, "-ledger", ledger,
			"-lease", killLease.String(), "-hooks", "-unsafe-no-downstream-dedup"}
		p := killStart(t, bin, args, "127.0.0.1:0", &killPlan{point: killEffectUnrecorded})
		key := httpidem.NewKey()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		got := make(chan killAnswer, 1)
		go func() { got <- killPay(cctx, p.addr, key, 1, &killAttempts{}) }()
		select {
		case <-p.exited:
		case <-cctx.Done():
			t.Fatal("the service was not killed at " + killEffectUnrecorded)
		}
		killStart(t, bin, args, p.addr, nil)
		a := <-got
		charges := killLedgerRows(t, cctx, pool, ledger, []string{key})[key]
		if a.err != nil || len(charges) != 2 || a.payment != charges[1].id || charges[1].fence <= charges[0].fence {
			t.Errorf("got %+v and charges %+v, want 2 charges, the second with a greater fence and told to the client", a, charges)
		}
	})

	var tally chaos.Tally
	defer tally.Report(t)
	for _, mode := range []string{"pg-do", "pg-tx", "redis-do"} {
		t.Run(mode, func(t *testing.T) {
			name := run + "_" + strings.ReplaceAll(mode, "-", "_")
			b := &killBackend{name: mode, ledger: name + "_ledger"}
			killCreateLedger(t, pool, b.ledger)
			var store idempotency.Store
			switch mode {
			case "pg-do", "pg-tx":
				table := name + "_keys"
				store = killPGStore(t, pool, table)
				b.args = []string{"-table", table}
				b.label = "postgres (Do)"
				b.points = []string{killBeforeEffect, killEffectUnrecorded, killAfterEffect, killAfterCompletion, killRandom}
				if mode == "pg-tx" {
					b.label = "postgres (DoTx, TxExecutor)"
					b.points = []string{killBeforeEffect, killAfterEffect, killAfterCompletion, killRandom}
				}
			case "redis-do":
				prefix := strings.ReplaceAll(name, "_", "-") + ":"
				s, err := redis.New(rdb, &redis.Options{Prefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { killDeleteRedisKeys(t, rdb, prefix) })
				store = s
				b.args = []string{"-prefix", prefix, "-redis", redisAddr}
				b.label = "redis (Do)"
				b.points = []string{killBeforeEffect, killEffectUnrecorded, killAfterEffect, killAfterCompletion, killRandom}
			}
			var err error
			// Only to inspect: the defaults' store timeout (2s, not the
			// service's lease/3) keeps a loaded machine from failing it.
			b.runner, err = idempotency.New(store)
			if err != nil {
				t.Fatal(err)
			}
			b.args = append(b.args, "-mode", mode, "-postgres", pgURL, "-ledger", b.ledger,
				"-lease", killLease.String(), "-hooks")

			var st killStats
			n := chaos.Run(t, chaos.FromEnv(t, killTrials), func(t *testing.T, tr chaos.Trial) {
				tally.Add(killTrial(t, bin, b, pool, tr, &st))
			})
			t.Logf("%s: %d trials, %d kills; second charges stopped by the downstream key: %d; "+
				"longest restart (SIGKILL to listening again): %v; the clients made %v", b.label, n, st.kills, st.dedups,
				st.maxRestart.Round(time.Millisecond), &st.attempts)
			t.Logf("%s: from a SIGKILL to the first answer of each intent it caught:%s", b.label, st.percentiles())
			if n == 0 {
				t.Error("no trial ran")
			}
			// Nothing of this backend's run is left STARTED past its lease.
			time.Sleep(killLease)
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			stuck, _, err := b.runner.Stuck(sctx, "", 10)
			if err != nil {
				t.Fatalf("Stuck: %v", err)
			}
			if len(stuck) > 0 {
				t.Errorf("%d records left STARTED past their lease, the first: %+v", len(stuck), stuck[0])
			}
		})
	}
}

// killStats adds up what the tally has no column for.
type killStats struct {
	kills      int
	dedups     int           // charges the gateway answered from an earlier charge
	maxRestart time.Duration // SIGKILL to the new process listening
	attempts   killAttempts
	// unavailable holds, per kill point, every (kill, pending intent)'s
	// time from the kill to the intent's first answer.
	unavailable map[string][]time.Duration
}

// percentiles describes the unavailable times of each kill point.
func (st *killStats) percentiles() string {
	var b strings.Builder
	points := slices.Sorted(maps.Keys(st.unavailable))
	for _, p := range points {
		d := slices.Clone(st.unavailable[p])
		slices.Sort(d)
		at := func(q float64) time.Duration { return d[int(q*float64(len(d)-1))].Round(time.Millisecond) }
		fmt.Fprintf(&b, "\n  %s: n=%d p50=%v p90=%v p99=%v max=%v", killFault[p], len(d), at(.5), at(.9), at(.99), at(1))
	}
	return b.String()
}

// killAttempts counts the clients' attempts by what they got. It is safe
// for concurrent use.
type killAttempts struct {
	mu                      sync.Mutex
	all, netErr, s409, s503 int
}

func (a *killAttempts) add(b *killAttempts) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.all, a.netErr, a.s409, a.s503 = a.all+b.all, a.netErr+b.netErr, a.s409+b.s409, a.s503+b.s503
}

func (a *killAttempts) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprintf("%d attempts: %d network errors, %d answered 409, %d answered 503", a.all, a.netErr, a.s409, a.s503)
}

// killCounting is the clients' base transport: it counts every attempt.
type killCounting struct {
	base http.RoundTripper
	n    *killAttempts
}

func (c killCounting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	c.n.all++
	switch {
	case err != nil:
		c.n.netErr++
	case resp.StatusCode == http.StatusConflict:
		c.n.s409++
	case resp.StatusCode == http.StatusServiceUnavailable:
		c.n.s503++
	}
	return resp, err
}

// A killPlan says when to kill one process: at the occurrence-th
// announcement of phase point (counting from 0), or after delay for
// killRandom.
type killPlan struct {
	point      string
	occurrence int
	delay      time.Duration
}

// An killAnswer is what one client finally got.
type killAnswer struct {
	status  int
	payment int64
	at      time.Time
	err     error
}

func killTrial(t *testing.T, bin string, b *killBackend, pool *pgxpool.Pool, tr chaos.Trial, st *killStats) chaos.Row {
	// Draws, always in this order (see Trial.Rand).
	intents := 1 + tr.Rand.IntN(3)
	point := chaos.Pick(tr, b.points...)
	plans := make([]killPlan, chaos.Pick(tr, 1, 1, 2))
	for i := range plans {
		plans[i] = killPlan{point: point, occurrence: tr.Rand.IntN(intents), delay: tr.Between(0, killRandomMax)}
	}
	lag := make([]time.Duration, intents) // of each intent's duplicate
	for i := range lag {
		lag[i] = tr.Between(0, 20*time.Millisecond)
	}
	t.Logf("%d intents, %d kill(s) at %s, plans %+v", intents, len(plans), point, plans)

	keys := make([]string, intents)
	for i := range keys {
		keys[i] = httpidem.NewKey()
	}
	trialCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The service, restarted after each kill on the same address.
	var kills, restarts []time.Time
	p := killStart(t, bin, b.args, "127.0.0.1:0", killPlanAt(plans, 0))
	addr, p0 := p.addr, p.started

	// Two clients per intent: the first and a duplicate (a double click).
	answers := make([][2]killAnswer, intents)
	var attempts killAttempts
	defer st.attempts.add(&attempts)
	var wg sync.WaitGroup
	for i := range keys {
		for c := range 2 {
			wg.Go(func() {
				if c == 1 {
					time.Sleep(lag[i])
				}
				answers[i][c] = killPay(trialCtx, addr, keys[i], 100+i, &attempts)
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	for gen := 1; ; gen++ {
		select {
		case <-p.exited:
		case <-done:
			p.stop()
		}
		killedAt := p.killed()
		if killedAt.IsZero() {
			select {
			case <-done:
			default:
				t.Fatalf("the service exited on its own: %v\n%s", p.err, p.stderr.String())
			}
			break
		}
		kills = append(kills, killedAt)
		p = killStart(t, bin, b.args, addr, killPlanAt(plans, gen))
		restarts = append(restarts, p.started)
	}

	since := func(at time.Time) time.Duration { return at.Sub(p0).Round(time.Millisecond) }
	for i, k := range kills {
		t.Logf("kill %d at %v, listening again at %v", i, since(k), since(restarts[i]))
	}
	for i := range answers {
		t.Logf("intent %d answered at %v and %v", i, since(answers[i][0].at), since(answers[i][1].at))
	}
	t.Logf("the clients made %v", &attempts)
	row := chaos.Row{Backend: b.label, Fault: killFault[point], Trials: 1, Faults: len(kills)}
	st.kills += len(kills)
	for i, k := range kills {
		st.maxRestart = max(st.maxRestart, restarts[i].Sub(k))
	}

	// Every client got the one result.
	for i := range answers {
		for c, a := range answers[i] {
			if a.err != nil || a.status != http.StatusCreated || a.payment <= 0 {
				t.Errorf("intent %d client %d: status %d payment %d err %v", i, c, a.status, a.payment, a.err)
			}
		}
		if a, b := answers[i][0], answers[i][1]; a.payment != b.payment {
			t.Errorf("intent %d: the clients got payments %d and %d", i, a.payment, b.payment)
		}
	}

	// Exactly one charge per intent, the one the clients were told of.
	qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer qcancel()
	charges := killLedgerRows(t, qctx, pool, b.ledger, keys)
	for i, k := range keys {
		rows := charges[k]
		if len(rows) != 1 {
			t.Errorf("intent %d (%s): %d charges %+v, want 1", i, k, len(rows), rows)
		}
		row.DuplicateEffects += max(len(rows)-1, 0)
		for c, a := range answers[i] {
			if len(rows) == 0 || (a.err == nil && a.status == http.StatusCreated && a.payment != rows[0].id) {
				row.LostAcks++
				t.Errorf("intent %d client %d: told payment %d, the ledger has %+v", i, c, a.payment, rows)
			}
		}
		for _, r := range rows {
			st.dedups += r.dedups
		}
	}

	// No key left STARTED: every one is completed.
	for i, k := range keys {
		info, err := b.runner.Inspect(qctx, idempotency.Request{Scope: killScope, Key: k}, false)
		if err != nil {
			t.Errorf("intent %d: Inspect: %v", i, err)
		} else if info.State != idempotency.StateCompleted {
			t.Errorf("intent %d: the key is %v after every client got its killAnswer: %+v", i, info.State, info)
		}
	}

	// The longest a key was unavailable: from a kill to the first killAnswer
	// of an intent not answered before it.
	for _, k := range kills {
		for i := range answers {
			first := answers[i][0].at
			if a := answers[i][1].at; a.Before(first) {
				first = a
			}
			if first.After(k) {
				row.MaxUnavailable = max(row.MaxUnavailable, first.Sub(k))
				if st.unavailable == nil {
					st.unavailable = make(map[string][]time.Duration)
				}
				st.unavailable[point] = append(st.unavailable[point], first.Sub(k))
			}
		}
	}
	return row
}

func killPlanAt(plans []killPlan, gen int) *killPlan {
	if gen < len(plans) {
		return &plans[gen]
	}
	return nil
}

// pay sends one payment with httpidem's retrying Transport until it has
// an killAnswer that is not "try again".
func killPay(ctx context.Context, addr, key string, amount int, n *killAttempts) killAnswer {
	tr, err := httpidem.NewTransport(
		httpidem.WithBase(killCounting{base: &http.Transport{DisableKeepAlives: true}, n: n}),
		httpidem.WithMaxAttempts(200),
		httpidem.WithMaxElapsed(30*time.Second),
		httpidem.WithAttemptTimeout(10*time.Second),
		httpidem.WithBackoff(5*time.Millisecond, 50*time.Millisecond),
	)
	if err != nil {
		return killAnswer{err: err}
	}
	client := &http.Client{Transport: tr, Timeout: 45 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/pay",
		strings.NewReader(fmt.Sprintf(`{"amount":%d}`, amount)))
	if err != nil {
		return killAnswer{err: err}
	}
	httpidem.SetKey(req, key)
	resp, err := client.Do(req)
	if err != nil {
		return killAnswer{err: err, at: time.Now()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	a := killAnswer{status: resp.StatusCode, at: time.Now(), err: err}
	if err == nil && resp.StatusCode == http.StatusCreated {
		var v struct{ Payment int64 }
		if err := json.Unmarshal(body, &v); err != nil {
			a.err = fmt.Errorf("body %q: %w", body, err)
		}
		a.payment = v.Payment
	} else if err == nil {
		a.err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	return a
}

// A killProc is one run of the service's process.
type killProc struct {
	cmd      *exec.Cmd
	addr     string
	started  time.Time // listening
	stderr   *killBuffer
	exited   chan struct{} // closed once the process is reaped
	err      error         // of Wait, once exited
	killOnce sync.Once
	mu       sync.Mutex
	killedAt time.Time // set by kill
}

// killStart starts the service on addr and returns once it listens. With
// a plan, the process is killed as the plan says.
func killStart(t *testing.T, bin string, args []string, addr string, pl *killPlan) *killProc {
	t.Helper()
	// The address of a killed process is free again at once (Go listens
	// with SO_REUSEADDR); a few tries cover a slow start.
	var last error
	for range 5 {
		p, err := killTryStart(t, bin, args, addr, pl)
		if err == nil {
			return p
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("starting the service on %s: %v", addr, last)
	return nil
}

func killTryStart(t *testing.T, bin string, args []string, addr string, pl *killPlan) (*killProc, error) {
	p := &killProc{stderr: &killBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append(args[:len(args):len(args)], "-addr", addr)...)
	p.cmd.Stderr = p.stderr
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(p.stop)
	ready := make(chan string, 1)
	go func() {
		defer close(p.exited)
		defer func() { p.err = p.cmd.Wait() }()
		sc := bufio.NewScanner(stdout)
		seen := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "LISTEN":
				ready <- f[1]
			case len(f) == 3 && f[0] == "PHASE":
				if pl != nil && pl.point == f[1] {
					if seen == pl.occurrence {
						p.kill()
						continue
					}
					seen++
				}
				io.WriteString(stdin, "go\n") // fails once killed: fine
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case a := <-ready:
		p.addr, p.started = a, time.Now()
	case <-p.exited:
		return nil, fmt.Errorf("exited before listening: %v\n%s", p.err, p.stderr.String())
	case <-time.After(20 * time.Second):
		p.stop()
		return nil, errors.New("not listening after 20s")
	}
	if pl != nil && pl.point == killRandom {
		time.AfterFunc(pl.delay, p.kill)
	}
	return p, nil
}

// kill sends SIGKILL once.
func (p *killProc) kill() {
	p.killOnce.Do(func() {
		p.mu.Lock()
		p.killedAt = time.Now()
		p.mu.Unlock()
		p.cmd.Process.Kill()
	})
}

// killed returns when kill killed the process, or zero.
func (p *killProc) killed() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killedAt
}

// stop ends the process (if alive) without counting a kill, and reaps it.
func (p *killProc) stop() {
	p.killOnce.Do(func() { p.cmd.Process.Kill() })
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// killBuffer is the child's stderr, kept to show when it dies on its own.
type killBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *killBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *killBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A killCharge is one ledger row.
type killCharge struct {
	id     int64
	fence  int64
	dedups int
}

func killLedgerRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, ledger string, intents []string) map[string][]killCharge {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT intent, id, fence, dedups FROM `+pgx.Identifier{ledger}.Sanitize()+
		` WHERE intent = ANY($1) ORDER BY id`, intents)
	if err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	defer rows.Close()
	out := make(map[string][]killCharge)
	for rows.Next() {
		var intent string
		var c killCharge
		if err := rows.Scan(&intent, &c.id, &c.fence, &c.dedups); err != nil {
			t.Fatal(err)
		}
		out[intent] = append(out[intent], c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// killEnv returns the variable that points the tests at a server; the
// trials need it, so a missing one fails. Everything stays on loopback.
func killEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: the chaos trials need the real server (`make test` starts one; or source the servers' env)", name)
	}
	host := v
	if u, err := url.Parse(v); err == nil && u.Host != "" {
		host = u.Host
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		t.Fatalf("%s=%q: the chaos trials keep all traffic on loopback", name, v)
	}
	return v
}

// killBuild builds internal/paysvc once for the test.
func killBuild(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "paysvc")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./internal/paysvc").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./internal/paysvc: %v\n%s", err, out)
	}
	return bin
}

func killPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("IDEM_POSTGRES_URL: %v", err)
	}
	return pool
}

// killCreateLedger creates the gateway's tables: the ledger of charges (no
// unique constraint on the intent: a second charge would be a second row)
// and the fence seen last per intent.
func killCreateLedger(t *testing.T, pool *pgxpool.Pool, ledger string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, f := pgx.Identifier{ledger}.Sanitize(), pgx.Identifier{ledger + "_fences"}.Sanitize()
	killDropLater(t, pool, ledger)
	killDropLater(t, pool, ledger+"_fences")
	for _, q := range []string{
		`CREATE TABLE ` + l + ` (id bigserial PRIMARY KEY, intent text NOT NULL,
			downstream_key text NOT NULL, fence bigint NOT NULL, dedups int NOT NULL DEFAULT 0)`,
		`CREATE INDEX ON ` + l + ` (intent)`,
		`CREATE INDEX ON ` + l + ` (downstream_key)`,
		`CREATE TABLE ` + f + ` (intent text PRIMARY KEY, fence bigint NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// killPGStore migrates the store's table, dropped at the end of t.
func killPGStore(t *testing.T, pool *pgxpool.Pool, table string) *postgres.Store {
	t.Helper()
	s, err := postgres.New(pool, &postgres.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	killDropLater(t, pool, table)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func killDropLater(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("dropping %s: %v", table, err)
		}
	})
}

// killDeleteRedisKeys deletes the run's keys (they would expire after the
// retention anyway). Bounded: at most 1000 SCAN pages.
func killDeleteRedisKeys(t *testing.T, rdb *goredis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var cursor uint64
	for range 1000 {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			t.Errorf("deleting the run's Redis keys: %v", err)
			return
		}
		if len(keys) > 0 {
			if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the run's Redis keys: %v", err)
				return
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}
