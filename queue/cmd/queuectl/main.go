// Command queuectl is the operator's view of a client queue's file (see
// package queue): list its items, inspect one by its key, retry it now,
// drop it.
//
// The scenario it is for: "the till says three sales are stuck". List the
// pending items and the dead letters, with each item's idempotency key
// (the one the server saw, to look it up there with idemctl), its attempts
// and the last error or the reason it stopped; inspect one to see its
// request and the answer that stopped it; then retry it (a dead item goes
// back to the queue with the same key) or drop it.
//
//	queuectl /var/lib/till/sales.queue list
//	queuectl /var/lib/till/sales.queue list -dead
//	queuectl -json /var/lib/till/sales.queue inspect 9f2c4e1a-1c1e-4b5e-9a55-0c8f6e1f2a3b
//	queuectl /var/lib/till/sales.queue retry 9f2c4e1a-1c1e-4b5e-9a55-0c8f6e1f2a3b
//	queuectl /var/lib/till/sales.queue drop 9f2c4e1a-1c1e-4b5e-9a55-0c8f6e1f2a3b
//	queuectl /var/lib/till/sales.queue drop -id 17
//
// Only one process may have a queue open: stop the client first, or use
// the same calls of its API (Queue.List, Inspect, Retry, Drop) from the
// client itself. A retry here makes the item due at once; the client
// sends it when it next runs. Drop a damaged item, whose key may not be
// readable, by its ID.
//
// Exit status: 0 on success, 1 when the file could not be read or written
// (2 for a usage error, 3 when the key is not in the queue, 4 when another
// process has the queue open).
//
// Build it from a checkout: go build ./queue/cmd/queuectl.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/exactlyonce/idempotency/queue"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
	exitLocked   = 4
)

const usage = `usage: queuectl [-json] FILE COMMAND [ARGS]

COMMAND:
  list [-dead] [-after ID] [-limit N]   the pending items (or the dead letters), in order
  inspect KEY                           one item: its request, attempts and answer
  retry KEY                             make it due now (a dead item goes back, same key)
  drop KEY | drop -id ID                remove it without sending it again
`

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("queuectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() < 2 {
		fs.Usage()
		return exitUsage
	}
	file, cmd, rest := fs.Arg(0), fs.Arg(1), fs.Args()[2:]
	if _, err := os.Stat(file); err != nil {
		// Open would make a new, empty queue: never for an operator's typo.
		fmt.Fprintf(stderr, "queuectl: %v\n", err)
		return exitFailed
	}
	c := &command{stdout: stdout, stderr: stderr, json: *asJSON}
	var do func(*queue.Queue, []string) error
	switch cmd {
	case "list":
		do = c.list
	case "inspect":
		do = c.inspect
	case "retry":
		do = c.retry
	case "drop":
		do = c.drop
	default:
		fmt.Fprintf(stderr, "queuectl: unknown command %q\n", cmd)
		fs.Usage()
		return exitUsage
	}
	q, err := queue.Open(file)
	if err != nil {
		fmt.Fprintf(stderr, "queuectl: %v\n", err)
		if errors.Is(err, queue.ErrLocked) {
			return exitLocked
		}
		return exitFailed
	}
	err = do(q, rest)
	if cerr := q.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "queuectl: %s\n", ue)
		fs.Usage()
		return exitUsage
	case errors.Is(err, queue.ErrNotFound):
		fmt.Fprintf(stderr, "queuectl: %v\n", err)
		return exitNotFound
	}
	fmt.Fprintf(stderr, "queuectl: %v\n", err)
	return exitFailed
}

type usageError string

func (e usageError) Error() string { return string(e) }

type command struct {
	stdout, stderr io.Writer
	json           bool
}

func (c *command) list(q *queue.Queue, args []string) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	dead := fs.Bool("dead", false, "the dead letters instead of the pending items")
	after := fs.Uint64("after", 0, "only items with a greater ID")
	limit := fs.Int("limit", 100, "at most this many items (0: all)")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if fs.NArg() > 0 {
		return usageError("list takes no argument")
	}
	st := queue.Pending
	if *dead {
		st = queue.Dead
	}
	items, err := q.List(st, *after, *limit)
	if err != nil {
		return err
	}
	if c.json {
		out := make([]itemJSON, 0, len(items))
		for i := range items {
			out = append(out, toJSON(&items[i]))
		}
		return c.printJSON(out)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKEY\tORDER\tSTATE\tATTEMPTS\tNEXT\tREQUEST\tLAST ERROR / REASON")
	for i := range items {
		it := &items[i]
		note := it.LastError
		if it.State == queue.Dead {
			note = it.Reason
		}
		if it.Damaged != nil {
			note = it.Damaged.Error()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s %s\t%s\n", it.ID, orDash(it.Key), orDash(it.Order), state(it),
			it.Attempts, when(it.Next), orDash(it.Method), it.URL, oneLine(note, 120))
	}
	return tw.Flush()
}

func (c *command) inspect(q *queue.Queue, args []string) error {
	if len(args) != 1 {
		return usageError("inspect takes one key")
	}
	it, err := q.Inspect(args[0])
	if err != nil {
		return err
	}
	if c.json {
		j := toJSON(it)
		j.Header, j.Body = it.Header, string(it.Body)
		return c.printJSON(j)
	}
	w := c.stdout
	fmt.Fprintf(w, "key:       %s\n", it.Key)
	fmt.Fprintf(w, "id:        %d\n", it.ID)
	fmt.Fprintf(w, "state:     %s\n", state(it))
	fmt.Fprintf(w, "order:     %s\n", orDash(it.Order))
	fmt.Fprintf(w, "request:   %s %s\n", it.Method, it.URL)
	for name, vs := range it.Header {
		for _, v := range vs {
			fmt.Fprintf(w, "  %s: %s\n", name, v)
		}
	}
	fmt.Fprintf(w, "body:      %d bytes: %s\n", len(it.Body), oneLine(string(it.Body), 200))
	fmt.Fprintf(w, "enqueued:  %s\n", when(it.Enqueued))
	fmt.Fprintf(w, "sent:      %s\n", when(it.Sent))
	fmt.Fprintf(w, "expires:   %s\n", when(it.Expires))
	fmt.Fprintf(w, "next:      %s\n", when(it.Next))
	fmt.Fprintf(w, "attempts:  %d\n", it.Attempts)
	if it.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", it.LastError)
	}
	if it.Reason != "" {
		fmt.Fprintf(w, "reason:    %s\n", it.Reason)
	}
	if r := it.Response; r != nil {
		fmt.Fprintf(w, "answer:    %d (replayed: %v), %d bytes: %s\n", r.Status, r.Replayed, len(r.Body), oneLine(string(r.Body), 200))
	}
	if it.Damaged != nil {
		fmt.Fprintf(w, "damaged:   %v\n", it.Damaged)
	}
	return nil
}

func (c *command) retry(q *queue.Queue, args []string) error {
	if len(args) != 1 {
		return usageError("retry takes one key")
	}
	if err := q.Retry(args[0]); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%s: due now\n", args[0])
	return nil
}

func (c *command) drop(q *queue.Queue, args []string) error {
	fs := flag.NewFlagSet("drop", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	id := fs.Uint64("id", 0, "drop the item with this ID (a damaged one)")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	switch {
	case *id != 0 && fs.NArg() == 0:
		if err := q.DropID(*id); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "item %d: dropped\n", *id)
		return nil
	case *id == 0 && fs.NArg() == 1:
		if err := q.Drop(fs.Arg(0)); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "%s: dropped\n", fs.Arg(0))
		return nil
	}
	return usageError("drop takes one key, or -id ID")
}

// itemJSON is an item as -json prints it.
type itemJSON struct {
	ID        uint64              `json:"id"`
	Key       string              `json:"key"`
	Order     string              `json:"order"`
	State     string              `json:"state"`
	Method    string              `json:"method"`
	URL       string              `json:"url"`
	Header    map[string][]string `json:"header,omitempty"`
	Body      string              `json:"body,omitempty"`
	Enqueued  *time.Time          `json:"enqueued,omitempty"`
	Sent      *time.Time          `json:"sent,omitempty"`
	Expires   *time.Time          `json:"expires,omitempty"`
	Next      *time.Time          `json:"next,omitempty"`
	Attempts  int                 `json:"attempts"`
	LastError string              `json:"last_error,omitempty"`
	Reason    string              `json:"reason,omitempty"`
	Response  *responseJSON       `json:"response,omitempty"`
	Damaged   string              `json:"damaged,omitempty"`
}

type responseJSON struct {
	Status    int                 `json:"status"`
	Replayed  bool                `json:"replayed"`
	Header    map[string][]string `json:"header,omitempty"`
	Body      string              `json:"body"`
	Truncated bool                `json:"truncated,omitempty"`
}

func toJSON(it *queue.Item) itemJSON {
	t := func(v time.Time) *time.Time {
		if v.IsZero() {
			return nil
		}
		return &v
	}
	j := itemJSON{ID: it.ID, Key: it.Key, Order: it.Order, State: state(it), Method: it.Method, URL: it.URL,
		Enqueued: t(it.Enqueued), Sent: t(it.Sent), Expires: t(it.Expires), Next: t(it.Next),
		Attempts: it.Attempts, LastError: it.LastError, Reason: it.Reason}
	if r := it.Response; r != nil {
		j.Response = &responseJSON{Status: r.Status, Replayed: r.Replayed, Header: r.Header, Body: string(r.Body), Truncated: r.Truncated}
	}
	if it.Damaged != nil {
		j.Damaged = it.Damaged.Error()
	}
	return j
}

func (c *command) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func state(it *queue.Item) string {
	if it.Damaged != nil {
		return "damaged"
	}
	return it.State.String()
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine shortens s to n runes on one line.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
