package lincheck

import (
	"fmt"
	"hash/maphash"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/exactlyonce/idempotency"
)

// The sequential model of the Store contract (store.go) that porcupine
// checks histories against. Time is out of the model: the workload uses a
// lease, a grace and a retention far longer than a run, so no lease or
// record expires while it runs and there is no takeover. Expiry is the
// conformance suite's business.
//
// Per storage key the state is absent, STARTED{fingerprint, token, fence,
// attempt, checkpoints} or COMPLETED{fingerprint, token, fence, attempt,
// result}, plus the greatest fence handed out for the key so far, which a
// fresh acquisition must exceed (fences strictly increase across release
// and re-creation). Fences need not be dense: PostgreSQL draws them from
// one sequence for the table, Redis from the server's clock.

// Workload constants shared by the model and the workload.
const (
	lease     = 10 * time.Minute
	grace     = 10 * time.Minute
	retention = time.Hour

	numFingerprints = 2
	numTokens       = 3
	numNames        = 2
)

// opKind is a Store method.
type opKind uint8

const (
	opClaim opKind = iota
	opRenew
	opCheckpoint
	opComplete
	opRelease
)

func (k opKind) String() string {
	return [...]string{"claim", "renew", "checkpoint", "complete", "release"}[k]
}

// input is one call of a Store method on one key. Fingerprints, tokens and
// checkpoint names are small indexes into fixed tables (see fingerprints,
// tokenOf, nameOf), so that the model's state stays comparable.
type input struct {
	Key   string
	Kind  opKind
	Fp    int    // claim: index into fingerprints
	Token int    // every kind: tokenOf(Token)
	Name  int    // checkpoint: nameOf(Name)
	Value string // checkpoint value, or complete's result
}

var fingerprints = func() [numFingerprints]idempotency.Fingerprint {
	var fps [numFingerprints]idempotency.Fingerprint
	for i := range fps {
		fps[i] = idempotency.FingerprintParts("lincheck", string(rune('A'+i)))
	}
	return fps
}()

func tokenOf(i int) idempotency.Token { return idempotency.Token(fmt.Sprintf("tok-%d", i)) }

func nameOf(i int) string { return fmt.Sprintf("cp%d", i) }

// slot is one checkpoint of a record: absent or a value.
type slot struct {
	Set   bool
	Value string
}

// output is what a call returned, reduced to what the model judges.
type output struct {
	// Unknown: the call failed with an error other than a definite
	// contract error (a network or context error), so it may or may not
	// have taken effect. Such an operation gets an infinite return time;
	// the model applies it and accepts it whatever it would have returned,
	// and "not applied" is the linearization that puts it last.
	Unknown bool
	Err     string // the error of an Unknown call, for the visualization
	// Lost: the call returned ErrLeaseLost.
	Lost bool

	// Claim's result.
	Outcome    idempotency.Outcome
	Fence      int64
	Attempt    int
	RetryAfter time.Duration
	Result     string
	HasResult  bool           // Result not nil
	Cps        [numNames]slot // the checkpoints returned
	ForeignCps bool           // checkpoints of names the workload never wrote
}

func claimOutput(res idempotency.ClaimResult) output {
	o := output{
		Outcome:    res.Outcome,
		Fence:      res.Fence,
		Attempt:    res.Attempt,
		RetryAfter: res.RetryAfter,
		Result:     string(res.Result),
		HasResult:  res.Result != nil,
	}
	for name, v := range res.Checkpoints {
		i := -1
		for j := range numNames {
			if nameOf(j) == name {
				i = j
			}
		}
		if i < 0 {
			o.ForeignCps = true
			continue
		}
		o.Cps[i] = slot{Set: true, Value: string(v)}
	}
	return o
}

// keyState is the model's state of one key. It is comparable, so == is
// state equality and maphash.Comparable hashes it.
type keyState struct {
	Present   bool
	Completed bool
	Fp        int
	Token     int
	Fence     int64
	// FenceKnown is false after a claim whose reply was lost acquired the
	// record: its fence is then some value greater than MaxFence, fixed by
	// the first reply that shows it.
	FenceKnown bool
	Attempt    int
	Cps        [numNames]slot // STARTED only
	Result     string         // COMPLETED only
	// MaxFence is the greatest fence known to have been handed out for the
	// key (a lower bound when a lost reply acquired it).
	MaxFence int64
}

// model is the porcupine model of the contract, partitioned by key.
var model = porcupine.Model{
	Partition:         partitionByKey,
	Init:              func() any { return keyState{} },
	Step:              func(s, in, out any) (bool, any) { return step(s.(keyState), in.(input), out.(output)) },
	Equal:             func(a, b any) bool { return a.(keyState) == b.(keyState) },
	Hash:              func(s any) uint64 { return maphash.Comparable(hashSeed, s.(keyState)) },
	DescribeOperation: func(in, out any) string { return describeOp(in.(input), out.(output)) },
	DescribeState:     func(s any) string { return describeState(s.(keyState)) },
}

var hashSeed = maphash.MakeSeed()

// partitionByKey splits a history into one history per key: keys are
// independent in the contract, and checking them apart keeps the search
// small.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return parts
}

// step reports whether the store, in state s, may answer in with out, and
// the state after it.
func step(s keyState, in input, out output) (bool, keyState) {
	if in.Kind == opClaim {
		return stepClaim(s, in, out)
	}
	held := s.Present && !s.Completed && s.Token == in.Token
	next := s
	var ok bool // whether the contract's answer is success (else ErrLeaseLost)
	switch in.Kind {
	case opRenew:
		ok = held
	case opCheckpoint:
		ok = held
		if held {
			next.Cps[in.Name] = slot{Set: true, Value: in.Value}
		}
	case opComplete:
		switch {
		case held:
			ok = true
			next.Completed = true
			next.Result = in.Value
			next.Cps = [numNames]slot{}
		case s.Present && s.Completed && s.Token == in.Token:
			ok = true // completing again changes nothing
		}
	case opRelease:
		switch {
		case !s.Present:
			ok = true
		case held:
			ok = true
			next = keyState{MaxFence: s.MaxFence}
		}
	}
	if out.Unknown {
		return true, next
	}
	if ok == out.Lost {
		return false, s
	}
	return true, next
}

// stepClaim follows Claim's table, less the rows about expired leases and
// records.
func stepClaim(s keyState, in input, out output) (bool, keyState) {
	if out.Lost {
		return false, s // Claim never reports a lost lease
	}
	switch {
	case !s.Present:
		next := keyState{Present: true, Fp: in.Fp, Token: in.Token, Attempt: 1, MaxFence: s.MaxFence}
		if out.Unknown {
			return true, next // fence unknown until a reply shows it
		}
		if out.Outcome != idempotency.OutcomeAcquired || out.Attempt != 1 ||
			out.Fence <= s.MaxFence || hasCps(out) {
			return false, s
		}
		next.Fence, next.FenceKnown, next.MaxFence = out.Fence, true, out.Fence
		return true, next

	case s.Fp != in.Fp:
		if out.Unknown {
			return true, s
		}
		if out.Outcome != idempotency.OutcomeMismatch {
			return false, s
		}
		return current(s, out, false)

	case s.Completed:
		if out.Unknown {
			return true, s
		}
		if out.Outcome != idempotency.OutcomeReplay || !out.HasResult || out.Result != s.Result {
			return false, s
		}
		return current(s, out, false)

	case s.Token == in.Token:
		// A repeated claim whose reply was lost: the same fence, attempt
		// and checkpoints; only the lease (out of the model) changes.
		if out.Unknown {
			return true, s
		}
		if out.Outcome != idempotency.OutcomeAcquired || out.Attempt != s.Attempt ||
			out.Cps != s.Cps || out.ForeignCps {
			return false, s
		}
		return current(s, out, true)

	default:
		if out.Unknown {
			return true, s
		}
		// The lease was set for `lease` at most; stores round the time
		// left up to their resolution (µs, ms).
		if out.Outcome != idempotency.OutcomeInProgress ||
			out.RetryAfter <= 0 || out.RetryAfter > lease+time.Millisecond {
			return false, s
		}
		return current(s, out, false)
	}
}

// current checks the fence and attempt a claim reports for an existing
// record: they must be the record's. For an outcome other than an
// acquisition the contract says "when known", so zero is accepted too.
func current(s keyState, out output, acquired bool) (bool, keyState) {
	if out.Attempt != s.Attempt && (acquired || out.Attempt != 0) {
		return false, s
	}
	switch {
	case out.Fence == 0 && !acquired:
		return true, s
	case s.FenceKnown:
		return out.Fence == s.Fence, s
	case out.Fence <= s.MaxFence:
		// The record was acquired by a claim whose reply was lost: its
		// fence is greater than every fence handed out before it.
		return false, s
	}
	s.Fence, s.FenceKnown, s.MaxFence = out.Fence, true, out.Fence
	return true, s
}

func hasCps(out output) bool {
	return out.ForeignCps || out.Cps != [numNames]slot{}
}

func describeOp(in input, out output) string {
	var b strings.Builder
	switch in.Kind {
	case opClaim:
		fmt.Fprintf(&b, "claim(fp%c, tok%d)", 'A'+in.Fp, in.Token)
	case opCheckpoint:
		fmt.Fprintf(&b, "checkpoint(tok%d, %s=%q)", in.Token, nameOf(in.Name), in.Value)
	case opComplete:
		fmt.Fprintf(&b, "complete(tok%d, %q)", in.Token, in.Value)
	default:
		fmt.Fprintf(&b, "%s(tok%d)", in.Kind, in.Token)
	}
	b.WriteString(" -> ")
	switch {
	case out.Unknown:
		fmt.Fprintf(&b, "unknown (%s)", out.Err)
	case out.Lost:
		b.WriteString("lease lost")
	case in.Kind != opClaim:
		b.WriteString("ok")
	default:
		fmt.Fprintf(&b, "%s fence=%d attempt=%d", out.Outcome, out.Fence, out.Attempt)
		switch out.Outcome {
		case idempotency.OutcomeReplay:
			fmt.Fprintf(&b, " result=%q", out.Result)
		case idempotency.OutcomeInProgress:
			fmt.Fprintf(&b, " retry=%v", out.RetryAfter)
		case idempotency.OutcomeAcquired:
			b.WriteString(" cps=" + describeCps(out.Cps))
			if out.ForeignCps {
				b.WriteString("+foreign")
			}
		}
	}
	return b.String()
}

func describeState(s keyState) string {
	fence := fmt.Sprint(s.Fence)
	if !s.FenceKnown {
		fence = fmt.Sprintf(">%d", s.MaxFence)
	}
	switch {
	case !s.Present:
		return fmt.Sprintf("absent (max fence %d)", s.MaxFence)
	case s.Completed:
		return fmt.Sprintf("COMPLETED fp%c tok%d fence=%s attempt=%d result=%q",
			'A'+s.Fp, s.Token, fence, s.Attempt, s.Result)
	default:
		return fmt.Sprintf("STARTED fp%c tok%d fence=%s attempt=%d cps=%s",
			'A'+s.Fp, s.Token, fence, s.Attempt, describeCps(s.Cps))
	}
}

func describeCps(cps [numNames]slot) string {
	var parts []string
	for i, c := range cps {
		if c.Set {
			parts = append(parts, fmt.Sprintf("%s=%q", nameOf(i), c.Value))
		}
	}
	return "{" + strings.Join(parts, " ") + "}"
}
