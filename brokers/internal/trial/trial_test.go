package trial_test

// The broker trials (issue 27, item 3): N events are published to a real
// broker, the consumer processes of package consumer consume them through
// an inbox on a real store, redeliveries are forced (transient failures,
// slow handlings past the broker's ack deadline, a consumer-group
// rebalance, a requeue storm) and the processes are SIGKILLed at drawn
// points and restarted, until every event is settled. Then the ledger (one
// row per handling of an event, no unique constraint) must hold exactly one
// effect per event, none for the poison events, which must have been
// dead-lettered.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/brokers/internal/trial/consumer"
	"github.com/exactlyonce/idempotency/chaos"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

// Kill points: the consumer's phases (see package consumer) and a kill
// at a drawn time.
const (
	pointPolled      = "polled"       // a batch arrived, nothing claimed
	pointFirstEffect = "first-effect" // the batch claimed, before its first effect
	pointEffect      = "effect"       // after an effect, before the batch is recorded
	pointHandled     = "handled"      // the batch recorded, nothing acknowledged
	pointSettled     = "settled"      // in the middle of the acknowledgements
	pointRandom      = "random"       // at a drawn time
)

// Which points each way of handling survives with exactly one effect per
// event. HandleBatch with effects outside the store cannot survive a kill
// between an effect and the end of its batch (pointEffect, and so a kill
// at a random time): that is the control, which must see a second effect.
var (
	txPoints    = []string{pointPolled, pointFirstEffect, pointEffect, pointHandled, pointSettled, pointRandom}
	batchPoints = []string{pointPolled, pointFirstEffect, pointHandled, pointSettled}
)

// trialMessages is how many events a trial publishes by default (`make
// test`); BROKERS_MESSAGES sets another number, CHAOS_TRIALS more trials
// per mode (see chaos.FromEnv).
const trialMessages = 200

// The consumers' settings in every trial.
const (
	trialLease      = 2 * time.Second        // a killed holder's events are taken over after this
	trialRetryDelay = 200 * time.Millisecond // a Retry's delay (the store's hint when shorter)
	trialPoison     = 37                     // every 37th event fails permanently
	trialFailRate   = 0.05                   // transient failures before the effect
	trialSlowEvery  = 61                     // ... and every 61st event is slow:
	trialSlow       = 1200 * time.Millisecond
	trialBudget     = 45 * time.Second // a trial that has not settled by then fails
)

// A brokerEnv is one broker as the trials use it.
type brokerEnv interface {
	// name is the broker's row label.
	name() string
	// prepare makes the trial's stream, topic or queue, publishes msgs to
	// it and returns the consumers' broker flags.
	prepare(t *testing.T, trial string, msgs []testMsg) []string
	// drained reports that the broker has nothing left to deliver. With
	// stopped, the consumers must be stopped first (RabbitMQ cannot tell
	// unacknowledged deliveries apart otherwise).
	drained(t *testing.T) bool
	stopped() bool
}

// A testMsg is one published event.
type testMsg struct {
	id      string
	payload []byte
}

// testMessages returns n events m-00000... with 200-byte payloads.
func testMessages(n int) []testMsg {
	out := make([]testMsg, n)
	for i := range out {
		id := fmt.Sprintf("m-%05d", i)
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 200)
		copy(p, id)
		out[i] = testMsg{id: id, payload: p}
	}
	return out
}

// A mode is one way the consumer handles its batches.
type mode struct {
	name   string // the subtest's
	label  string // the row's
	args   []string
	points []string
	// control: kills only at pointEffect, and the trial must see a
	// duplicate effect (the ledger can show one).
	control bool
}

// A row is what one broker and mode gave over a run.
type row struct {
	broker, mode                                string
	trials, messages, deliveries, kills, revals int
	caught, deadLetters, duplicates, lost       int
	longest                                     time.Duration
}

// The rows of the run, reported by TestMain.
var tally struct {
	sync.Mutex
	rows []*row
}

func addRow(r row) {
	tally.Lock()
	defer tally.Unlock()
	for _, cur := range tally.rows {
		if cur.broker == r.broker && cur.mode == r.mode {
			cur.trials += r.trials
			cur.messages += r.messages
			cur.deliveries += r.deliveries
			cur.kills += r.kills
			cur.revals += r.revals
			cur.caught += r.caught
			cur.deadLetters += r.deadLetters
			cur.duplicates += r.duplicates
			cur.lost += r.lost
			cur.longest = max(cur.longest, r.longest)
			return
		}
	}
	tally.rows = append(tally.rows, &r)
}

// table renders the rows as Markdown.
func table() string {
	tally.Lock()
	defer tally.Unlock()
	var b strings.Builder
	b.WriteString("| broker | inbox | trials | messages | redeliveries | SIGKILLs | rebalances | duplicates the inbox caught | dead-lettered | duplicate effects | lost messages | longest trial |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range tally.rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %v |\n", r.broker, r.mode, r.trials, r.messages,
			r.deliveries-r.messages, r.kills, r.revals, r.caught, r.deadLetters, r.duplicates, r.lost, r.longest.Round(100*time.Millisecond))
	}
	return b.String()
}

func TestMain(m *testing.M) {
	if os.Getenv(consumer.EnvVar) == "1" {
		os.Exit(consumer.Main(os.Args[1:]))
	}
	code := m.Run()
	tally.Lock()
	n := len(tally.rows)
	tally.Unlock()
	if n > 0 {
		t := table()
		if testing.Verbose() {
			fmt.Printf("broker trials:\n%s", t)
		}
		if p := os.Getenv("BROKERS_REPORT"); p != "" {
			if err := os.WriteFile(p, []byte(t), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, "BROKERS_REPORT:", err)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// runModes runs the trials of every mode on broker env.
func runModes(t *testing.T, env brokerEnv) {
	pgURL, redisAddr := chaos.ServerEnv(t, "IDEM_POSTGRES_URL"), chaos.ServerEnv(t, "IDEM_REDIS_ADDR")
	pool := chaos.Pool(t, pgURL)
	modes := []mode{
		{name: "tx-postgres", label: "PostgreSQL, InboxBatchTx (a transaction per batch)", args: []string{"-mode", "tx", "-store", "postgres"}, points: txPoints},
		{name: "batch-postgres", label: "PostgreSQL, Batch (HandleBatch)", args: []string{"-mode", "batch", "-store", "postgres"}, points: batchPoints},
		{name: "batch-redis", label: "Redis, Batch (HandleBatch)", args: []string{"-mode", "batch", "-store", "redis", "-redis", redisAddr}, points: batchPoints},
		{name: "control", label: "control: PostgreSQL, Batch, SIGKILL after an effect", args: []string{"-mode", "batch", "-store", "postgres"}, points: []string{pointEffect}, control: true},
	}
	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			// Each mode draws its own trials from the schedule's seed.
			s := chaos.FromEnv(t, 1)
			s.Seed += uint64(i)
			n := chaos.Run(t, s, func(t *testing.T, tr chaos.Trial) {
				r := runTrial(t, env, pool, pgURL, m, m.args, tr)
				addRow(r)
			})
			if n == 0 {
				t.Error("no trial ran")
			}
		})
	}
}

// trialMessageCount is BROKERS_MESSAGES, or trialMessages.
func trialMessageCount(t *testing.T) int {
	t.Helper()
	v := os.Getenv("BROKERS_MESSAGES")
	if v == "" {
		return trialMessages
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
		t.Fatalf("BROKERS_MESSAGES=%q: want a positive number", v)
	}
	return n
}

// A plan is one kill (or, for Kafka, a second consumer joining) planned
// for one consumer process.
type plan struct {
	point string        // a phase, or pointRandom
	at    int           // the phase's occurrence in the process, from 0
	after time.Duration // pointRandom: from the process's start
	join  bool          // instead of a kill: start the next consumer, let this one go on once it has partitions
}

func (p plan) args() []string {
	if p.point == "" || p.point == pointRandom {
		return nil
	}
	return []string{"-pause-at", fmt.Sprintf("%s:%d", p.point, p.at)}
}

// drawPlans draws the trial's kills: 2 or 3, at m's points.
func drawPlans(tr chaos.Trial, m mode, batch int) []plan {
	n := 2 + tr.Rand.IntN(2)
	if m.control {
		n = 1
	}
	plans := make([]plan, n)
	for i := range plans {
		p := plan{point: chaos.Pick(tr, m.points...)}
		switch p.point {
		case pointEffect, pointSettled:
			p.at = tr.Rand.IntN(batch)
		case pointRandom:
			p.after = tr.Between(100*time.Millisecond, 2*time.Second)
		default:
			p.at = tr.Rand.IntN(3)
		}
		plans[i] = p
	}
	return plans
}

// A consumerProc is one run of a consumer process.
type consumerProc struct {
	inst   int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *chaos.Buffer
	exited chan struct{}
	err    error // of Wait, once exited
	killed bool  // by the harness (read and written by the trial loop only)
	plan   plan
}

// A procEvent is a line of a process's stdout, or its exit (line "").
type procEvent struct {
	p    *consumerProc
	line string
	exit bool
}

// A fleet is a trial's consumer processes: instance i runs with args(i),
// and is restarted after each kill with the next plan.
type fleet struct {
	t       *testing.T
	args    func(inst int) []string
	events  chan procEvent
	procs   map[int]*consumerProc
	plans   []plan
	kills   int
	started int
}

func (f *fleet) start(inst int) *consumerProc {
	f.t.Helper()
	p := &consumerProc{inst: inst, stderr: &chaos.Buffer{}, exited: make(chan struct{})}
	if len(f.plans) > 0 {
		p.plan, f.plans = f.plans[0], f.plans[1:]
	}
	p.cmd = consumerCmd(f.t, append(f.args(inst), p.plan.args()...))
	p.cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		f.t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.started++
	f.t.Cleanup(func() { p.cmd.Process.Kill(); <-p.exited })
	f.procs[inst] = p
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			f.events <- procEvent{p: p, line: sc.Text()}
		}
		io.Copy(io.Discard, stdout)
		p.err = p.cmd.Wait()
		close(p.exited)
		f.events <- procEvent{p: p, exit: true}
	}()
	if p.plan.point == pointRandom {
		time.AfterFunc(p.plan.after, func() { f.events <- procEvent{p: p, line: "KILL-NOW"} })
	}
	return p
}

// kill SIGKILLs p (the loop then sees its exit).
func (f *fleet) kill(p *consumerProc) {
	select {
	case <-p.exited:
		return // already gone: not a kill of ours
	default:
	}
	p.killed = true
	p.cmd.Process.Signal(syscall.SIGKILL)
}

// stopAll stops every process with SIGTERM (they close their connections:
// what they hold unacknowledged goes back to the broker) and waits.
func (f *fleet) stopAll() {
	for _, p := range f.procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range f.procs {
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			f.t.Errorf("consumer %d did not stop on SIGTERM; killing it", p.inst)
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

// runTrial runs one trial of mode m on env and returns its row.
func runTrial(t *testing.T, env brokerEnv, pool *pgxpool.Pool, pgURL string, m mode, args []string, tr chaos.Trial) row {
	n := trialMessageCount(t)
	batch := chaos.Pick(tr, 10, 25, 50)
	instances := 2
	plans := drawPlans(tr, m, batch)
	name := fmt.Sprintf("idem_brk_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	t.Logf("%d messages, batches of %d, %d consumers; plans %+v", n, batch, instances, plans)

	// The ledger: one row per effect, no unique constraint.
	ledger := name + "_ledger"
	ctx, cancel := context.WithTimeout(context.Background(), 2*trialBudget)
	defer cancel()
	lq := pgx.Identifier{ledger}.Sanitize()
	chaos.DropTableLater(t, pool, ledger)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+lq+` (msg_id text NOT NULL, fence bigint NOT NULL, pid int NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	var runner *idempotency.Runner // on the consumers' store, to inspect it
	storeArgs := []string{"-table", name + "_keys"}
	if slices.Contains(args, "redis") {
		prefix := strings.ReplaceAll(name, "_", "-") + ":"
		storeArgs = []string{"-prefix", prefix}
		rdb := goredis.NewClient(&goredis.Options{Addr: chaos.ServerEnv(t, "IDEM_REDIS_ADDR"), PoolSize: 2})
		t.Cleanup(func() { chaos.DeleteRedisKeys(t, rdb, prefix); rdb.Close() })
		s, err := redis.New(rdb, &redis.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		runner = mustRunner(t, s)
	} else {
		s, err := postgres.New(pool, &postgres.Options{Table: name + "_keys"})
		if err != nil {
			t.Fatal(err)
		}
		chaos.DropTableLater(t, pool, name+"_keys")
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		runner = mustRunner(t, s)
	}

	msgs := testMessages(n)
	brokerArgs := env.prepare(t, name, msgs)
	common := append(slices.Clone(args), storeArgs...)
	common = append(common, "-postgres", pgURL, "-ledger", ledger, "-batch", fmt.Sprint(batch),
		"-lease", trialLease.String(), "-retry-delay", trialRetryDelay.String(),
		"-fail-rate", fmt.Sprint(trialFailRate), "-poison-every", fmt.Sprint(trialPoison),
		"-slow-every", fmt.Sprint(trialSlowEvery), "-slow", trialSlow.String())
	common = append(common, brokerArgs...) // last: a broker's flags win
	f := &fleet{t: t, events: make(chan procEvent, 1024), procs: make(map[int]*consumerProc), plans: plans,
		args: func(inst int) []string {
			return append(slices.Clone(common), "-instance", fmt.Sprintf("c%d", inst))
		}}

	// Kafka's trial joins its second consumer in the middle of a batch
	// (its first plan): the others start both at once.
	joins := 0
	if k, ok := env.(interface {
		joinPlan(tr chaos.Trial, batch int) plan
	}); ok && !m.control {
		f.plans = append([]plan{k.joinPlan(tr, batch)}, f.plans...)
		f.start(0)
	} else {
		for i := range instances {
			f.start(i)
		}
	}

	start := time.Now()
	deliveries := make(map[string]int)
	dead := make(map[string]bool)
	var caught int
	var joining *consumerProc // paused until the joined consumer has partitions
	poison := 0
	for _, msg := range msgs {
		if isPoison(msg.id) {
			poison++
		}
	}
	want := n - poison
	deadline := time.After(trialBudget)
	// After a drain check found deliveries left, the restarted consumers
	// get to settle some before the next stop: stopping them on the next
	// tick, before a slow machine has even started them, looped until the
	// budget ran out (CI saw it).
	var restarted time.Time
	settledSinceRestart := 0
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case ev := <-f.events:
			p := ev.p
			switch {
			case ev.exit:
				if f.procs[p.inst] != p {
					continue // stopped for a drain check
				}
				if !p.killed {
					t.Fatalf("consumer %d exited on its own: %v\n%s", p.inst, p.err, p.stderr.String())
				}
				f.kills++
				f.start(p.inst)
			case ev.line == "KILL-NOW":
				f.kill(p)
			case strings.HasPrefix(ev.line, "BATCH "):
				for id := range strings.SplitSeq(strings.TrimPrefix(ev.line, "BATCH "), ",") {
					deliveries[id]++
				}
			case strings.HasPrefix(ev.line, "DEAD "):
				dead[strings.TrimPrefix(ev.line, "DEAD ")] = true
			case strings.HasPrefix(ev.line, "SETTLED "):
				settledSinceRestart++
				if strings.HasSuffix(ev.line, " 1") {
					caught++
				}
			case strings.HasPrefix(ev.line, "PHASE "):
				if p.plan.join {
					joining = p
					joins++
					f.start(1)
				} else {
					f.kill(p)
				}
			case strings.HasPrefix(ev.line, "ASSIGNED "):
				if joining != nil && p.inst == 1 && ev.line != "ASSIGNED []" {
					t.Logf("consumer 1 joined the group mid-batch and got %s; consumer 0 goes on", strings.TrimPrefix(ev.line, "ASSIGNED "))
					io.WriteString(joining.stdin, "go\n")
					joining = nil
				}
			}
		case <-tick.C:
			if len(dead) < poison || ledgerDistinct(t, ctx, pool, lq) < want {
				continue
			}
			if env.stopped() {
				if since := time.Since(restarted); !restarted.IsZero() && (since < time.Second || settledSinceRestart == 0 && since < 10*time.Second) {
					continue // the restarted consumers have not settled a delivery yet
				}
				f.stopAll()
				time.Sleep(300 * time.Millisecond) // the broker requeues what the closed connections held
				if env.drained(t) {
					break loop
				}
				t.Logf("after a stop, the broker still had deliveries: restarting the consumers")
				for inst := range f.procs {
					f.start(inst)
				}
				restarted, settledSinceRestart = time.Now(), 0
				continue
			}
			if env.drained(t) {
				f.stopAll()
				break loop
			}
		case <-deadline:
			f.stopAll()
			missing := []string{}
			counts := ledgerCounts(t, ctx, pool, lq)
			for _, msg := range msgs {
				if counts[msg.id] == 0 && !isPoison(msg.id) {
					missing = append(missing, msg.id)
				}
			}
			var errs strings.Builder
			for _, p := range f.procs {
				fmt.Fprintf(&errs, "consumer %d:\n%s\n", p.inst, tail(p.stderr.String(), 2000))
			}
			t.Fatalf("not settled after %v: %d of %d events have an effect (missing %d: %v), %d of %d poison dead-lettered, broker drained: %v\n%s",
				trialBudget, len(counts), want, len(missing), head(missing, 10), len(dead), poison, env.drained(t), errs.String())
		}
	}
	elapsed := time.Since(start)

	// The ledger: one effect per event, none for the poison ones.
	r := row{broker: env.name(), mode: m.label, trials: 1, messages: n, kills: f.kills, revals: joins, caught: caught, longest: elapsed}
	counts := ledgerCounts(t, ctx, pool, lq)
	for _, msg := range msgs {
		c := counts[msg.id]
		r.deliveries += deliveries[msg.id]
		switch {
		case isPoison(msg.id):
			if c != 0 {
				t.Errorf("poison event %s has %d effects", msg.id, c)
			}
			if !dead[msg.id] {
				t.Errorf("poison event %s was not dead-lettered", msg.id)
			}
			r.deadLetters++
		case c == 0:
			r.lost++
			t.Errorf("event %s has no effect", msg.id)
		case c > 1:
			r.duplicates += c - 1
			if !m.control {
				t.Errorf("event %s has %d effects", msg.id, c)
			}
		}
	}
	if m.control && f.kills > 0 && r.duplicates == 0 {
		t.Errorf("the control saw no duplicate effect after %d kills after an effect: the trials could not see one either", f.kills)
	}
	if f.kills == 0 && !m.control {
		t.Logf("no planned kill happened (plans %+v)", plans)
	}
	// Nothing is left STARTED: every claim was completed or released (a
	// dead consumer's were taken over).
	stuck, _, err := runner.Stuck(ctx, "", 10)
	if err != nil {
		t.Errorf("Stuck: %v", err)
	} else if len(stuck) > 0 {
		t.Errorf("%d records left STARTED, the first %+v", len(stuck), stuck[0])
	}
	t.Logf("%s, %s: %d messages, %d deliveries, %d kills, %d joins, %d duplicates caught, %d dead-lettered, %d duplicate effects, %d lost, in %v",
		r.broker, r.mode, r.messages, r.deliveries, r.kills, r.revals, r.caught, r.deadLetters, r.duplicates, r.lost, elapsed.Round(time.Millisecond))
	return r
}

// isPoison reports whether the consumer fails event id permanently
// (-poison-every trialPoison).
func isPoison(id string) bool {
	var n int
	fmt.Sscanf(id, "m-%d", &n)
	return n%trialPoison == 0
}

func ledgerDistinct(t *testing.T, ctx context.Context, pool *pgxpool.Pool, lq string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT msg_id) FROM `+lq).Scan(&n); err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	return n
}

func ledgerCounts(t *testing.T, ctx context.Context, pool *pgxpool.Pool, lq string) map[string]int {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT msg_id, count(*) FROM `+lq+` GROUP BY msg_id`)
	if err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int
	}, error) {
		var v struct {
			id string
			n  int
		}
		err := r.Scan(&v.id, &v.n)
		return v, err
	})
	if err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	m := make(map[string]int, len(out))
	for _, v := range out {
		m[v.id] = v.n
	}
	return m
}

func head(s []string, n int) []string { return s[:min(n, len(s))] }

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// consumerCmd is the command of a consumer process: this test binary,
// which runs package consumer's Main instead of the tests (see TestMain).
func consumerCmd(t *testing.T, args []string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), consumer.EnvVar+"=1")
	return cmd
}

func mustRunner(t *testing.T, s idempotency.Store) *idempotency.Runner {
	t.Helper()
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
