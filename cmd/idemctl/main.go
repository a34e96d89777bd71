// Command idemctl is the operator's view of an idempotency store on
// PostgreSQL, Redis (single or Cluster), etcd or MongoDB: inspect a key,
// purge it, list the records stuck with a dead holder, resolve one of
// them after checking the downstream by hand, sweep expired ones.
//
// The scenario it is for: "a customer's retry keeps getting 409". Find
// the key the way the service built it (its scope parts and the client's
// Idempotency-Key), see whether a holder's lease is live and for how long,
// which attempt it is and whether it ever completed, then decide: wait
// for the lease to end (the next retry takes it over), purge the key if
// the effect is known not to have happened, or, for a record whose holder
// died and whose client never retried, look the request up downstream (by
// the downstream key reconcile -dry-run prints) and complete or release it.
//
//	idemctl -postgres "$DATABASE_URL" -scope acct_42 -scope "POST /payments" inspect 9f2c4e1a-order-7
//	idemctl -redis localhost:6379 stuck -limit 20
//	idemctl -etcd-endpoints etcd-0:2379,etcd-1:2379 reconcile -dry-run -downstream charge
//	idemctl -mongo-uri "$MONGO_URI" -mongo-database shop -mongo-collection idempotency -scope acct_42 -scope "POST /payments" complete -yes -value '{"id":"ch_123"}' 9f2c4e1a-order-7
//	idemctl -postgres "$DATABASE_URL" -scope acct_42 -scope "POST /payments" purge -yes 9f2c4e1a-order-7
//	idemctl -postgres "$DATABASE_URL" sweep
//
// Flags before the command choose the store: exactly one of -postgres URL
// (with -schema and -table as the service configured postgres.Options),
// -redis ADDR or -redis-cluster ADDR,ADDR,... (with -prefix as in
// redis.Options), -etcd-endpoints ADDR,ADDR,... (with -prefix as in
// etcd.Options) and -mongo-uri URI (with -mongo-database and
// -mongo-collection, the collection the service gave mongo.New). Each can
// come from the environment instead: IDEMCTL_POSTGRES, IDEMCTL_SCHEMA,
// IDEMCTL_TABLE, IDEMCTL_REDIS, IDEMCTL_REDIS_CLUSTER, IDEMCTL_PREFIX,
// IDEMCTL_ETCD_ENDPOINTS, IDEMCTL_MONGO_URI, IDEMCTL_MONGO_DATABASE,
// IDEMCTL_MONGO_COLLECTION; a flag wins over its variable, and a store
// flag on the command line over every store variable. idemctl creates
// nothing: no table, collection or index. -scope, repeated, gives the
// scope parts in the service's order. -json prints JSON instead of text.
// -h, before or after the command, prints the flags and their meaning.
//
// Exit status: 0 on success, 1 when the store (or a resolution) failed,
// 2 for a usage error (a missing -yes, a flag the store does not take, a
// table or collection that is not there), 3 when the key has no record,
// 4 when complete or release found the record not stuck (a live lease,
// or completed), and changed nothing.
//
// Build it from a checkout: go build ./cmd/idemctl.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
	exitNotStuck = 4
)

const usageHead = `usage: idemctl STORE [-scope PART]... [-json] [-timeout D] COMMAND [ARGS]

STORE: -postgres URL [-schema S] [-table T]
     | -redis ADDR | -redis-cluster ADDR,ADDR,... [-prefix P]
     | -etcd-endpoints ADDR,ADDR,... [-prefix P]
     | -mongo-uri URI [-mongo-database DB] -mongo-collection C
  (or IDEMCTL_POSTGRES, IDEMCTL_REDIS, IDEMCTL_ETCD_ENDPOINTS, IDEMCTL_MONGO_URI, ...:
   every store flag as IDEMCTL_ and its name in capitals)

commands:
  inspect [-result] KEY         show the record of KEY in the scope: state, fence, attempt, lease left, expiry
  purge -yes KEY                delete the record of KEY in the scope, whatever its state
  stuck [-limit N]              list records whose holder's lease ended without completion
  reconcile -dry-run [-limit N] [-downstream PREFIX]...
                                show what a resolver would be handed for each stuck record
  complete -yes (-value JSON | -error MSG) KEY
                                resolve the stuck record of KEY as done: every retry gets the value (or error)
  release -yes KEY              resolve the stuck record of KEY as not done: the next retry runs it again
  sweep [-limit N]              delete expired records (PostgreSQL and MongoDB; the others expire them)

Run "idemctl COMMAND -h" for a command's flags.

flags:
`

// scopeFlag collects repeated -scope flags.
type scopeFlag []string

func (s *scopeFlag) String() string     { return strings.Join(*s, ",") }
func (s *scopeFlag) Set(v string) error { *s = append(*s, v); return nil }

// invocation is a parsed command line.
type invocation struct {
	store   storeConfig
	scope   []string
	json    bool
	timeout time.Duration
	command string
	args    []string
}

// parse reads the flags before the command, filling in the store flags
// from getenv. help reports -h; the error is a usage error, already
// printed to stderr.
func parse(args []string, getenv func(string) string, stdout, stderr io.Writer) (inv invocation, help bool, err error) {
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	inv.store = storeConfig{}
	values := map[string]*string{}
	for _, f := range storeFlags {
		values[f.name] = fs.String(f.name, "", f.help+" ("+envName(f.name)+")")
	}
	var scope scopeFlag
	fs.Var(&scope, "scope", "a scope part, as the service builds it (repeat for each part, in order)")
	fs.BoolVar(&inv.json, "json", false, "print JSON")
	fs.DurationVar(&inv.timeout, "timeout", 10*time.Second, "bound on the whole command")
	fs.Usage = func() { printUsage(fs, stderr) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(fs, stdout)
			return inv, true, nil
		}
		return inv, false, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, v := range values {
		inv.store[name] = *v
	}
	inv.store.resolve(set, getenv)
	inv.scope = scope
	if fs.NArg() == 0 {
		printUsage(fs, stderr)
		return inv, false, errors.New("no command")
	}
	inv.command, inv.args = fs.Arg(0), fs.Args()[1:]
	if _, ok := commands[inv.command]; !ok {
		fmt.Fprintf(stderr, "idemctl: unknown command %q\n", inv.command)
		printUsage(fs, stderr)
		return inv, false, errors.New("unknown command")
	}
	return inv, false, nil
}

func printUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, usageHead)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// run is the command, testable: it returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	inv, help, err := parse(args, getenv, stdout, stderr)
	switch {
	case help:
		return exitOK
	case err != nil:
		return exitUsage
	}
	c := &cmd{scope: inv.scope, json: inv.json, timeout: inv.timeout, out: stdout, errOut: stderr}
	def := commands[inv.command]
	fs, ok, code := c.flags(inv.command, inv.args, def)
	if !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, inv.timeout)
	defer cancel()
	store, closeStore, err := openStore(ctx, inv.store)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		if errors.As(err, new(usageError)) {
			return exitUsage
		}
		return exitFailed
	}
	defer closeStore()
	runner, err := idempotency.New(store, c.runnerOptions()...)
	if err != nil {
		return c.fail(err)
	}
	c.ctx, c.r = ctx, runner
	return def.run(c, fs)
}
