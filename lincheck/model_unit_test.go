package lincheck

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/exactlyonce/idempotency"
)

// Sequential checks of the model itself: a history of one client, where
// porcupine has no choice of order, is accepted exactly when each answer is
// the contract's.

func claimIn(fp, tok int) input { return input{Key: "k", Kind: opClaim, Fp: fp, Token: tok} }
func renewIn(tok int) input     { return input{Key: "k", Kind: opRenew, Token: tok} }
func releaseIn(tok int) input   { return input{Key: "k", Kind: opRelease, Token: tok} }
func cpIn(tok, name int, v string) input {
	return input{Key: "k", Kind: opCheckpoint, Token: tok, Name: name, Value: v}
}
func completeIn(tok int, r string) input {
	return input{Key: "k", Kind: opComplete, Token: tok, Value: r}
}

func acquired(fence int64, cps ...string) output {
	o := output{Outcome: idempotency.OutcomeAcquired, Fence: fence, Attempt: 1}
	for i := 0; i+1 < len(cps); i += 2 {
		for j := range numNames {
			if nameOf(j) == cps[i] {
				o.Cps[j] = slot{Set: true, Value: cps[i+1]}
			}
		}
	}
	return o
}

var (
	okOut      = output{}
	lostOut    = output{Lost: true}
	unknownOut = output{Unknown: true, Err: "connection reset"}
)

func replay(fence int64, result string) output {
	return output{Outcome: idempotency.OutcomeReplay, Fence: fence, Attempt: 1, Result: result, HasResult: true}
}

func inProgress(fence int64) output {
	return output{Outcome: idempotency.OutcomeInProgress, Fence: fence, Attempt: 1, RetryAfter: time.Minute}
}

func mismatch(fence int64) output {
	return output{Outcome: idempotency.OutcomeMismatch, Fence: fence, Attempt: 1}
}

type call struct {
	in  input
	out output
}

// sequential makes a one-client history of calls, each returning before
// the next is called.
func sequential(calls []call) []porcupine.Operation {
	ops := make([]porcupine.Operation, len(calls))
	for i, c := range calls {
		ops[i] = porcupine.Operation{ClientId: 0, Input: c.in, Output: c.out, Call: int64(2 * i), Return: int64(2*i + 1)}
		if c.out.Unknown {
			ops[i].Return = 1 << 62
		}
	}
	return ops
}

func TestModel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		legal bool
		calls []call
	}{
		{"fresh claim, repeat, checkpoint, complete, replay", true, []call{
			{claimIn(0, 0), acquired(5)},
			{claimIn(0, 0), acquired(5)},
			{cpIn(0, 1, "x"), okOut},
			{claimIn(0, 0), acquired(5, "cp1", "x")},
			{renewIn(0), okOut},
			{claimIn(0, 1), inProgress(5)},
			{claimIn(1, 1), mismatch(5)},
			{completeIn(1, "bad"), lostOut},
			{completeIn(0, "r"), okOut},
			{completeIn(0, "again"), okOut},
			{claimIn(0, 2), replay(5, "r")},
			{claimIn(0, 0), replay(5, "r")},
			{releaseIn(0), lostOut},
			{renewIn(0), lostOut},
			{cpIn(0, 0, "y"), lostOut},
		}},
		{"release, then a fresh claim with a greater fence", true, []call{
			{releaseIn(2), okOut},
			{claimIn(1, 0), acquired(7)},
			{releaseIn(1), lostOut},
			{releaseIn(0), okOut},
			{releaseIn(0), okOut},
			{renewIn(0), lostOut},
			{claimIn(0, 1), acquired(8)},
		}},
		{"outcomes other than acquired may leave fence and attempt out", true, []call{
			{claimIn(0, 0), acquired(3)},
			{claimIn(0, 1), output{Outcome: idempotency.OutcomeInProgress, RetryAfter: time.Second}},
			{claimIn(1, 1), output{Outcome: idempotency.OutcomeMismatch}},
		}},
		{"a lost reply's fence is fixed by the next reply that shows it", true, []call{
			{claimIn(0, 0), acquired(3)},
			{releaseIn(0), okOut},
			{claimIn(0, 1), unknownOut},
			{claimIn(0, 1), acquired(9)},
			{claimIn(0, 2), inProgress(9)},
		}},
		{"an unknown call may not have happened", true, []call{
			{claimIn(0, 0), acquired(3)},
			{completeIn(0, "r"), unknownOut},
			{cpIn(0, 0, "v"), okOut},
			{claimIn(0, 0), acquired(3, "cp0", "v")},
		}},
		{"two holders", false, []call{
			{claimIn(0, 0), acquired(1)},
			{claimIn(0, 1), acquired(2)},
		}},
		{"fence not greater after re-creation", false, []call{
			{claimIn(0, 0), acquired(4)},
			{releaseIn(0), okOut},
			{claimIn(0, 1), acquired(4)},
		}},
		{"repeated claim with another fence", false, []call{
			{claimIn(0, 0), acquired(4)},
			{claimIn(0, 0), acquired(5)},
		}},
		{"repeated claim without its checkpoints", false, []call{
			{claimIn(0, 0), acquired(4)},
			{cpIn(0, 0, "v"), okOut},
			{claimIn(0, 0), acquired(4)},
		}},
		{"fresh claim with checkpoints", false, []call{
			{claimIn(0, 0), acquired(4, "cp0", "v")},
		}},
		{"complete by another token", false, []call{
			{claimIn(0, 0), acquired(4)},
			{completeIn(1, "r"), okOut},
		}},
		{"replay of another result", false, []call{
			{claimIn(0, 0), acquired(4)},
			{completeIn(0, "r"), okOut},
			{completeIn(0, "s"), okOut},
			{claimIn(0, 1), replay(4, "s")},
		}},
		{"replay with the wrong fence", false, []call{
			{claimIn(0, 0), acquired(4)},
			{completeIn(0, "r"), okOut},
			{claimIn(0, 1), replay(3, "r")},
		}},
		{"release of a completed record", false, []call{
			{claimIn(0, 0), acquired(4)},
			{completeIn(0, "r"), okOut},
			{releaseIn(0), okOut},
		}},
		{"release by another token", false, []call{
			{claimIn(0, 0), acquired(4)},
			{releaseIn(1), okOut},
		}},
		{"renew of an absent record", false, []call{
			{renewIn(0), okOut},
		}},
		{"checkpoint lost while held", false, []call{
			{claimIn(0, 0), acquired(4)},
			{cpIn(0, 0, "v"), lostOut},
		}},
		{"in progress without time left", false, []call{
			{claimIn(0, 0), acquired(4)},
			{claimIn(0, 1), output{Outcome: idempotency.OutcomeInProgress, Fence: 4, Attempt: 1}},
		}},
		{"mismatch on the same fingerprint", false, []call{
			{claimIn(0, 0), acquired(4)},
			{claimIn(0, 1), mismatch(4)},
		}},
		{"claim reports a lost lease", false, []call{
			{claimIn(0, 0), lostOut},
		}},
		{"a lost reply's fence is still greater than the last", false, []call{
			{claimIn(0, 0), acquired(3)},
			{releaseIn(0), okOut},
			{claimIn(0, 1), unknownOut},
			{claimIn(0, 1), acquired(2)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := porcupine.CheckOperationsTimeout(model, sequential(tc.calls), time.Second)
			want := porcupine.Illegal
			if tc.legal {
				want = porcupine.Ok
			}
			if res != want {
				t.Errorf("got %s, want %s", res, want)
			}
		})
	}
}

// TestModelConcurrent: with overlapping calls porcupine may pick the order,
// which makes two concurrent acquisitions of an absent key by different
// tokens legal only when a release by the first lies between them.
func TestModelConcurrent(t *testing.T) {
	op := func(client int, in input, out output, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	twoWinners := []porcupine.Operation{
		op(0, claimIn(0, 0), acquired(1), 0, 10),
		op(1, claimIn(0, 1), acquired(2), 1, 11),
	}
	if res := porcupine.CheckOperationsTimeout(model, twoWinners, time.Second); res != porcupine.Illegal {
		t.Errorf("two concurrent winners: got %s, want Illegal", res)
	}
	withRelease := append(twoWinners, op(2, releaseIn(0), okOut, 2, 9))
	if res := porcupine.CheckOperationsTimeout(model, withRelease, time.Second); res != porcupine.Ok {
		t.Errorf("two winners around a release: got %s, want Ok", res)
	}
	// The release returned before the second claim was called and the
	// first claim was called after it: no order explains both wins.
	ordered := []porcupine.Operation{
		op(0, releaseIn(0), okOut, 0, 1),
		op(1, claimIn(0, 0), acquired(1), 2, 3),
		op(2, claimIn(0, 1), acquired(2), 4, 5),
	}
	if res := porcupine.CheckOperationsTimeout(model, ordered, time.Second); res != porcupine.Illegal {
		t.Errorf("release before both wins: got %s, want Illegal", res)
	}
	// Keys are independent: the same calls on two keys are legal.
	otherKey := claimIn(0, 1)
	otherKey.Key = "other"
	twoKeys := []porcupine.Operation{
		op(0, claimIn(0, 0), acquired(1), 0, 10),
		op(1, otherKey, acquired(1), 1, 11),
	}
	if res := porcupine.CheckOperationsTimeout(model, twoKeys, time.Second); res != porcupine.Ok {
		t.Errorf("one winner on each of two keys: got %s, want Ok", res)
	}
}
