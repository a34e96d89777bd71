package edge

import "github.com/exactlyonce/idempotency"

// A Route is how an edge answers a call, from what its executor returned:
// the one rule every edge follows before its own table.
type Route uint8

// The routes of an answer.
const (
	// Own: fn (the handler, the tool) ran in this call; its own answer is
	// the truth for this caller, also when it was not stored (released) or
	// when the store failed after it or its lease was lost.
	Own Route = iota
	// Replay: the stored answer, to decode and send marked replayed.
	Replay
	// NotStored: an earlier run succeeded but its answer was not kept;
	// answered as such, marked replayed, never run again.
	NotStored
	// Table: the edge's answer to the outcome, from its table.
	Table
)

// RouteOf returns how to answer a call that ended with res and err, and
// the outcome it is answered for: res.Outcome, or what err tells of for an
// executor that did not say ([idempotency.OutcomeOf]).
func RouteOf[T any](res idempotency.Result[T], err error) (Route, idempotency.Outcome) {
	o := res.Outcome
	if o == idempotency.OutcomeUnknown {
		o = idempotency.OutcomeOf(err)
	}
	switch {
	case res.Ran:
		return Own, o
	case o == idempotency.OutcomeReplay && err == nil:
		return Replay, o
	case o == idempotency.OutcomeResultNotStored:
		return NotStored, o
	}
	return Table, o
}

// Lookup returns an edge's answer to o from its table, indexed by outcome:
// table[o] when it is set, else table[OutcomeUnknown], the answer to every
// outcome the edge does not list.
func Lookup[A comparable](table []A, o idempotency.Outcome) A {
	var zero A
	if int(o) < len(table) && table[o] != zero {
		return table[o]
	}
	return table[idempotency.OutcomeUnknown]
}

// Detail returns msg, or err's text when msg is empty (a table entry that
// says the error itself, such as an invalid key's).
func Detail(msg string, err error) string {
	if msg == "" && err != nil {
		return err.Error()
	}
	return msg
}
