package edge

import (
	"errors"
	"testing"

	"github.com/exactlyonce/idempotency"
)

func TestRouteOf(t *testing.T) {
	for _, c := range []struct {
		res     idempotency.Result[int]
		err     error
		route   Route
		outcome idempotency.Outcome
	}{
		{idempotency.Result[int]{Outcome: idempotency.OutcomeCompleted, Ran: true}, nil, Own, idempotency.OutcomeCompleted},
		{idempotency.Result[int]{Outcome: idempotency.OutcomeStoreError, Ran: true}, errors.New("after fn"), Own, idempotency.OutcomeStoreError},
		{idempotency.Result[int]{Outcome: idempotency.OutcomeReplay, Replayed: true}, nil, Replay, idempotency.OutcomeReplay},
		{idempotency.Result[int]{Outcome: idempotency.OutcomeReplay, Replayed: true}, &idempotency.StoredError{Message: "x"}, Table, idempotency.OutcomeReplay},
		{idempotency.Result[int]{Outcome: idempotency.OutcomeResultNotStored}, idempotency.ErrResultNotStored, NotStored, idempotency.OutcomeResultNotStored},
		{idempotency.Result[int]{Outcome: idempotency.OutcomeInProgress}, &idempotency.InProgressError{}, Table, idempotency.OutcomeInProgress},
		// An executor that does not say: the error tells.
		{idempotency.Result[int]{}, &idempotency.StoreError{Op: "commit", Err: errors.New("reset")}, Table, idempotency.OutcomeStoreError},
		{idempotency.Result[int]{}, idempotency.ErrMismatch, Table, idempotency.OutcomeMismatch},
		{idempotency.Result[int]{}, errors.New("unknown"), Table, idempotency.OutcomeUnknown},
	} {
		route, o := RouteOf(c.res, c.err)
		if route != c.route || o != c.outcome {
			t.Errorf("RouteOf(%+v, %v) = %v, %v; want %v, %v", c.res, c.err, route, o, c.route, c.outcome)
		}
	}
}

func TestLookup(t *testing.T) {
	table := [...]string{idempotency.OutcomeUnknown: "500", idempotency.OutcomeMismatch: "422"}
	if got := Lookup(table[:], idempotency.OutcomeMismatch); got != "422" {
		t.Errorf("listed outcome: %q", got)
	}
	if got := Lookup(table[:], idempotency.OutcomeCorrupt); got != "500" {
		t.Errorf("an outcome past the table: %q, want the unknown's answer", got)
	}
	if got := Lookup(table[:], idempotency.OutcomeInProgress); got != "500" {
		t.Errorf("an unlisted outcome inside the table: %q, want the unknown's answer", got)
	}
	if Detail("", errors.New("why")) != "why" || Detail("fixed", errors.New("why")) != "fixed" {
		t.Error("Detail")
	}
}
