package mongo

import (
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The fields of a record document. Short names: they are repeated in every
// document. Persisted: never rename them.
const (
	fieldID          = "_id" // storage key
	fieldState       = "s"   // "started" or "completed"; absent in a released record
	fieldFingerprint = "f"   // request fingerprint
	fieldToken       = "t"   // holder's token
	fieldFence       = "n"   // fence, int64
	fieldAttempt     = "a"   // attempt, 1 plus one per takeover
	fieldLease       = "l"   // lease deadline, server date (started only)
	fieldGrace       = "g"   // grace in ms, int64 (started only)
	fieldCheckpoints = "c"   // checkpoints: [{k: name, v: value}] (started only)
	fieldResult      = "r"   // result, binary (completed only)
	fieldExpires     = "e"   // expiry, server date: at or after it the record is absent
	fieldDelete      = "x"   // deletion time, server date: the TTL index and Sweep delete after it
)

// The stored state values, the idempotency.State strings.
const (
	stateStarted   = "started"
	stateCompleted = "completed"
)

// The variables of the let document every operation sends. User values
// reach the server only through them, each wrapped in $literal, so a
// fingerprint, token, checkpoint name or key that starts with '$' or holds
// '.' is never read as a field path, a variable or an operator.
const (
	varFingerprint = "fp"
	varToken       = "tok"
	varLease       = "leasems"
	varGrace       = "gracems"
	varRetention   = "retms"
	varResult      = "result"
	varName        = "name"
	varValue       = "value"
)

// ref returns the expression that reads a let variable.
func ref(v string) string { return "$$" + v }

// field returns the expression that reads a field of the document.
func field(f string) string { return "$" + f }

// encodeString returns how a user string (storage key, fingerprint, token,
// checkpoint name) is stored: as a BSON string when it is valid UTF-8
// (what MongoDB's strings must be), else as generic binary. The two BSON
// types never compare equal, so the encoding is one-to-one: distinct
// strings are distinct values, equal strings are equal values.
func encodeString(s string) any {
	if utf8.ValidString(s) {
		return s
	}
	return bson.Binary{Subtype: bson.TypeBinaryGeneric, Data: []byte(s)}
}

// decodeString reverses encodeString.
func decodeString(v bson.RawValue) (string, bool) {
	if s, ok := v.StringValueOK(); ok {
		return s, true
	}
	if sub, b, ok := v.BinaryOK(); ok && sub == bson.TypeBinaryGeneric {
		return string(b), true
	}
	return "", false
}

// binary returns b as generic BSON binary, never nil (an empty result is
// stored as empty binary, not as null).
func binary(b []byte) bson.Binary {
	if b == nil {
		b = []byte{}
	}
	return bson.Binary{Subtype: bson.TypeBinaryGeneric, Data: b}
}

// literal wraps a value so that an expression context takes it as it is.
func literal(v any) bson.D { return bson.D{{Key: "$literal", Value: v}} }

// letDoc builds a let document from name/value pairs, every value wrapped
// in $literal.
func letDoc(pairs ...any) bson.D {
	d := make(bson.D, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		d = append(d, bson.E{Key: pairs[i].(string), Value: literal(pairs[i+1])})
	}
	return d
}

// millis rounds d up to whole milliseconds, the resolution of BSON dates:
// a positive duration never becomes zero.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func op(name string, args ...any) bson.D {
	if len(args) == 1 {
		return bson.D{{Key: name, Value: args[0]}}
	}
	return bson.D{{Key: name, Value: bson.A(args)}}
}

func and(xs ...any) bson.D { return bson.D{{Key: "$and", Value: bson.A(xs)}} }
func or(xs ...any) bson.D  { return bson.D{{Key: "$or", Value: bson.A(xs)}} }
func not(x any) bson.D     { return bson.D{{Key: "$not", Value: bson.A{x}}} }
func eq(a, b any) bson.D   { return op("$eq", a, b) }
func gt(a, b any) bson.D   { return op("$gt", a, b) }
func lte(a, b any) bson.D  { return op("$lte", a, b) }

// exprLive is true for a record that exists and has not expired: a state,
// and an expiry after the server's now. A released record (no state) and
// an expired one are absent to every operation.
func exprLive() bson.D {
	return and(
		op("$in", field(fieldState), bson.A{stateStarted, stateCompleted}),
		eq(op("$type", field(fieldExpires)), "date"),
		gt(field(fieldExpires), "$$NOW"),
	)
}

// exprHeld is true for a live STARTED record held under the token variable.
func exprHeld() bson.D {
	return and(exprLive(), eq(field(fieldState), stateStarted), eq(field(fieldToken), ref(varToken)))
}

// exprRepeat is true when a claim repeats the holder's own: a live STARTED
// record with the same fingerprint, held under the claim's token.
func exprRepeat() bson.D {
	return and(exprLive(), eq(field(fieldState), stateStarted),
		eq(field(fieldFingerprint), ref(varFingerprint)), eq(field(fieldToken), ref(varToken)))
}

// exprTakeover is true when a claim takes a record over: a live STARTED
// record with the same fingerprint whose lease ended by the server's now.
func exprTakeover() bson.D {
	return and(exprLive(), eq(field(fieldState), stateStarted),
		eq(field(fieldFingerprint), ref(varFingerprint)), lte(field(fieldLease), "$$NOW"))
}

// exprNextFence is the fence of a new acquisition: the server's clock in
// milliseconds since the epoch, or one more than the record's fence if
// that is greater (a record's fence never goes down while it exists).
func exprNextFence() bson.D {
	return op("$max", op("$toLong", "$$NOW"), op("$add", op("$ifNull", field(fieldFence), int64(0)), int64(1)))
}

// exprDeleteAt is the deletion time of a record that expires at expires
// and has fence fence: the later of its expiry and the millisecond after
// its fence, read as a date. Nothing deletes the document (TTL monitor,
// Sweep) before the server's clock has passed its fence, so the fence of
// a record created after the deletion, taken from that clock, is greater.
func exprDeleteAt(expires, fence any) bson.D {
	return op("$max", expires, op("$toDate", op("$add", fence, int64(1))))
}

// claimLet is the let document of a claim.
func claimLet(fp, token string, lease, grace time.Duration) bson.D {
	return letDoc(varFingerprint, encodeString(fp), varToken, encodeString(token),
		varLease, millis(lease), varGrace, millis(grace))
}

// claimFilter matches the record under key only when the claim acquires
// it: absent (then there is nothing to match and the upsert inserts it),
// expired or released, a repeat of the holder's claim, or a takeover.
// A record the claim must not acquire does not match, and the upsert's
// insert of the same _id fails with a duplicate key error (E11000): the
// caller then reads that record to tell which outcome it is.
func claimFilter(key string) bson.D {
	return bson.D{
		{Key: fieldID, Value: encodeString(key)},
		{Key: "$expr", Value: or(not(exprLive()), exprRepeat(), exprTakeover())},
	}
}

// claimPipeline is the update of a claim, which the filter let through: a
// new record (inserted, expired or released), a repeat (same fence,
// attempt and checkpoints; lease and grace anew) or a takeover (new token,
// greater fence, attempt+1, checkpoints kept). Every deadline is the
// server's $$NOW plus a duration. Any other record is left as it is; the
// filter never lets one through.
func claimPipeline() bson.A {
	leaseEnd := op("$add", "$$NOW", ref(varLease))
	expires := op("$add", "$$NOW", ref(varLease), ref(varGrace))
	fresh := bson.D{
		{Key: fieldID, Value: field(fieldID)},
		{Key: fieldState, Value: stateStarted},
		{Key: fieldFingerprint, Value: ref(varFingerprint)},
		{Key: fieldToken, Value: ref(varToken)},
		{Key: fieldFence, Value: "$$fence"},
		{Key: fieldAttempt, Value: int64(1)},
		{Key: fieldLease, Value: "$$leaseend"},
		{Key: fieldGrace, Value: ref(varGrace)},
		{Key: fieldExpires, Value: "$$expires"},
		{Key: fieldDelete, Value: exprDeleteAt("$$expires", "$$fence")},
	}
	repeat := op("$mergeObjects", "$$ROOT", bson.D{
		{Key: fieldLease, Value: "$$leaseend"},
		{Key: fieldGrace, Value: ref(varGrace)},
		{Key: fieldExpires, Value: "$$expires"},
		{Key: fieldDelete, Value: exprDeleteAt("$$expires", field(fieldFence))},
	})
	takeover := op("$mergeObjects", "$$ROOT", bson.D{
		{Key: fieldToken, Value: ref(varToken)},
		{Key: fieldFence, Value: "$$fence"},
		{Key: fieldAttempt, Value: op("$add", field(fieldAttempt), int64(1))},
		{Key: fieldLease, Value: "$$leaseend"},
		{Key: fieldGrace, Value: ref(varGrace)},
		{Key: fieldExpires, Value: "$$expires"},
		{Key: fieldDelete, Value: exprDeleteAt("$$expires", "$$fence")},
	})
	decide := bson.D{{Key: "$switch", Value: bson.D{
		{Key: "branches", Value: bson.A{
			bson.D{{Key: "case", Value: not(exprLive())}, {Key: "then", Value: fresh}},
			bson.D{{Key: "case", Value: exprRepeat()}, {Key: "then", Value: repeat}},
			bson.D{{Key: "case", Value: exprTakeover()}, {Key: "then", Value: takeover}},
		}},
		{Key: "default", Value: "$$ROOT"},
	}}}
	return bson.A{
		bson.D{{Key: "$replaceWith", Value: bson.D{{Key: "$let", Value: bson.D{
			{Key: "vars", Value: bson.D{
				{Key: "fence", Value: exprNextFence()},
				{Key: "leaseend", Value: leaseEnd},
				{Key: "expires", Value: expires},
			}},
			{Key: "in", Value: decide},
		}}}}},
	}
}

// readProjection is what a claim reads of a record it could not acquire,
// and Release of one it could not release: everything but the
// checkpoints, plus whether the record is live and the time left on its
// lease, both by the server's clock.
func readProjection() bson.D {
	return bson.D{
		{Key: fieldState, Value: 1},
		{Key: fieldFingerprint, Value: 1},
		{Key: fieldToken, Value: 1},
		{Key: fieldFence, Value: 1},
		{Key: fieldAttempt, Value: 1},
		{Key: fieldResult, Value: 1},
		{Key: "live", Value: exprLive()},
		{Key: "left", Value: op("$subtract", field(fieldLease), "$$NOW")},
	}
}

// keyFilter matches the record under key, live or not.
func keyFilter(key string) bson.D {
	return bson.D{{Key: fieldID, Value: encodeString(key)}}
}

// heldFilter matches the live STARTED record under key held under the
// token variable: the condition of every write under a lease.
func heldFilter(key string) bson.D {
	return bson.D{{Key: fieldID, Value: encodeString(key)}, {Key: "$expr", Value: exprHeld()}}
}

// renewPipeline moves the lease to end the lease variable after the
// server's now, and the expiry to the grace after that.
func renewPipeline() bson.A {
	return bson.A{
		bson.D{{Key: "$set", Value: bson.D{
			{Key: fieldLease, Value: op("$add", "$$NOW", ref(varLease))},
			{Key: fieldExpires, Value: op("$add", "$$NOW", ref(varLease), field(fieldGrace))},
		}}},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: fieldDelete, Value: exprDeleteAt(field(fieldExpires), field(fieldFence))},
		}}},
	}
}

// checkpointPipeline replaces the checkpoint named by the name variable
// (or adds it at the end), keeping the others.
func checkpointPipeline() bson.A {
	kept := bson.D{{Key: "$filter", Value: bson.D{
		{Key: "input", Value: op("$ifNull", field(fieldCheckpoints), bson.A{})},
		{Key: "cond", Value: op("$ne", "$$this.k", ref(varName))},
	}}}
	added := bson.A{bson.D{{Key: "k", Value: ref(varName)}, {Key: "v", Value: ref(varValue)}}}
	return bson.A{
		bson.D{{Key: "$set", Value: bson.D{
			{Key: fieldCheckpoints, Value: op("$concatArrays", kept, added)},
		}}},
	}
}

// completeFilter matches the live record under key held under the token
// variable, STARTED or already COMPLETED (a repeated Complete).
func completeFilter(key string) bson.D {
	return bson.D{
		{Key: fieldID, Value: encodeString(key)},
		{Key: "$expr", Value: and(exprLive(), eq(field(fieldToken), ref(varToken)))},
	}
}

// completePipeline rewrites a STARTED record as COMPLETED with the result
// variable, without lease, grace or checkpoints, expiring the retention
// after the server's now. A COMPLETED record (a repeat) is left exactly as
// it is: neither its result nor its retention changes.
func completePipeline() bson.A {
	completed := bson.D{{Key: "$let", Value: bson.D{
		{Key: "vars", Value: bson.D{{Key: "expires", Value: op("$add", "$$NOW", ref(varRetention))}}},
		{Key: "in", Value: bson.D{
			{Key: fieldID, Value: field(fieldID)},
			{Key: fieldState, Value: stateCompleted},
			{Key: fieldFingerprint, Value: field(fieldFingerprint)},
			{Key: fieldToken, Value: field(fieldToken)},
			{Key: fieldFence, Value: field(fieldFence)},
			{Key: fieldAttempt, Value: field(fieldAttempt)},
			{Key: fieldResult, Value: ref(varResult)},
			{Key: fieldExpires, Value: "$$expires"},
			{Key: fieldDelete, Value: exprDeleteAt("$$expires", field(fieldFence))},
		}},
	}}}
	return bson.A{
		bson.D{{Key: "$replaceWith", Value: bson.D{{Key: "$cond", Value: bson.A{
			eq(field(fieldState), stateStarted), completed, "$$ROOT",
		}}}}},
	}
}

// releasePipeline turns the record into a released one: only its key, its
// fence, an expiry of the server's now (so it is absent from now on) and
// its deletion time. The document stays until that time has passed, so
// that a claim before then continues from its fence; see exprDeleteAt.
func releasePipeline() bson.A {
	return bson.A{
		bson.D{{Key: "$replaceWith", Value: bson.D{
			{Key: fieldID, Value: field(fieldID)},
			{Key: fieldFence, Value: field(fieldFence)},
			{Key: fieldExpires, Value: "$$NOW"},
			{Key: fieldDelete, Value: exprDeleteAt("$$NOW", field(fieldFence))},
		}}},
	}
}

// watchPipeline selects the change events of the record under key.
func watchPipeline(key string) bson.A {
	return bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "documentKey._id", Value: encodeString(key)}}}}}
}

// The statements of a batch (batch.go) are the single calls' filters and
// pipelines with their variables bound inside each statement: a bulk write
// is one command, and its let document is shared by every statement,
// while each item has its own key, token and values.

// bound returns expr evaluated with the variables of let, which holds
// $literal values as a let document does (see letDoc): {$let: {vars:
// let, in: expr}}. Inside, $$tok and the others read as in a single call.
func bound(let bson.D, expr any) bson.D {
	return bson.D{{Key: "$let", Value: bson.D{{Key: "vars", Value: let}, {Key: "in", Value: expr}}}}
}

// boundFilter returns filter with its $expr evaluated under let.
func boundFilter(filter, let bson.D) bson.D {
	out := make(bson.D, len(filter))
	for i, e := range filter {
		if e.Key == "$expr" {
			e.Value = bound(let, e.Value)
		}
		out[i] = e
	}
	return out
}

// notHeldMessage is what a batch's guarded pipeline (boundPipeline) makes
// of the document its upsert would insert; the server refuses it with
// codeNotHeld, so the statement writes nothing.
const notHeldMessage = "mongo: no record held under the token"

// codeNotHeld is the server's error for a replacement that is not a
// document (40228: "'replacement document' must evaluate to an object"):
// for a guarded statement, its filter matched nothing.
const codeNotHeld = 40228

// boundPipeline returns pipeline, a single $replaceWith stage, with its
// replacement evaluated under let. With a guard, the replacement is kept
// only where guard (the statement's filter condition) holds, and is
// notHeldMessage elsewhere. A batch sends its completions and releases as
// upserts so that the reply tells, statement by statement, whether each
// one applied: the write errors of a bulk write are given per statement,
// its match count only for the whole command. The filter matches the
// held record, which the guard lets through; when it matches nothing the
// upsert would insert {_id: key}, which the guard turns into a string, so
// the server refuses the statement (codeNotHeld) and writes nothing.
func boundPipeline(pipeline bson.A, let bson.D, guard any) bson.A {
	if len(pipeline) != 1 {
		panic("mongo: boundPipeline of a pipeline of several stages")
	}
	stage := pipeline[0].(bson.D)
	if len(stage) != 1 || stage[0].Key != "$replaceWith" {
		panic("mongo: boundPipeline of a stage other than $replaceWith")
	}
	repl := stage[0].Value
	if guard != nil {
		repl = bson.D{{Key: "$cond", Value: bson.A{guard, repl, literal(notHeldMessage)}}}
	}
	return bson.A{bson.D{{Key: "$replaceWith", Value: bound(let, repl)}}}
}

// filterExpr returns the $expr of a filter.
func filterExpr(filter bson.D) any {
	for _, e := range filter {
		if e.Key == "$expr" {
			return e.Value
		}
	}
	panic("mongo: filter without $expr")
}

// idsFilter matches the records under keys, live or not.
func idsFilter(keys []string) bson.D {
	ids := make(bson.A, len(keys))
	for i, k := range keys {
		ids[i] = encodeString(k)
	}
	return bson.D{{Key: fieldID, Value: bson.D{{Key: "$in", Value: ids}}}}
}

// batchReadProjection is what a batch's claim reads of each record after
// its update: readProjection, and whether the record has checkpoints
// (read only for an acquisition that gets them, see claimBatch).
func batchReadProjection() bson.D {
	return append(readProjection(), bson.E{Key: "cps", Value: gt(op("$size", op("$ifNull", field(fieldCheckpoints), bson.A{})), int64(0))})
}

// checkpointProjection is readProjection and the checkpoints.
func checkpointProjection() bson.D {
	return append(readProjection(), bson.E{Key: fieldCheckpoints, Value: 1})
}
