package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
)

// command is one of idemctl's commands: its flags, how many arguments it
// takes and what it does.
type command struct {
	nargs  int
	args   string // what the arguments are, for -h
	define func(c *cmd, fs *flag.FlagSet)
	run    func(c *cmd, fs *flag.FlagSet) int
}

var commands map[string]command

func init() {
	// In init: the commands' functions refer to the table (through
	// c.flags), which a plain initializer would make a cycle.
	commands = map[string]command{
		"inspect":   {nargs: 1, args: "KEY", define: defineInspect, run: (*cmd).inspect},
		"purge":     {nargs: 1, args: "KEY", define: defineYes("really purge (a purged key's next request runs its effect again)"), run: (*cmd).purge},
		"stuck":     {define: defineLimit(100, "list at most this many"), run: (*cmd).stuck},
		"reconcile": {define: defineReconcile, run: (*cmd).reconcile},
		"complete":  {nargs: 1, args: "KEY", define: defineComplete, run: (*cmd).complete},
		"release":   {nargs: 1, args: "KEY", define: defineRelease, run: (*cmd).release},
		"sweep":     {define: defineLimit(0, "delete at most this many (0: all)"), run: (*cmd).sweep},
	}
}

type cmd struct {
	ctx         context.Context
	r           *idempotency.Runner
	scope       []string
	json        bool
	timeout     time.Duration
	out, errOut io.Writer

	// The commands' flags.
	withResult    bool
	yes           bool
	limit         int
	dryRun        bool
	downstream    scopeFlag
	value, errMsg string
	retention     time.Duration
}

// runnerOptions are the runner's options the command's flags set.
func (c *cmd) runnerOptions() []idempotency.Option {
	if c.retention > 0 {
		return []idempotency.Option{idempotency.WithRetention(c.retention)}
	}
	return nil
}

// flags parses a command's flags and wants exactly its number of
// arguments. ok false: exit with code (0 after -h).
func (c *cmd) flags(name string, args []string, def command) (fs *flag.FlagSet, ok bool, code int) {
	fs = flag.NewFlagSet("idemctl "+name, flag.ContinueOnError)
	fs.SetOutput(c.errOut)
	if def.define != nil {
		def.define(c, fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemctl STORE [-scope PART]... %s [flags] %s\n", name, def.args)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(c.out)
			fs.Usage()
			return nil, false, exitOK
		}
		return nil, false, exitUsage
	}
	if fs.NArg() != def.nargs {
		fmt.Fprintf(c.errOut, "idemctl %s: want %d argument(s) (%s), got %q\n", name, def.nargs, def.args, fs.Args())
		return nil, false, exitUsage
	}
	if fs.Lookup("limit") != nil && (c.limit < 0 || c.limit == 0 && name != "sweep") {
		fmt.Fprintf(c.errOut, "idemctl %s: -limit must be positive\n", name)
		return nil, false, exitUsage
	}
	return fs, true, exitOK
}

// fail reports err and returns its exit status.
func (c *cmd) fail(err error) int {
	// One line: errors of several attempts come joined by newlines.
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	if errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() != nil {
		fmt.Fprintf(c.errOut, "idemctl: %s (no answer within -timeout %v: is the store reachable at the address given?)\n", msg, c.timeout)
		return exitFailed
	}
	fmt.Fprintln(c.errOut, "idemctl:", msg)
	if h := hint(err); h != "" {
		fmt.Fprintln(c.errOut, h)
		return exitUsage
	}
	switch {
	case errors.Is(err, idempotency.ErrNotFound):
		return exitNotFound
	case errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrInvalidArgument), errors.Is(err, errors.ErrUnsupported):
		return exitUsage
	}
	return exitFailed
}

func (c *cmd) request(fs *flag.FlagSet) idempotency.Request {
	return idempotency.Request{Scope: c.scope, Key: fs.Arg(0)}
}

func defineInspect(c *cmd, fs *flag.FlagSet) {
	fs.BoolVar(&c.withResult, "result", false, "also print the stored result (it may hold personal data)")
}

func defineYes(help string) func(c *cmd, fs *flag.FlagSet) {
	return func(c *cmd, fs *flag.FlagSet) { fs.BoolVar(&c.yes, "yes", false, help) }
}

func defineLimit(def int, help string) func(c *cmd, fs *flag.FlagSet) {
	return func(c *cmd, fs *flag.FlagSet) { fs.IntVar(&c.limit, "limit", def, help) }
}

func (c *cmd) inspect(fs *flag.FlagSet) int {
	info, err := c.r.Inspect(c.ctx, c.request(fs), c.withResult)
	if err != nil {
		return c.fail(err)
	}
	c.printRecord(view(info, c.withResult))
	return exitOK
}

// refuse says what -yes would do and returns exitUsage.
func (c *cmd) refuse(name, what string) int {
	fmt.Fprintf(c.errOut, "idemctl %s: add -yes: %s\n", name, what)
	return exitUsage
}

func (c *cmd) purge(fs *flag.FlagSet) int {
	if !c.yes {
		return c.refuse("purge", "purging a record lets the next request with the key run its effect again")
	}
	req := c.request(fs)
	before, err := c.r.Inspect(c.ctx, req, false)
	if err != nil {
		// No record (exit 3): nothing to purge, and nothing is sent.
		return c.fail(err)
	}
	if err := c.r.Purge(c.ctx, req); err != nil {
		return c.fail(err)
	}
	c.printResult(map[string]any{"purged": true, "state": before.State, "fence": before.Fence, "attempt": before.Attempt},
		"purged %s record (fence %d, attempt %d)\n", before.State, before.Fence, before.Attempt)
	return exitOK
}

// listStuck lists up to c.limit stuck records, page by page.
func (c *cmd) listStuck() ([]idempotency.RecordInfo, error) {
	all := []idempotency.RecordInfo{}
	cursor := ""
	for len(all) < c.limit {
		infos, next, err := c.r.Stuck(c.ctx, cursor, min(c.limit-len(all), 100))
		if err != nil {
			return nil, err
		}
		all = append(all, infos...)
		if next == "" {
			break
		}
		cursor = next
	}
	return all, nil
}

func (c *cmd) stuck(*flag.FlagSet) int {
	infos, err := c.listStuck()
	if err != nil {
		return c.fail(err)
	}
	views := make([]recordView, 0, len(infos)) // [] in JSON when none, never null
	for _, info := range infos {
		views = append(views, view(info, false))
	}
	if c.json {
		c.printJSON(views)
		return exitOK
	}
	if len(views) == 0 {
		fmt.Fprintln(c.out, "no stuck records")
		return exitOK
	}
	for _, v := range views {
		fmt.Fprintf(c.out, "%s key=%q fence=%d attempt=%d expires_in=%s\n", strings.Join(quoteAll(v.Scope), " "), v.Key, v.Fence, v.Attempt, v.ExpiresIn)
	}
	return exitOK
}

func defineReconcile(c *cmd, fs *flag.FlagSet) {
	fs.BoolVar(&c.dryRun, "dry-run", false, "only show what a resolver would be handed (required: idemctl cannot ask your downstream)")
	fs.IntVar(&c.limit, "limit", 100, "show at most this many stuck records")
	fs.Var(&c.downstream, "downstream", "a prefix the service gives idempotency.DownstreamKey (repeat for each): print the downstream key to look the request up by")
}

// handed is what a resolver would be handed for a stuck record, as
// reconcile -dry-run prints it.
type handed struct {
	Listed recordView `json:"listed"`
	// Attempt is the resolver's attempt after the takeover; FenceAbove
	// the fence its greater one would be above.
	Attempt     int               `json:"attempt"`
	FenceAbove  int64             `json:"fence_above"`
	Checkpoints map[string]string `json:"checkpoints"`
	Downstream  map[string]string `json:"downstream_keys,omitempty"`
	// Changed is set when the record was no longer stuck when read again.
	Changed string `json:"changed,omitempty"`
}

func (c *cmd) reconcile(*flag.FlagSet) int {
	if !c.dryRun {
		fmt.Fprintln(c.errOut, "idemctl reconcile: add -dry-run: idemctl cannot find out what happened downstream. Run idempotency.Reconcile with your resolver in the service; or check each record by hand (reconcile -dry-run prints its downstream keys) and resolve it with idemctl complete or release")
		return exitUsage
	}
	infos, err := c.listStuck()
	if err != nil {
		return c.fail(err)
	}
	out := make([]handed, 0, len(infos))
	for _, listed := range infos {
		h := handed{Listed: view(listed, false), Attempt: listed.Attempt + 1, FenceAbove: listed.Fence, Checkpoints: map[string]string{}}
		// The checkpoints as they are now: the resolver gets those of the
		// takeover, which a Stuck listing may leave out.
		now, err := c.r.InspectStorageKey(c.ctx, listed.Key, false)
		switch {
		case errors.Is(err, idempotency.ErrNotFound):
			h.Changed = "gone (released, purged or expired)"
		case err != nil:
			return c.fail(err)
		case now.State != idempotency.StateStarted || now.LeaseLeft > 0 || now.Attempt != listed.Attempt:
			h.Changed = fmt.Sprintf("no longer stuck: %s, attempt %d, lease left %v", now.State, now.Attempt, now.LeaseLeft.Round(time.Millisecond))
		}
		for name, v := range now.Checkpoints {
			h.Checkpoints[name] = string(v)
		}
		if len(c.downstream) > 0 {
			h.Downstream = map[string]string{}
			for _, p := range c.downstream {
				h.Downstream[p] = idempotency.DownstreamKeyOf(listed.Key, p)
			}
		}
		out = append(out, h)
	}
	if c.json {
		c.printJSON(out)
		return exitOK
	}
	if len(out) == 0 {
		fmt.Fprintln(c.out, "no stuck records: nothing a resolver would be handed")
		return exitOK
	}
	for i, h := range out {
		fmt.Fprintf(c.out, "%d. key %q (scope %s)\n", i+1, h.Listed.Key, strings.Join(quoteAll(h.Listed.Scope), " "))
		fmt.Fprintf(c.out, "   listed:      fence %d, attempt %d, lease ended, expires in %s\n", h.Listed.Fence, h.Listed.Attempt, h.Listed.ExpiresIn)
		if h.Changed != "" {
			fmt.Fprintf(c.out, "   changed:     %s; a resolver would skip it\n", h.Changed)
			continue
		}
		fmt.Fprintf(c.out, "   resolver:    attempt %d, a fence above %d, after taking the record over\n", h.Attempt, h.FenceAbove)
		if len(h.Checkpoints) == 0 {
			fmt.Fprintln(c.out, "   checkpoints: none (the holder recorded no step)")
		}
		for _, name := range slices.Sorted(maps.Keys(h.Checkpoints)) {
			fmt.Fprintf(c.out, "   checkpoint:  %s = %s\n", name, printable(h.Checkpoints[name]))
		}
		for _, p := range slices.Sorted(maps.Keys(h.Downstream)) {
			fmt.Fprintf(c.out, "   downstream:  %s\n", h.Downstream[p])
		}
	}
	return exitOK
}

func defineComplete(c *cmd, fs *flag.FlagSet) {
	defineYes("really complete (every retry then gets the value or error, and never runs the request)")(c, fs)
	fs.StringVar(&c.value, "value", "", "the result to store, as JSON (the service's value, as its default JSON codec encodes it)")
	fs.StringVar(&c.errMsg, "error", "", "instead of -value: store this permanent error (every retry gets it)")
	fs.DurationVar(&c.retention, "retention", idempotency.DefaultRetention, "how long the result is kept, as the service's WithRetention")
}

func defineRelease(c *cmd, fs *flag.FlagSet) {
	defineYes("really release (the next retry runs the request again)")(c, fs)
}

func (c *cmd) complete(fs *flag.FlagSet) int {
	if !c.yes {
		return c.refuse("complete", "completing a stuck record stores a result that no request computed; every retry gets it")
	}
	if (c.value == "") == (c.errMsg == "") {
		fmt.Fprintln(c.errOut, "idemctl complete: give -value JSON or -error MSG")
		return exitUsage
	}
	if c.value != "" && !json.Valid([]byte(c.value)) {
		fmt.Fprintf(c.errOut, "idemctl complete: -value %q is not JSON (a string is given quoted: -value '\"ch_123\"')\n", c.value)
		return exitUsage
	}
	res := idempotency.CompleteWith(json.RawMessage(c.value))
	if c.errMsg != "" {
		res = idempotency.FailWith[json.RawMessage](errors.New(c.errMsg))
	}
	return c.resolve(fs, "complete", res)
}

func (c *cmd) release(fs *flag.FlagSet) int {
	if !c.yes {
		return c.refuse("release", "releasing a stuck record lets the next retry run its effect again: do it only when the downstream shows the effect did not happen")
	}
	return c.resolve(fs, "release", idempotency.ReleaseForRetry[json.RawMessage]())
}

// resolve takes the stuck record of the key over, as idempotency.Reconcile
// would, and records res.
func (c *cmd) resolve(fs *flag.FlagSet, name string, res idempotency.Resolution[json.RawMessage]) int {
	req := c.request(fs)
	var got idempotency.StuckRecord
	rep, err := idempotency.ReconcileKey(c.ctx, c.r, req, func(ctx context.Context, s idempotency.StuckRecord) (idempotency.Resolution[json.RawMessage], error) {
		got = s
		return res, nil
	})
	if err != nil {
		return c.fail(err)
	}
	if rep.Listed == 0 || rep.Skipped > 0 {
		why := "a retry took it over, completed or released it first"
		if rep.Listed == 0 {
			info, err := c.r.Inspect(c.ctx, req, false)
			switch {
			case err != nil:
				return c.fail(err)
			case info.State == idempotency.StateCompleted:
				why = "it is completed"
			default:
				why = fmt.Sprintf("a holder's lease has %v left (wait for it to end: a retry then takes it over, or it is stuck)", info.LeaseLeft.Round(time.Millisecond))
			}
		}
		fmt.Fprintf(c.errOut, "idemctl %s: the record is not stuck: %s; nothing changed\n", name, why)
		return exitNotStuck
	}
	done := map[string]string{"complete": "completed", "release": "released"}[name]
	if c.errMsg != "" {
		done = "failed"
	}
	meaning := map[string]string{
		"completed": "every retry gets the value replayed",
		"failed":    "every retry gets the error replayed",
		"released":  "the next retry runs the request again",
	}[done]
	c.printResult(map[string]any{"resolved": done, "attempt": got.Attempt, "fence": got.Fence, "listed_fence": got.Listed.Fence},
		"%s the stuck record, taken over as attempt %d with fence %d (it was %d): %s\n", done, got.Attempt, got.Fence, got.Listed.Fence, meaning)
	return exitOK
}

func (c *cmd) sweep(*flag.FlagSet) int {
	n, err := c.r.Sweep(c.ctx, c.limit)
	if err != nil {
		return c.fail(err)
	}
	c.printResult(map[string]any{"swept": n}, "swept %d expired records\n", n)
	return exitOK
}
