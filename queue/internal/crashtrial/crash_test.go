package crashtrial_test

// The trial. The parent (this test) serves POST /effect behind the
// httpidem middleware, on PostgreSQL or on Redis; its handler's effect is
// an entry in a ledger that has no unique constraint, so a second run of
// an item shows as a second entry. The client is ./client, run as a
// child process: it opens the queue's
// file, enqueues the items it is given while it submits, and says what it
// does on stdout, holding at two points until the parent answers:
//
//	START i          Enqueue of item i begins
//	ENQ i KEY        Enqueue of item i returned KEY: acknowledged
//	SEND KEY         an attempt is about to leave (WithPrepare); holds
//	DONE KEY STATUS  the handler got a definitive answer (WithOnDone),
//	                 before the item is removed; holds
//	IDLE             every item given is enqueued and none is pending
//
// Each trial draws its items (orders, count) and, for each run of the
// client but the last, where to SIGKILL it: just after a START (inside
// Enqueue), at a SEND (before the request leaves), while the server's
// handler runs one of its requests (the answer will be lost), at a DONE
// (answered, not yet removed), or at a random time. Then the client is
// started again on the same file with the items not yet started, until a
// run ends by itself.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/queue"
	"github.com/exactlyonce/idempotency/queue/internal/crashtrial"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

// defaultTrials is the trials per backend of `make test` (a few seconds
// each under -race on a shared 2-core machine).
const defaultTrials = 8

type item = crashtrial.Item

// server is the service under test: its ledger of effects, and a hook
// its handler calls before each effect.
type server struct {
	url  string
	mu   sync.Mutex
	rnd  *rand.Rand
	calm bool // no drawn failures
	led  []item
	keys []string
	hook atomic.Pointer[func(key string)]
}

func (s *server) effects(trial int) (items []item, keys []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, it := range s.led {
		if it.Trial == trial {
			items, keys = append(items, it), append(keys, s.keys[i])
		}
	}
	return items, keys
}

func serve(t testing.TB, store idempotency.Store, seed uint64) *server {
	t.Helper()
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		return []string{"crashtrial", r.Pattern}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	s := &server{rnd: rand.New(rand.NewPCG(seed, 7))}
	mux := http.NewServeMux()
	mux.Handle("POST /effect", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var it item
		if err := json.NewDecoder(r.Body).Decode(&it); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		x := s.rnd.IntN(20)
		if s.calm {
			x = 19
		}
		s.mu.Unlock()
		switch {
		case x < 2: // overloaded, before the effect: released, retried
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case x < 3:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case x < 6:
			time.Sleep(time.Duration(x) * time.Millisecond)
		}
		key := r.Header.Get("Idempotency-Key")
		if h := s.hook.Load(); h != nil {
			(*h)(key)
		}
		s.mu.Lock()
		s.led = append(s.led, it)
		s.keys = append(s.keys, key)
		n := len(s.led)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"effect":%d}`, n)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/effect"
	return s
}

// stores returns an idempotency store on the PostgreSQL server of
// IDEM_POSTGRES_URL and one on the Redis server of IDEM_REDIS_ADDR, each
// with a table or prefix of its own, removed after the test.
func stores(t testing.TB) (pg, rs idempotency.Store) {
	t.Helper()
	pgURL, redisAddr := env(t, "IDEM_POSTGRES_URL"), env(t, "IDEM_REDIS_ADDR")
	run := fmt.Sprintf("queuecrash_%d_%08x", os.Getpid(), rand.Uint32())
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pgs, err := postgres.New(pool, &postgres.Options{Table: run})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pgs.Migrate(mctx); err != nil {
		t.Fatalf("IDEM_POSTGRES_URL: %v", err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{run}.Sanitize())
	})
	rdb := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("IDEM_REDIS_ADDR: %v", err)
	}
	prefix := strings.ReplaceAll(run, "_", "-") + ":"
	rds, err := redis.New(rdb, &redis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var cursor uint64
		for {
			keys, next, err := rdb.Scan(context.Background(), cursor, prefix+"*", 1000).Result()
			if err != nil {
				return
			}
			if len(keys) > 0 {
				rdb.Unlink(context.Background(), keys...)
			}
			if cursor = next; cursor == 0 {
				return
			}
		}
	})
	return pgs, rds
}

// buildClient builds the client (./client) without the race detector.
func buildClient(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "client")
	cmd := exec.Command("go", "build", "-o", bin, "./client")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the client: %v\n%s", err, out)
	}
	return bin
}

func env(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run make test, which starts the servers, or start one with scripts/servers/*.sh start DIR", name)
	}
	return v
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}

// A row of the trial's table.
type row struct {
	backend                                             string
	trials, items, kills, dups, lost, reordered, retold int
	inDoubt, inDoubtRan                                 int
	byPoint                                             map[string]int // kills by kill point
}

func TestCrash(t *testing.T) {
	trials := envInt(t, "QUEUE_CRASH_TRIALS", defaultTrials)
	seed := uint64(envInt(t, "QUEUE_CRASH_SEED", 20261201))
	bin := buildClient(t)

	pg, rs := stores(t)

	// The control: a client that makes a new key per attempt, killed
	// while the server runs its request, must show a second effect, or
	// the trials below could not see one either.
	t.Run("control", func(t *testing.T) {
		srv := serve(t, rs, seed)
		srv.calm = true
		tr := &trial{t: t, bin: bin, srv: srv, index: 1 << 20, dir: t.TempDir(), unsafe: true,
			started: map[int]bool{}, acked: map[int]string{}, dones: map[string]int{}}
		tr.items = []item{{Trial: tr.index, Order: "o0"}}
		file := filepath.Join(tr.dir, "client.queue")
		if !tr.client(file, tr.items, &plan{point: killInFlight, nth: 1}) {
			t.Fatal("the client was not killed while the server ran its request")
		}
		tr.client(file, nil, nil)
		if effects, _ := srv.effects(tr.index); len(effects) != 2 {
			t.Errorf("%d effects, want 2: the harness cannot see a second run", len(effects))
		}
	})

	var rows []row
	for _, b := range []struct {
		name  string
		store idempotency.Store
	}{{"postgres", pg}, {"redis", rs}} {
		t.Run(b.name, func(t *testing.T) {
			srv := serve(t, b.store, seed)
			r := row{backend: "httpidem on " + b.name, byPoint: map[string]int{}}
			for i := range trials {
				tr := &trial{t: t, bin: bin, srv: srv, index: i, rnd: rand.New(rand.NewPCG(seed, uint64(i))), dir: t.TempDir()}
				ok := t.Run(strconv.Itoa(i), func(t *testing.T) {
					tr.t = t
					tr.run(&r)
				})
				if !ok {
					t.Fatalf("trial %d failed; replay it with QUEUE_CRASH_SEED=%d and the trial's index", i, seed)
				}
				r.trials++
			}
			rows = append(rows, r)
			if r.kills == 0 {
				t.Error("no client was killed")
			}
		})
	}
	var sb strings.Builder
	sb.WriteString("| server | trials | items | kills | duplicate effects | lost items | reordered items | answers told again after a kill |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %d | %d | %d | %d | %d | %d | %d |\n", r.backend, r.trials, r.items, r.kills, r.dups, r.lost, r.reordered, r.retold)
	}
	t.Logf("crash trial, seed %d:\n%s", seed, sb.String())
	for _, r := range rows {
		t.Logf("%s: kills by point %v; %d items were being enqueued when their client was killed, %d of them were stored and ran once",
			r.backend, r.byPoint, r.inDoubt, r.inDoubtRan)
	}
	if f := os.Getenv("QUEUE_CRASH_REPORT"); f != "" {
		os.WriteFile(f, []byte(sb.String()), 0o644)
	}
}

// trial is one trial's state in the parent.
type trial struct {
	t      *testing.T
	bin    string // the client
	unsafe bool   // the client makes a new key per attempt (the control)
	srv    *server
	index  int
	rnd    *rand.Rand
	dir    string

	items   []item
	started map[int]bool
	acked   map[int]string // item → key
	dones   map[string]int // key → definitive answers told
	kills   int
	points  map[string]int // kills by point

	lastStderr string
}

// Kill points.
const (
	killEnqueue  = "enqueue"  // just after a START: inside Enqueue
	killSend     = "send"     // at a SEND: the request has not left
	killInFlight = "inflight" // while the server's handler runs the request
	killAnswered = "answered" // at a DONE: answered, not removed
	killRandom   = "random"   // at a random time
)

type plan struct {
	point string
	nth   int           // the nth occurrence of the point in the run
	after time.Duration // killRandom
}

func (tr *trial) run(r *row) {
	t := tr.t
	orders := 1 + tr.rnd.IntN(3)
	n := 8 + tr.rnd.IntN(13)
	seq := map[string]int{}
	for i := range n {
		o := "o" + strconv.Itoa(tr.rnd.IntN(orders))
		tr.items = append(tr.items, item{Trial: tr.index, Index: i, Order: o, Seq: seq[o]})
		seq[o]++
	}
	tr.started, tr.acked, tr.dones = map[int]bool{}, map[int]string{}, map[string]int{}
	kills := 2 + tr.rnd.IntN(4)
	file := filepath.Join(tr.dir, "client.queue")
	next := 0
	for runs := 0; ; runs++ {
		if runs > 40 {
			t.Fatal("the client did not finish in 40 runs")
		}
		var p *plan
		if runs < kills {
			p = &plan{
				point: []string{killEnqueue, killSend, killInFlight, killAnswered, killRandom}[tr.rnd.IntN(5)],
				nth:   1 + tr.rnd.IntN(3),
				after: time.Duration(tr.rnd.IntN(60)) * time.Millisecond,
			}
		}
		t0 := time.Now()
		k := tr.client(file, tr.items[next:], p)
		if os.Getenv("CRASHTRIAL_DEBUG") != "" {
			t.Logf("%s", tr.lastStderr)
			t.Logf("run %d: %d items from %d, plan %+v, killed %v, %v", runs, len(tr.items)-next, next, p, k, time.Since(t0))
		}
		if !k {
			break // it ended by itself: every item enqueued, none pending
		}
		next = 0
		for i := range tr.items {
			if tr.started[i] {
				next = i + 1
			}
		}
	}
	tr.check(file, r)
}

// client runs the client once with items to enqueue and, if p is set,
// kills it at p; it reports whether it killed it.
func (tr *trial) client(file string, items []item, p *plan) bool {
	t := tr.t
	spec, _ := json.Marshal(items)
	cmd := exec.Command(tr.bin)
	cmd.Env = append(os.Environ(), "CRASHTRIAL_UNSAFE_NEW_KEY="+map[bool]string{true: "1"}[tr.unsafe], "CRASHTRIAL_FILE="+file,
		"CRASHTRIAL_URL="+tr.srv.url, "CRASHTRIAL_ITEMS="+string(spec))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// The server's hook: on the nth request of this run, the parent kills
	// the client while the handler holds, then lets it go on.
	inflight := make(chan chan struct{})
	var requests atomic.Int64
	if p != nil && p.point == killInFlight {
		hook := func(key string) {
			if requests.Add(1) != int64(p.nth) {
				return
			}
			proceed := make(chan struct{})
			select {
			case inflight <- proceed:
				<-proceed
			case <-time.After(10 * time.Second):
			}
		}
		tr.srv.hook.Store(&hook)
		defer tr.srv.hook.Store(nil)
	}
	var random <-chan time.Time
	if p != nil && p.point == killRandom {
		random = time.After(p.after)
	}
	var proceed chan struct{} // the held handler's, once the client is killed in flight
	killed := false
	kill := func() {
		if !killed {
			cmd.Process.Signal(syscall.SIGKILL)
			killed = true
			tr.kills++
			if tr.points == nil {
				tr.points = map[string]int{}
			}
			if p != nil {
				tr.points[p.point]++
			}
		}
	}
	counts := map[string]int{}
	at := func(point string) bool {
		counts[point]++
		return p != nil && p.point == point && counts[point] == p.nth && !killed
	}
	timeout := time.After(60 * time.Second)
loop:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break loop
			}
			f := strings.Fields(line)
			switch f[0] {
			case "START":
				i, _ := strconv.Atoi(f[1])
				tr.started[i] = true
				if at(killEnqueue) {
					kill()
				}
			case "ENQ":
				i, _ := strconv.Atoi(f[1])
				tr.acked[i] = f[2]
			case "SEND":
				if at(killSend) {
					kill()
				} else if !killed {
					io.WriteString(stdin, "go\n")
				}
			case "DONE":
				if f[2] != "201" {
					t.Errorf("the handler got %s for %s, want 201", f[2], f[1])
				}
				tr.dones[f[1]]++
				if at(killAnswered) {
					kill()
				} else if !killed {
					io.WriteString(stdin, "go\n")
				}
			case "IDLE":
			default:
				t.Errorf("the client said %q", line)
			}
		case proceed = <-inflight:
			// The handler goes on only once the client is dead (below):
			// its answer reaches nobody.
			kill()
		case <-random:
			kill()
		case <-timeout:
			kill()
			t.Errorf("the client hung; stderr:\n%s", stderr.String())
		}
	}
	err = cmd.Wait()
	if proceed != nil {
		close(proceed)
	}
	tr.lastStderr = stderr.String()
	if !killed && err != nil {
		t.Fatalf("the client failed: %v\n%s", err, stderr.String())
	}
	return killed
}

// check counts the trial's effects against what the client acknowledged.
func (tr *trial) check(file string, r *row) {
	t := tr.t
	effects, keys := tr.srv.effects(tr.items[0].Trial)
	count := map[int]int{}
	lastSeq := map[string]int{}
	for i, e := range effects {
		count[e.Index]++
		if k, ok := tr.acked[e.Index]; ok && k != keys[i] {
			t.Errorf("item %d ran with key %s, Enqueue returned %s", e.Index, keys[i], k)
		}
		if s, ok := lastSeq[e.Order]; ok && e.Seq <= s {
			r.reordered++
			t.Errorf("order %s: item %d (seq %d) ran after seq %d", e.Order, e.Index, e.Seq, s)
		}
		lastSeq[e.Order] = e.Seq
	}
	for i := range tr.items {
		c := count[i]
		key, acked := tr.acked[i]
		switch {
		case c > 1:
			r.dups += c - 1
			t.Errorf("item %d ran %d times", i, c)
		case acked && c == 0:
			r.lost++
			t.Errorf("item %d (key %s) was acknowledged and never ran", i, key)
		case acked && tr.dones[key] == 0:
			r.lost++
			t.Errorf("item %d (key %s) ran, but its answer never reached the handler", i, key)
		case !acked && tr.started[i]:
			r.inDoubt++
			if c == 1 {
				r.inDoubtRan++
			}
		case !acked && c > 0:
			t.Errorf("item %d ran but was never enqueued", i)
		}
		if acked {
			r.items++
			if tr.dones[key] > 1 {
				r.retold++
			}
		}
	}
	r.kills += tr.kills
	for k, n := range tr.points {
		if r.byPoint != nil {
			r.byPoint[k] += n
		}
	}
	q, err := queue.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if p, d, err := q.Len(); p != 0 || d != 0 || err != nil {
		t.Errorf("the client's queue has %d pending, %d dead (%v), want none", p, d, err)
	}
}
