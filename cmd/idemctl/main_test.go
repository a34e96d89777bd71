package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/zap"
)

// The MongoDB backend runs where IDEM_MONGO_URI is given (scripts/test.sh
// gets one from scripts/servers/mongo.sh when a Docker daemon answers);
// where IDEM_MONGO_ABSENT says why none could be had, it is skipped and
// TestMain says so loudly; with neither, the tests fail.
func TestMain(m *testing.M) {
	code := m.Run()
	if os.Getenv("IDEM_MONGO_URI") == "" {
		if reason := os.Getenv("IDEM_MONGO_ABSENT"); reason != "" {
			fmt.Fprintf(os.Stderr, "\n!!! cmd/idemctl: THE MONGODB BACKEND WAS NOT TESTED: %s. !!!\n\n", reason)
		} else {
			fmt.Fprintln(os.Stderr, "\nFAIL cmd/idemctl: the MongoDB backend needs IDEM_MONGO_URI (or IDEM_MONGO_ABSENT set to the reason there is none): run scripts/test.sh")
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// backend is a store for the tests and the idemctl flags that reach it.
type backend struct {
	store idempotency.Store
	flags []string
	// sweeps: the store has a Sweeper (the others expire records
	// themselves).
	sweeps bool
}

func need(t *testing.T, v string) string {
	t.Helper()
	s := os.Getenv(v)
	if s == "" {
		t.Fatalf("%s is not set: run scripts/test.sh (it starts the servers) or set it", v)
	}
	return s
}

func redisBackend(t *testing.T, c goredis.UniversalClient, flags ...string) backend {
	t.Cleanup(func() { c.Close() })
	prefix := fmt.Sprintf("idemctl-%d:", time.Now().UnixNano())
	s, err := redis.New(c, &redis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return backend{store: s, flags: append(flags, "-prefix", prefix)}
}

var backends = map[string]func(t *testing.T) backend{
	"postgres": func(t *testing.T) backend {
		url := need(t, "IDEM_POSTGRES_URL")
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema := fmt.Sprintf("idemctl_%d", time.Now().UnixNano())
		if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
			t.Fatalf("cannot use the PostgreSQL at IDEM_POSTGRES_URL: %v", err)
		}
		t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
		s, err := postgres.New(pool, &postgres.Options{Schema: schema, Table: "keys"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return backend{s, []string{"-postgres", url, "-schema", schema, "-table", "keys"}, true}
	},
	"redis": func(t *testing.T) backend {
		addr := need(t, "IDEM_REDIS_ADDR")
		return redisBackend(t, goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true}), "-redis", addr)
	},
	"redis-cluster": func(t *testing.T) backend {
		addrs := need(t, "IDEM_REDIS_CLUSTER_ADDRS")
		return redisBackend(t, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(addrs, ","), ContextTimeoutEnabled: true}), "-redis-cluster", addrs)
	},
	"etcd": func(t *testing.T) backend {
		eps := need(t, "IDEM_ETCD_ENDPOINTS")
		c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(eps, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		prefix := fmt.Sprintf("idemctl-%d/", time.Now().UnixNano())
		t.Cleanup(func() { c.Delete(context.Background(), prefix, clientv3.WithPrefix()) })
		s, err := idemetcd.New(c, &idemetcd.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return backend{store: s, flags: []string{"-etcd-endpoints", eps, "-prefix", prefix}}
	},
	"mongo": func(t *testing.T) backend {
		uri := os.Getenv("IDEM_MONGO_URI")
		if uri == "" {
			t.Skipf("MongoDB not tested: %s", os.Getenv("IDEM_MONGO_ABSENT"))
		}
		c, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Disconnect(context.Background()) })
		coll := c.Database("idemctltest").Collection(fmt.Sprintf("keys_%d", time.Now().UnixNano()))
		t.Cleanup(func() { coll.Drop(context.Background()) })
		s, err := idemmongo.New(coll, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(context.Background()); err != nil { // creates the collection and its indexes, as the service does
			t.Fatal(err)
		}
		return backend{s, []string{"-mongo-uri", uri, "-mongo-database", "idemctltest", "-mongo-collection", coll.Name()}, true}
	},
}

func noEnv(string) string { return "" }

func idemctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return idemctlEnv(t, noEnv, args...)
}

func idemctlEnv(t *testing.T, getenv func(string) string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, getenv, &out, &errOut)
	return code, out.String(), errOut.String()
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// crashed leaves the record of req as a holder that died does: claimed
// with a lease of a second, one checkpoint recorded, never renewed. It
// returns the claim's fence once the lease has ended by the store's
// judgement.
func crashed(t *testing.T, r *idempotency.Runner, s idempotency.Store, req idempotency.Request, checkpoint string) int64 {
	t.Helper()
	ctx := context.Background()
	sk, _ := r.StorageKey(req)
	tok := idempotency.Token("dead-" + req.Key)
	claim, err := s.Claim(ctx, idempotency.ClaimRequest{Key: sk, Fingerprint: req.Fingerprint, Token: tok, Lease: time.Second, Grace: time.Hour})
	if err != nil || claim.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim: %+v %v", claim, err)
	}
	if checkpoint != "" {
		if err := s.Checkpoint(ctx, sk, tok, checkpoint, []byte(`"ch_1"`)); err != nil {
			t.Fatal(err)
		}
	}
	return claim.Fence
}

// ended waits until the store judges every lease of reqs ended.
func ended(t *testing.T, r *idempotency.Runner, reqs ...idempotency.Request) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, req := range reqs {
		for {
			info, err := r.Inspect(context.Background(), req, false)
			if err != nil {
				t.Fatal(err)
			}
			if info.LeaseLeft == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the lease of %q has not ended: %+v", req.Key, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestCommands runs every command against real servers in the support
// scenario: a completed payment, payments whose holders died (a retry
// would get 409 until their lease ends, then take them over), an unknown
// key; then resolves the dead ones by hand as an operator who checked
// the gateway: one charged (complete), one not (release), one purged.
func TestCommands(t *testing.T) {
	names := make([]string, 0, len(backends))
	for name := range backends {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			b := backends[name](t)
			r, err := idempotency.New(b.store, idempotency.WithLease(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			scope := []string{"acct_42", "POST /payments"}
			sflags := cat(b.flags, []string{"-scope", scope[0], "-scope", scope[1]})
			request := func(key string) idempotency.Request {
				return idempotency.Request{Scope: scope, Key: key, Fingerprint: "fp"}
			}
			if _, err := idempotency.Do(ctx, r, request("order-1"), func(context.Context) (string, error) { return "ch_secret", nil }); err != nil {
				t.Fatal(err)
			}

			// Nothing stuck yet: JSON says [], never null.
			code, out, errOut := idemctl(t, cat(b.flags, []string{"-json", "stuck"})...)
			if code != 0 || strings.TrimSpace(out) != "[]" {
				t.Fatalf("-json stuck with nothing stuck: %d %q %s", code, out, errOut)
			}
			code, out, _ = idemctl(t, cat(b.flags, []string{"-json", "reconcile", "-dry-run"})...)
			if code != 0 || strings.TrimSpace(out) != "[]" {
				t.Fatalf("-json reconcile -dry-run with nothing stuck: %d %q", code, out)
			}

			charged, declined, purged := request("order-2"), request("order-3"), request("order-4")
			fence := crashed(t, r, b.store, charged, "charge")
			crashed(t, r, b.store, declined, "")
			crashed(t, r, b.store, purged, "")

			code, out, _ = idemctl(t, cat(sflags, []string{"inspect", "order-1"})...)
			if code != 0 || !strings.Contains(out, "state:        completed") || strings.Contains(out, "ch_secret") {
				t.Fatalf("inspect completed: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, cat(sflags, []string{"inspect", "-result", "order-1"})...)
			if code != 0 || !strings.Contains(out, `result:       value "ch_secret"`) {
				t.Fatalf("inspect -result: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, cat(sflags, []string{"inspect", "order-2"})...)
			if code != 0 || !strings.Contains(out, "state:        started") || !strings.Contains(out, "holder is running") || !strings.Contains(out, "checkpoints:  charge") {
				t.Fatalf("inspect live: %d\n%s", code, out)
			}
			// Resolving a record whose holder's lease is live is refused
			// with exit 4, and changes nothing.
			sk5, _ := r.StorageKey(request("order-5"))
			if _, err := b.store.Claim(ctx, idempotency.ClaimRequest{Key: sk5, Fingerprint: "fp", Token: "live", Lease: time.Hour, Grace: time.Hour}); err != nil {
				t.Fatal(err)
			}
			code, _, errOut = idemctl(t, cat(sflags, []string{"release", "-yes", "order-5"})...)
			if code != exitNotStuck || !strings.Contains(errOut, "lease has") {
				t.Fatalf("release of a live record: %d %s", code, errOut)
			}
			if info, err := r.Inspect(ctx, request("order-5"), false); err != nil || info.Attempt != 1 || info.LeaseLeft < time.Minute {
				t.Fatalf("the live record after the refused release: %+v %v", info, err)
			}
			if code, _, errOut := idemctl(t, cat(sflags, []string{"inspect", "order-9"})...); code != exitNotFound || !strings.Contains(errOut, "no such record") {
				t.Fatalf("inspect unknown: %d %s", code, errOut)
			}
			if code, out, errOut := idemctl(t, cat(sflags, []string{"purge", "-yes", "order-9"})...); code != exitNotFound || !strings.Contains(errOut, "no such record") {
				t.Fatalf("purge of a missing key: %d %s %s; want %d", code, out, errOut, exitNotFound)
			}

			ended(t, r, charged, declined, purged)
			code, out, _ = idemctl(t, cat(sflags, []string{"inspect", "order-2"})...)
			if code != 0 || !strings.Contains(out, "stopped renewing") {
				t.Fatalf("inspect stuck: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, cat(b.flags, []string{"-json", "stuck", "-limit", "10"})...)
			var listed []recordView
			if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 3 {
				t.Fatalf("stuck: %d\n%s", code, out)
			}
			for _, v := range listed {
				if v.Key == "order-2" && (v.Fence != fence || v.Scope[0] != "acct_42" || v.State != "started") {
					t.Errorf("stuck listed %+v; want fence %d", v, fence)
				}
			}

			// The dry run shows what a resolver would be handed, with the
			// downstream key fn would have used.
			sk, _ := r.StorageKey(charged)
			down := idempotency.DownstreamKeyOf(sk, "charge")
			code, out, _ = idemctl(t, cat(b.flags, []string{"reconcile", "-dry-run", "-downstream", "charge"})...)
			if code != 0 || !strings.Contains(out, `key "order-2"`) || !strings.Contains(out, `checkpoint:  charge = "ch_1"`) ||
				!strings.Contains(out, "downstream:  "+down) || !strings.Contains(out, fmt.Sprintf("attempt 2, a fence above %d", fence)) {
				t.Fatalf("reconcile -dry-run: %d\n%s", code, out)
			}
			code, out, _ = idemctl(t, cat(b.flags, []string{"-json", "reconcile", "-dry-run", "-downstream", "charge"})...)
			var dry []handed
			if code != 0 || json.Unmarshal([]byte(out), &dry) != nil || len(dry) != 3 {
				t.Fatalf("-json reconcile -dry-run: %d\n%s", code, out)
			}
			if code, _, errOut := idemctl(t, cat(b.flags, []string{"reconcile"})...); code != exitUsage || !strings.Contains(errOut, "-dry-run") {
				t.Fatalf("reconcile without -dry-run: %d %s", code, errOut)
			}
			if info, _ := r.Inspect(ctx, charged, false); info.Attempt != 1 || info.LeaseLeft != 0 {
				t.Fatalf("the dry run changed the record: %+v", info)
			}

			// The operator found the charge at the gateway: complete it.
			if code, _, errOut := idemctl(t, cat(sflags, []string{"complete", "-value", `"ch_1"`, "order-2"})...); code != exitUsage || !strings.Contains(errOut, "-yes") {
				t.Fatalf("complete without -yes: %d %s", code, errOut)
			}
			if code, _, errOut := idemctl(t, cat(sflags, []string{"complete", "-yes", "-value", "ch_1", "order-2"})...); code != exitUsage || !strings.Contains(errOut, "not JSON") {
				t.Fatalf("complete with a value that is not JSON: %d %s", code, errOut)
			}
			code, out, errOut = idemctl(t, cat(sflags, []string{"-json", "complete", "-yes", "-value", `"ch_1"`, "order-2"})...)
			var resolved struct {
				Resolved    string `json:"resolved"`
				Attempt     int    `json:"attempt"`
				Fence       int64  `json:"fence"`
				ListedFence int64  `json:"listed_fence"`
			}
			if code != 0 || json.Unmarshal([]byte(out), &resolved) != nil || resolved.Resolved != "completed" || resolved.Attempt != 2 || resolved.Fence <= fence || resolved.ListedFence != fence {
				t.Fatalf("complete: %d %s %s", code, out, errOut)
			}
			runs := 0
			pay := func(context.Context) (string, error) { runs++; return "charged again", nil }
			if res, err := idempotency.Do(ctx, r, charged, pay); err != nil || !res.Replayed || res.Value != "ch_1" || runs != 0 {
				t.Fatalf("retry after complete: %+v %v (runs %d); want ch_1 replayed", res, err, runs)
			}
			if code, _, errOut := idemctl(t, cat(sflags, []string{"complete", "-yes", "-value", `"x"`, "order-2"})...); code != exitNotStuck || !strings.Contains(errOut, "completed") {
				t.Fatalf("complete of a completed record: %d %s", code, errOut)
			}

			// The gateway has no charge for order-3: release it.
			if code, _, errOut := idemctl(t, cat(sflags, []string{"release", "order-3"})...); code != exitUsage || !strings.Contains(errOut, "-yes") {
				t.Fatalf("release without -yes: %d %s", code, errOut)
			}
			code, out, errOut = idemctl(t, cat(sflags, []string{"release", "-yes", "order-3"})...)
			if code != 0 || !strings.Contains(out, "released the stuck record, taken over as attempt 2") {
				t.Fatalf("release: %d %s %s", code, out, errOut)
			}
			if res, err := idempotency.Do(ctx, r, declined, pay); err != nil || res.Replayed || runs != 1 {
				t.Fatalf("retry after release: %+v %v; want a fresh run", res, err)
			}

			if code, _, errOut := idemctl(t, cat(sflags, []string{"purge", "order-4"})...); code != exitUsage || !strings.Contains(errOut, "-yes") {
				t.Fatalf("purge without -yes: %d %s", code, errOut)
			}
			code, out, _ = idemctl(t, cat(sflags, []string{"purge", "-yes", "order-4"})...)
			if code != 0 || !strings.Contains(out, "purged started record") {
				t.Fatalf("purge: %d %s", code, out)
			}
			if code, _, _ := idemctl(t, cat(sflags, []string{"inspect", "order-4"})...); code != exitNotFound {
				t.Fatalf("inspect after purge: %d", code)
			}
			if res, err := idempotency.Do(ctx, r, purged, pay); err != nil || res.Replayed || res.Fence <= fence {
				t.Fatalf("retry after purge: %+v, %v; want a fresh run with a greater fence", res, err)
			}
			if code, out, _ := idemctl(t, cat(b.flags, []string{"stuck"})...); code != 0 || !strings.Contains(out, "no stuck records") {
				t.Fatalf("stuck after resolving: %d %s", code, out)
			}

			code, out, errOut = idemctl(t, cat(b.flags, []string{"sweep"})...)
			switch {
			case b.sweeps && (code != 0 || !strings.Contains(out, "swept")):
				t.Fatalf("sweep: %d %s %s", code, out, errOut)
			case !b.sweeps && (code != exitUsage || !strings.Contains(errOut, "expires records itself")):
				t.Fatalf("sweep on a store that expires records itself: %d %s %s", code, out, errOut)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"inspect", "k"}, // no store
		{"-postgres", "postgres://x", "-redis", "y", "stuck"},
		{"-redis", "127.0.0.1:1", "-schema", "s", "stuck"},
		{"-etcd-endpoints", "127.0.0.1:1", "-table", "t", "stuck"},
		{"-mongo-uri", "mongodb://127.0.0.1:1", "stuck"}, // no collection
		{"-postgres", "postgres://x", "-prefix", "p", "stuck"},
		{"-redis", "127.0.0.1:1", "frobnicate"},
		{"-redis", "127.0.0.1:1", "inspect"},
		{"-redis", "127.0.0.1:1", "stuck", "-limit", "0"},
		{"-redis", "127.0.0.1:1", "complete", "-yes", "k"}, // neither -value nor -error
		{"-redis", "127.0.0.1:1", "-scope", "", "inspect", "k"},
	} {
		if code, _, errOut := idemctl(t, args...); code != exitUsage {
			t.Errorf("idemctl %q: exit %d, want %d (%s)", args, code, exitUsage, errOut)
		}
	}
}

// TestHelp: -h, before or after the command, exits 0 and prints the
// flags with their descriptions on stdout.
func TestHelp(t *testing.T) {
	code, out, _ := idemctl(t, "-h")
	if code != exitOK || !strings.Contains(out, "-table string") || !strings.Contains(out, "the store's table, as the service's postgres.Options.Table") ||
		!strings.Contains(out, "IDEMCTL_ETCD_ENDPOINTS") || !strings.Contains(out, "-mongo-collection") || !strings.Contains(out, "reconcile -dry-run") {
		t.Errorf("idemctl -h: exit %d\n%s", code, out)
	}
	code, out, _ = idemctl(t, "-redis", "127.0.0.1:1", "complete", "-h")
	if code != exitOK || !strings.Contains(out, "-value string") || !strings.Contains(out, "-retention") {
		t.Errorf("idemctl complete -h: exit %d\n%s", code, out)
	}
}

// TestEnvironment: every store flag can come from its IDEMCTL_ variable,
// and a store flag on the command line wins over the environment's.
func TestEnvironment(t *testing.T) {
	b := backends["redis"](t)
	env := map[string]string{"IDEMCTL_REDIS": b.flags[1], "IDEMCTL_PREFIX": b.flags[3], "IDEMCTL_POSTGRES": "postgres://elsewhere"}
	getenv := func(k string) string { return env[k] }
	// IDEMCTL_POSTGRES and IDEMCTL_REDIS together name two stores.
	if code, _, errOut := idemctlEnv(t, getenv, "stuck"); code != exitUsage || !strings.Contains(errOut, "-postgres and -redis") {
		t.Fatalf("two stores from the environment: %d %s", code, errOut)
	}
	delete(env, "IDEMCTL_POSTGRES")
	r, _ := idempotency.New(b.store)
	if _, err := idempotency.Do(context.Background(), r, idempotency.Request{Key: "k"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := idemctlEnv(t, getenv, "inspect", "k"); code != 0 || !strings.Contains(out, "completed") {
		t.Fatalf("store from the environment: %d %s %s", code, out, errOut)
	}
	// A store flag on the command line: the environment's store is not used.
	env["IDEMCTL_POSTGRES"] = "postgres://elsewhere"
	if code, out, errOut := idemctlEnv(t, getenv, "-redis", b.flags[1], "inspect", "k"); code != 0 || !strings.Contains(out, "completed") {
		t.Fatalf("-redis beside IDEMCTL_POSTGRES: %d %s %s", code, out, errOut)
	}
}

// TestMissingTable: a table that is not there is a usage error whose hint
// names the flags to fix, not a migration to run.
func TestMissingTable(t *testing.T) {
	b := backends["postgres"](t)
	flags := cat(b.flags[:4], []string{"-table", "no_such_table", "inspect", "k"})
	code, _, errOut := idemctl(t, flags...)
	if code != exitUsage || !strings.Contains(errOut, "-table") {
		t.Fatalf("a missing table: %d %s", code, errOut)
	}
}

// TestEtcdOutageQuiet: against an etcd that does not answer, idemctl
// fails within its -timeout with its own line only: the etcd client's
// logger, which would print a warning per retry, is silenced.
func TestEtcdOutageQuiet(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a closed port
	start := time.Now()
	code, _, errOut := idemctl(t, "-etcd-endpoints", addr, "-timeout", "2s", "inspect", "k")
	took := time.Since(start)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != exitFailed || took > 8*time.Second || len(lines) != 1 || !strings.HasPrefix(lines[0], "idemctl: ") || !strings.Contains(lines[0], "-timeout 2s") {
		t.Fatalf("idemctl against a closed etcd port: exit %d after %v, stderr:\n%s", code, took.Round(time.Millisecond), errOut)
	}
}

// TestExamplesNameAStore: every example command in the package doc and
// the README parses, with a store flag (or its variable) and a known
// command: a new user copying one gets no "give one of" error.
func TestExamplesNameAStore(t *testing.T) {
	found := 0
	for _, file := range []string{"main.go", "README.md"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for _, line := range strings.Split(string(src), "\n") {
			// Examples: the doc comment's indented lines, the README's
			// fenced blocks.
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
			}
			if !strings.HasPrefix(line, "//\t") && !fenced {
				continue
			}
			line = strings.TrimSpace(strings.TrimPrefix(line, "//"))
			env := map[string]string{}
			words := shellWords(line)
			for len(words) > 0 && strings.HasPrefix(words[0], "IDEMCTL_") && strings.Contains(words[0], "=") {
				k, v, _ := strings.Cut(words[0], "=")
				env[k] = v
				words = words[1:]
			}
			if len(words) == 0 || words[0] != "idemctl" || len(words) == 1 {
				continue
			}
			found++
			inv, help, err := parse(words[1:], func(k string) string { return env[k] }, &bytes.Buffer{}, &bytes.Buffer{})
			if help {
				continue
			}
			if err != nil {
				t.Errorf("%s: %q does not parse: %v", file, line, err)
				continue
			}
			if _, err := inv.store.backend(); err != nil {
				t.Errorf("%s: %q names no store: %v", file, line, err)
			}
			c := &cmd{out: &bytes.Buffer{}, errOut: &bytes.Buffer{}}
			if _, ok, _ := c.flags(inv.command, inv.args, commands[inv.command]); !ok {
				t.Errorf("%s: %q: the command's flags do not parse: %s", file, line, c.errOut)
			}
		}
	}
	if found < 8 {
		t.Errorf("found %d example commands, want the doc's and the README's", found)
	}
}

// shellWords splits a command line as a shell would, for the examples:
// words apart by spaces, "..." and '...' quoting.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0 && ch == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(ch)
		case ch == '"' || ch == '\'':
			quote, in = ch, true
		case ch == ' ' || ch == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(ch)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
