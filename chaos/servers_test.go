package chaos_test

// Servers of the network-fault and failover trials: an in-process
// toxiproxy in front of a store, and store servers of the test's own that
// it may kill, promote or restart (never the shared ones of the
// environment). Everything listens on 127.0.0.1 and is stopped by the
// test's cleanup, also when the test fails.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// srvQuietRedis drops go-redis's log lines (a dial refused by a killed
// primary is logged for every pooled connection); the trials count the
// errors themselves.
type srvQuietRedis struct{}

func (srvQuietRedis) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(srvQuietRedis{}) }

// srvEnv returns the environment variable name, failing the test when it
// is unset: a backend test that cannot reach its server fails, never
// skips. `make test` (scripts/test.sh) sets them.
func srvEnv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		tb.Fatalf("%s is not set: run the chaos tests through `make test`, or source the exports of scripts/servers/*.sh start DIR", name)
	}
	return v
}

// srvRunID is a random prefix that keeps one run's keys and rows apart
// from another's on the shared servers.
func srvRunID(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// A srvProxy is a toxiproxy proxy, run in the test process, between a
// store client and its server. Clients dial it with Dial, which reaches
// the current proxy: toxiproxy v2.12.0 can wedge while removing a toxic
// (ToxicLink.RemoveToxic waits forever on a stub's interrupt, seen once
// in about 2,000 trials, with a slicer on Redis traffic), and then Clear
// replaces it with a new proxy, so that one wedged proxy does not hang
// the run.
type srvProxy struct {
	tb       testing.TB
	name     string
	upstream string
	mu       sync.Mutex
	proxy    *toxiproxy.Proxy
	Wedged   atomic.Int64 // proxies replaced after a toxic's removal hung
}

// srvToxiproxy starts a toxiproxy proxy to upstream on a free loopback
// port; it stops at the end of the test.
func srvToxiproxy(tb testing.TB, name, upstream string) *srvProxy {
	tb.Helper()
	p := &srvProxy{tb: tb, name: name, upstream: upstream}
	p.proxy = p.start()
	tb.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.proxy.Stop()
	})
	return p
}

func (p *srvProxy) start() *toxiproxy.Proxy {
	p.tb.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	px := toxiproxy.NewProxy(server, p.name, "127.0.0.1:0", p.upstream)
	if err := px.Start(); err != nil {
		p.tb.Fatalf("toxiproxy %s -> %s: %v", p.name, p.upstream, err)
	}
	return px
}

// Addr is where the current proxy listens.
func (p *srvProxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proxy.Listen
}

// Dial connects to the current proxy, whatever address it is given.
func (p *srvProxy) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", p.Addr())
}

// A srvToxic is a toxic as toxiproxy's API takes it.
type srvToxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Toxicity   float32        `json:"toxicity"`
	Attributes map[string]int `json:"attributes"`
}

// Add puts the toxic on every connection through the proxy, open or new.
func (p *srvProxy) Add(tx srvToxic) {
	p.tb.Helper()
	if tx.Toxicity == 0 {
		tx.Toxicity = 1
	}
	b, err := json.Marshal(tx)
	if err != nil {
		p.tb.Fatal(err)
	}
	p.mu.Lock()
	px := p.proxy
	p.mu.Unlock()
	if _, err := px.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
		p.tb.Fatalf("add toxic %s: %v", b, err)
	}
}

// Clear removes every toxic. If toxiproxy does not manage within a few
// seconds, the wedged proxy is left behind (its connections stay stuck
// until the clients give up on them) and a new one takes its place.
func (p *srvProxy) Clear() {
	p.mu.Lock()
	px := p.proxy
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		px.Toxics.ResetToxics(context.Background())
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(5 * time.Second):
	}
	p.Wedged.Add(1)
	p.tb.Logf("toxiproxy wedged removing a toxic; replacing the proxy")
	fresh := p.start()
	p.mu.Lock()
	p.proxy = fresh
	p.mu.Unlock()
}

// srvFreePort returns a loopback port nothing listens on (another process
// may take it before it is used; the callers retry on that).
func srvFreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// A srvRedis is a redis-server process of the test's own, without
// persistence, which the test may kill or promote.
type srvRedis struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// srvStartRedis starts redis-server on a free loopback port with the extra
// arguments; it is killed at the end of the test if still running.
func srvStartRedis(tb testing.TB, args ...string) *srvRedis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not installed (scripts/servers/redis.sh installs it): %v", err)
	}
	for attempt := 0; ; attempt++ {
		port := srvFreePort(tb)
		dir := tb.TempDir()
		argv := append([]string{"--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--repl-diskless-sync-delay", "0", "--logfile", filepath.Join(dir, "redis.log")}, args...)
		cmd := exec.Command(bin, argv...)
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		s := &srvRedis{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(s.done) }()
		tb.Cleanup(s.Kill)
		if err := s.waitPing(5 * time.Second); err == nil {
			return s
		} else if attempt == 3 {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			tb.Fatalf("redis-server on %s: %v\n%s", s.Addr, err, log)
		}
		s.Kill() // the port was taken meanwhile: try another
	}
}

func (s *srvRedis) waitPing(limit time.Duration) error {
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("redis-server exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL (a crash: nothing more is sent to
// its replicas) and waits until it is gone.
func (s *srvRedis) Kill() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// srvWaitReplica waits until the replica's link to its primary is up and
// it has caught up with the primary's replication offset.
func srvWaitReplica(tb testing.TB, primary, replica *goredis.Client, limit time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := replica.Info(ctx, "replication").Result()
		pinfo, perr := primary.Info(ctx, "replication").Result()
		cancel()
		if err == nil && perr == nil && strings.Contains(info, "master_link_status:up") &&
			srvInfoField(info, "slave_repl_offset") != "" && srvInfoField(info, "slave_repl_offset") == srvInfoField(pinfo, "master_repl_offset") {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("replica did not catch up in %v: %v %v\n%s", limit, err, perr, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func srvInfoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), name+":"); ok {
			return v
		}
	}
	return ""
}

// A srvPostgres is a PostgreSQL server of the test's own, started with
// scripts/servers/postgres.sh on a DIR of its own (never the shared
// server of IDEM_POSTGRES_URL), which the test may stop and start.
type srvPostgres struct {
	tb     testing.TB
	dir    string
	script string
	URL    string
}

var srvExportURL = regexp.MustCompile(`IDEM_POSTGRES_URL='([^']+)'`)

// srvStartPostgres starts the server (initdb on the first run: the data
// lives in a directory keyed by this checkout, so later runs reuse it)
// and stops it at the end of the test.
func srvStartPostgres(tb testing.TB) *srvPostgres {
	tb.Helper()
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	root, err := filepath.Abs(filepath.Join(wd, ".."))
	if err != nil {
		tb.Fatal(err)
	}
	sum := 0
	for _, c := range root {
		sum = sum*31 + int(c)
	}
	p := &srvPostgres{
		tb:     tb,
		dir:    filepath.Join(os.TempDir(), fmt.Sprintf("idem-chaos-postgres-%x", uint32(sum))),
		script: filepath.Join(root, "scripts", "servers", "postgres.sh"),
	}
	tb.Cleanup(func() { p.run("stop") })
	p.Start()
	return p
}

func (p *srvPostgres) run(verb string) string {
	p.tb.Helper()
	cmd := exec.Command("bash", p.script, verb, p.dir)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_POSTGRES_URL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		p.tb.Fatalf("postgres.sh %s %s: %v\n%s", verb, p.dir, err, stderr.String())
	}
	return string(out)
}

// Start starts the server (again) and sets URL; the port may differ from
// the last start's.
func (p *srvPostgres) Start() {
	p.tb.Helper()
	m := srvExportURL.FindStringSubmatch(p.run("start"))
	if m == nil {
		p.tb.Fatalf("postgres.sh start %s printed no IDEM_POSTGRES_URL", p.dir)
	}
	p.URL = m[1]
}

// Stop stops the server with pg_ctl's mode: "fast" (a clean shutdown:
// sessions are ended, a checkpoint is written) or "immediate" (every
// server process quits at once; the next start replays the WAL, as after
// a crash).
func (p *srvPostgres) Stop(mode string) {
	p.tb.Helper()
	rootb, err := os.ReadFile(filepath.Join(p.dir, "postgres.root"))
	if err != nil {
		p.tb.Fatal(err)
	}
	data := filepath.Join(strings.TrimSpace(string(rootb)), "data")
	cmd := exec.Command("runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "stop", "-D", data, "-m", mode, "-w", "-t", "30")
	if out, err := cmd.CombinedOutput(); err != nil {
		p.tb.Fatalf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
}
