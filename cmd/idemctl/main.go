// Command idemctl is the operator's view of an idempotency store on
// PostgreSQL or Redis: inspect a key, purge it, list the records stuck
// with a dead holder, sweep expired ones.
//
// The scenario it is for: "a customer's retry keeps getting 409". Find
// the key the way the service built it (its scope parts and the client's
// Idempotency-Key), see whether a holder's lease is live and for how long,
// which attempt it is and whether it ever completed, then decide: wait
// for the lease to end (the next retry takes it over), or purge the key
// if the effect is known not to have happened.
//
//	idemctl -postgres "$DATABASE_URL" -scope acct_42 -scope "POST /payments" inspect 9f2c4e1a-order-7
//	idemctl -redis localhost:6379 stuck -limit 20
//	idemctl -postgres "$DATABASE_URL" -scope acct_42 -scope "POST /payments" purge -yes 9f2c4e1a-order-7
//	idemctl -postgres "$DATABASE_URL" sweep
//
// Flags before the command choose the store: -postgres URL (with -schema
// and -table as the service configured postgres.Options), or -redis ADDR
// / -redis-cluster ADDR,ADDR,... (with -prefix as in redis.Options). -scope,
// repeated, gives the scope parts in the service's order. -json prints
// JSON instead of text. Exit status: 0 on success, 1 when the store
// failed, 2 for a usage error, 3 when the key has no record.
//
// Build it from a checkout: go build ./cmd/idemctl.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
)

const usage = `usage: idemctl STORE [-scope PART]... [-json] COMMAND [ARGS]

STORE: -postgres URL [-schema S] [-table T] | -redis ADDR | -redis-cluster ADDR,ADDR,... [-prefix P]

commands:
  inspect [-result] KEY   show the record of KEY in the scope: state, fence, attempt, lease left, expiry
  purge -yes KEY          delete the record of KEY in the scope, whatever its state
  stuck [-limit N]        list records whose holder's lease ended without completion
  sweep [-limit N]        delete expired records (PostgreSQL; Redis expires them itself)
`

// scopeFlag collects repeated -scope flags.
type scopeFlag []string

func (s *scopeFlag) String() string     { return strings.Join(*s, ",") }
func (s *scopeFlag) Set(v string) error { *s = append(*s, v); return nil }

// run is the command, testable: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	var (
		pgURL   = fs.String("postgres", "", "PostgreSQL URL")
		schema  = fs.String("schema", "", "PostgreSQL schema of the store's table (postgres.Options.Schema)")
		table   = fs.String("table", "", "the store's table (postgres.Options.Table; default idempotency_keys)")
		redisA  = fs.String("redis", "", "Redis address host:port")
		cluster = fs.String("redis-cluster", "", "Redis Cluster addresses, comma-separated")
		prefix  = fs.String("prefix", "", "the store's key prefix (redis.Options.Prefix; default idem:)")
		asJSON  = fs.Bool("json", false, "print JSON")
		timeout = fs.Duration("timeout", 10*time.Second, "bound on the whole command")
		scope   scopeFlag
	)
	fs.Var(&scope, "scope", "a scope part, as the service builds it (repeat for each part, in order)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	store, closeStore, err := openStore(ctx, *pgURL, *schema, *table, *redisA, *cluster, *prefix)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return exitUsage
	}
	defer closeStore()
	runner, err := idempotency.New(store)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return exitFailed
	}
	c := &cmd{ctx: ctx, r: runner, scope: scope, json: *asJSON, out: stdout, errOut: stderr}
	name, rest := fs.Arg(0), fs.Args()[1:]
	switch name {
	case "inspect":
		return c.inspect(rest)
	case "purge":
		return c.purge(rest)
	case "stuck":
		return c.stuck(rest)
	case "sweep":
		return c.sweep(rest)
	}
	fmt.Fprintf(stderr, "idemctl: unknown command %q\n%s", name, usage)
	return exitUsage
}

// openStore opens the one store the flags name.
func openStore(ctx context.Context, pgURL, schema, table, redisAddr, cluster, prefix string) (idempotency.Store, func(), error) {
	n := 0
	for _, v := range []string{pgURL, redisAddr, cluster} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return nil, nil, errors.New("give exactly one of -postgres, -redis and -redis-cluster")
	}
	switch {
	case pgURL != "":
		if prefix != "" {
			return nil, nil, errors.New("-prefix is for Redis; PostgreSQL takes -schema and -table")
		}
		pool, err := pgxpool.New(ctx, pgURL)
		if err != nil {
			return nil, nil, fmt.Errorf("-postgres: %w", err)
		}
		s, err := postgres.New(pool, &postgres.Options{Schema: schema, Table: table})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
	if schema != "" || table != "" {
		return nil, nil, errors.New("-schema and -table are for PostgreSQL; Redis takes -prefix")
	}
	var client goredis.UniversalClient
	if redisAddr != "" {
		client = goredis.NewClient(&goredis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	} else {
		client = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(cluster, ","), ContextTimeoutEnabled: true})
	}
	s, err := redis.New(client, &redis.Options{Prefix: prefix})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return s, func() { client.Close() }, nil
}

type cmd struct {
	ctx         context.Context
	r           *idempotency.Runner
	scope       []string
	json        bool
	out, errOut io.Writer
}

// flags parses a command's flags and wants exactly nargs arguments.
func (c *cmd) flags(name string, args []string, nargs int, define func(fs *flag.FlagSet)) (*flag.FlagSet, bool) {
	fs := flag.NewFlagSet("idemctl "+name, flag.ContinueOnError)
	fs.SetOutput(c.errOut)
	if define != nil {
		define(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, false
	}
	if fs.NArg() != nargs {
		fmt.Fprintf(c.errOut, "idemctl %s: want %d argument(s), got %q\n", name, nargs, fs.Args())
		return nil, false
	}
	return fs, true
}

// fail reports err and returns its exit status.
func (c *cmd) fail(err error) int {
	fmt.Fprintln(c.errOut, "idemctl:", err)
	switch {
	case errors.Is(err, idempotency.ErrNotFound):
		return exitNotFound
	case errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrInvalidArgument), errors.Is(err, errors.ErrUnsupported):
		return exitUsage
	}
	return exitFailed
}

func (c *cmd) inspect(args []string) int {
	var withResult bool
	fs, ok := c.flags("inspect", args, 1, func(fs *flag.FlagSet) {
		fs.BoolVar(&withResult, "result", false, "also print the stored result (it may hold personal data)")
	})
	if !ok {
		return exitUsage
	}
	info, err := c.r.Inspect(c.ctx, idempotency.Request{Scope: c.scope, Key: fs.Arg(0)}, withResult)
	if err != nil {
		return c.fail(err)
	}
	c.print(view(info, withResult))
	return exitOK
}

func (c *cmd) purge(args []string) int {
	var yes bool
	fs, ok := c.flags("purge", args, 1, func(fs *flag.FlagSet) {
		fs.BoolVar(&yes, "yes", false, "really purge")
	})
	if !ok {
		return exitUsage
	}
	req := idempotency.Request{Scope: c.scope, Key: fs.Arg(0)}
	if !yes {
		fmt.Fprintln(c.errOut, "idemctl purge: add -yes: purging a record lets the next request with the key run its effect again")
		return exitUsage
	}
	before, err := c.r.Inspect(c.ctx, req, false)
	if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		return c.fail(err)
	}
	if err := c.r.Purge(c.ctx, req); err != nil {
		return c.fail(err)
	}
	if before.Key == "" {
		fmt.Fprintln(c.out, "no record; nothing purged")
		return exitOK
	}
	fmt.Fprintf(c.out, "purged %s record (fence %d, attempt %d)\n", before.State, before.Fence, before.Attempt)
	return exitOK
}

func (c *cmd) stuck(args []string) int {
	var limit int
	if _, ok := c.flags("stuck", args, 0, func(fs *flag.FlagSet) {
		fs.IntVar(&limit, "limit", 100, "list at most this many")
	}); !ok {
		return exitUsage
	}
	if limit <= 0 {
		fmt.Fprintln(c.errOut, "idemctl stuck: -limit must be positive")
		return exitUsage
	}
	var all []recordView
	cursor := ""
	for len(all) < limit {
		infos, next, err := c.r.Stuck(c.ctx, cursor, min(limit-len(all), 100))
		if err != nil {
			return c.fail(err)
		}
		for _, info := range infos {
			all = append(all, view(info, false))
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if c.json {
		c.print(all)
		return exitOK
	}
	if len(all) == 0 {
		fmt.Fprintln(c.out, "no stuck records")
		return exitOK
	}
	for _, v := range all {
		fmt.Fprintf(c.out, "%s key=%q fence=%d attempt=%d expires_in=%s\n", strings.Join(quoteAll(v.Scope), " "), v.Key, v.Fence, v.Attempt, v.ExpiresIn)
	}
	return exitOK
}

func (c *cmd) sweep(args []string) int {
	var limit int
	if _, ok := c.flags("sweep", args, 0, func(fs *flag.FlagSet) {
		fs.IntVar(&limit, "limit", 0, "delete at most this many (0: all)")
	}); !ok {
		return exitUsage
	}
	n, err := c.r.Sweep(c.ctx, limit)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(c.out, "swept %d expired records\n", n)
	return exitOK
}

// recordView is a record as idemctl prints it.
type recordView struct {
	Scope       []string `json:"scope"`
	Key         string   `json:"key"`
	StorageKey  string   `json:"storage_key"`
	State       string   `json:"state"`
	Fingerprint string   `json:"fingerprint"`
	Fence       int64    `json:"fence"`
	Attempt     int      `json:"attempt"`
	LeaseLeft   string   `json:"lease_left,omitempty"`
	ExpiresIn   string   `json:"expires_in"`
	ResultSize  int      `json:"result_size"`
	ResultKind  string   `json:"result_kind,omitempty"`
	Result      string   `json:"result,omitempty"`
	Checkpoints []string `json:"checkpoints,omitempty"`
}

func view(info idempotency.RecordInfo, withResult bool) recordView {
	v := recordView{
		Key: info.Key, StorageKey: info.Key, State: string(info.State), Fingerprint: string(info.Fingerprint),
		Fence: info.Fence, Attempt: info.Attempt, ExpiresIn: info.ExpiresIn.Round(time.Millisecond).String(),
		ResultSize: info.ResultSize,
	}
	if scope, key, err := idempotency.ParseStorageKey(info.Key); err == nil {
		v.Scope, v.Key = scope, key
	}
	if info.State == idempotency.StateStarted {
		v.LeaseLeft = info.LeaseLeft.Round(time.Millisecond).String()
	}
	for name := range info.Checkpoints {
		v.Checkpoints = append(v.Checkpoints, name)
	}
	slices.Sort(v.Checkpoints)
	if withResult && info.Result != nil {
		kind, payload, err := idempotency.DescribeResult(info.Result)
		if err != nil {
			kind, payload = "corrupt", info.Result
		}
		v.ResultKind, v.Result = kind, string(payload)
	}
	return v
}

func (c *cmd) print(v any) {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		enc.Encode(v)
		return
	}
	r := v.(recordView)
	fmt.Fprintf(c.out, "key:          %q (scope %s)\n", r.Key, strings.Join(quoteAll(r.Scope), " "))
	fmt.Fprintf(c.out, "state:        %s\n", r.State)
	fmt.Fprintf(c.out, "fence:        %d\n", r.Fence)
	fmt.Fprintf(c.out, "attempt:      %d\n", r.Attempt)
	if r.LeaseLeft != "" {
		fmt.Fprintf(c.out, "lease left:   %s\n", r.LeaseLeft)
	}
	fmt.Fprintf(c.out, "expires in:   %s\n", r.ExpiresIn)
	fmt.Fprintf(c.out, "fingerprint:  %s\n", r.Fingerprint)
	if r.State == string(idempotency.StateCompleted) {
		fmt.Fprintf(c.out, "result size:  %d bytes\n", r.ResultSize)
	}
	if len(r.Checkpoints) > 0 {
		fmt.Fprintf(c.out, "checkpoints:  %s\n", strings.Join(r.Checkpoints, ", "))
	}
	if r.ResultKind != "" {
		fmt.Fprintf(c.out, "result:       %s %s\n", r.ResultKind, r.Result)
	}
	switch {
	case r.State == string(idempotency.StateCompleted):
		fmt.Fprintln(c.out, "meaning:      completed; every retry with the same request gets the stored result")
	case r.LeaseLeft != "0s":
		fmt.Fprintf(c.out, "meaning:      a holder is running (or died less than a lease ago); retries get 409 for up to %s more, then take it over\n", r.LeaseLeft)
	default:
		fmt.Fprintln(c.out, "meaning:      the holder stopped renewing; the next retry takes it over (attempt+1, greater fence), or reconcile or purge it")
	}
}

func quoteAll(parts []string) []string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = fmt.Sprintf("%q", p)
	}
	return q
}
