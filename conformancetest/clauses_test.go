package conformancetest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"slices"
	"strings"
	"testing"
)

// clause is one sentence of the store contract in ../store.go and the
// cases that check it.
type clause struct {
	in    string   // the doc comment: a type, Type.Method or Type.Field
	text  string   // the sentence, verbatim but for runs of spaces
	cases []string // the cases that check it
	why   string   // for a sentence that states no rule: why no case checks it
}

// clauses maps every sentence of the doc comments of Store, its methods,
// Sweeper, Watcher, Token, ClaimRequest and ClaimResult (rows of Claim's
// table count as sentences) to the cases that check it. TestClauses keeps
// it complete: a sentence added to store.go fails it until it is mapped
// here, to a case or, if it states no rule, to a reason.
var clauses = []clause{
	{in: "Store", text: "Store is the contract a storage backend implements.",
		why: "definition"},
	{in: "Store", text: "It works on bytes and opaque strings; encoding, key scoping, heartbeats and error policy live in [Do] above it.",
		cases: []string{"replay_exact_bytes", "odd_keys"}},
	{in: "Store", text: "A record lives under a storage key and is in one of two states, STARTED or COMPLETED (see [State]).",
		cases: []string{"in_progress_retry_after", "replay_exact_bytes"}},
	{in: "Store", text: "Every implementation must keep these rules, which the conformancetest package checks:",
		why: "introduces the rules below"},
	{in: "Store", text: "1. One atomic operation decides a claim.",
		cases: []string{"one_key_64_goroutines", "many_keys_8_goroutines", "concurrent_takeover", "many_keys_takeover_8_goroutines"}},
	{in: "Store", text: "Never read, then write.",
		cases: []string{"one_key_64_goroutines", "many_keys_8_goroutines", "concurrent_takeover", "many_keys_takeover_8_goroutines"}},
	{in: "Store", text: "2. Every write made under a lease (Renew, Checkpoint, Complete, Release) is conditional on the token, atomically.",
		cases: []string{"stale_holder_changes_nothing", "release_then_reclaim", "repeated_operations"}},
	{in: "Store", text: "A holder whose lease was taken over gets [ErrLeaseLost] and changes nothing.",
		cases: []string{"stale_holder_changes_nothing"}},
	{in: "Store", text: "3. Lease and retention deadlines are judged by the backend's clock where it has one; a store without one takes an injectable clock.",
		cases: []string{"in_progress_retry_after", "takeover_after_lease_expiry", "completed_expires_after_retention", "abandoned_started_expires"}},
	{in: "Store", text: "Never compare a deadline with the client's wall clock when the server can decide.",
		cases: []string{"in_progress_retry_after", "takeover_after_lease_expiry"}}, // under ControlledClock only: see below
	{in: "Store", text: "4. Every operation is safe to repeat with the same token: a Claim whose reply was lost returns Acquired again for that token; a Complete that already landed succeeds; releasing an absent record succeeds.",
		cases: []string{"repeated_operations", "release_then_reclaim", "deadline_during_operation"}},
	{in: "Store", text: "[Do] relies on this to retry after an ambiguous error without ever running the effect twice.",
		cases: []string{"deadline_during_operation"}},
	{in: "Store", text: `5. An error that may have been applied is reported as an error, never as a definite outcome such as "not claimed".`,
		cases: []string{"deadline_during_operation"}},
	{in: "Store", text: "6. Expired records disappear on their own (TTL) or through [Sweeper]; correctness never depends on when deletion runs: an expired record is treated as absent by every operation.",
		cases: []string{"expired_is_absent", "completed_expires_after_retention", "abandoned_started_expires", "sweep_removes_only_expired"}},
	{in: "Store", text: "7. A canceled context changes nothing that was not already committed, and the context's error is returned (wrapped or not, so that errors.Is finds it).",
		cases: []string{"canceled_context"}},
	{in: "Store", text: "8. Values are copied both ways.",
		cases: []string{"replay_exact_bytes", "checkpoints_copied"}},
	{in: "Store", text: "The store keeps no reference to a slice it is given (a result, a checkpoint value): the caller may change or reuse it once the call returns.",
		cases: []string{"replay_exact_bytes", "checkpoints_copied"}},
	{in: "Store", text: "The Result and Checkpoints of a ClaimResult, the map and every value in it, belong to the caller.",
		cases: []string{"replay_exact_bytes", "checkpoints_copied"}},
	{in: "Store", text: "Fences strictly increase for a storage key across takeovers and across deletion and re-creation of its record, so a fence seen by an old holder is always smaller than any fence handed out after it.",
		cases: []string{"takeover_after_lease_expiry", "release_then_reclaim", "completed_expires_after_retention", "abandoned_started_expires", "expired_is_absent"}},
	{in: "Store", text: "The end of a lease does not take the record from its holder; only a takeover or the record's expiry does.",
		cases: []string{"late_holder_keeps_record", "expired_is_absent"}},
	{in: "Store", text: "Until then the holder's Claim is a repeat (same fence), and its Renew, Checkpoint, Complete and Release succeed, as they would before the lease ended.",
		cases: []string{"late_holder_keeps_record"}},
	{in: "Store", text: "Native errors (a driver's, a network's) are wrapped with %w so callers can reach them with errors.As.",
		why: "a suite that sees a store through its interface cannot cause a native error; the next sentence leaves it to adapter tests"},
	{in: "Store", text: "The suite checks rules 3 and 5 only in part, with an injectable clock and contexts that end during calls: a server's clock, a connection cut after a write and the wrapping of native errors are for an adapter's own tests.",
		why: "says what the suite does not check"},

	{in: "Store.Claim", text: "Claim atomically decides what a request for r.Key may do, following this table (the fingerprint is compared byte for byte):",
		cases: []string{"mismatch", "one_key_64_goroutines", "concurrent_takeover"}},
	{in: "Store.Claim", text: "record fingerprint lease outcome",
		why: "the table's header"},
	{in: "Store.Claim", text: "none/expired - - OutcomeAcquired: new record, new fence",
		cases: []string{"fresh_claim", "expired_is_absent", "completed_expires_after_retention", "abandoned_started_expires"}},
	{in: "Store.Claim", text: "any different - OutcomeMismatch",
		cases: []string{"mismatch"}},
	{in: "Store.Claim", text: "COMPLETED same - OutcomeReplay with the stored result",
		cases: []string{"replay_exact_bytes"}},
	{in: "Store.Claim", text: "STARTED same live OutcomeInProgress with the time left",
		cases: []string{"in_progress_retry_after"}},
	{in: "Store.Claim", text: "STARTED same expired OutcomeAcquired by takeover: token r.Token, a greater fence, Attempt+1, the checkpoints handed over",
		cases: []string{"takeover_after_lease_expiry", "stale_holder_changes_nothing", "concurrent_takeover"}},
	{in: "Store.Claim", text: "A STARTED record already held under r.Token (a repeated Claim whose reply was lost) returns OutcomeAcquired with the same fence, attempt and checkpoints, whether or not its lease has ended.",
		cases: []string{"repeated_operations", "late_holder_keeps_record"}},
	{in: "Store.Claim", text: "A Claim under the token of an expired record finds no record and acquires afresh.",
		cases: []string{"expired_is_absent"}},
	{in: "Store.Claim", text: "An acquired record's lease ends r.Lease after the store's now; the record itself is kept for r.Grace past the end of its lease (so that a takeover finds its checkpoints) and then expires.",
		cases: []string{"in_progress_retry_after", "takeover_after_lease_expiry", "abandoned_started_expires"}},
	{in: "Store.Claim", text: "A repeated Claim sets both anew, as a takeover does: r.Lease from now, then r.Grace, whatever the earlier Claim asked for.",
		cases: []string{"repeated_operations", "repeated_claim_sets_grace"}},

	{in: "Store.Renew", text: "Renew sets the lease of the STARTED record held under token to end lease after the store's now, sooner or later than before, and its retention to lease plus the grace of the Claim that last acquired it.",
		cases: []string{"renew_extends", "renew_keeps_grace"}},
	{in: "Store.Renew", text: "It returns ErrLeaseLost when the record is absent, expired, COMPLETED, or held under another token.",
		cases: []string{"stale_holder_changes_nothing", "expired_is_absent", "abandoned_started_expires", "repeated_operations"}},
	{in: "Store.Renew", text: "A lease that ended but was not taken over is renewed like a live one.",
		cases: []string{"late_holder_keeps_record"}},

	{in: "Store.Checkpoint", text: "Checkpoint stores value under name in the STARTED record held under token, replacing any earlier value of that name and keeping the other names.",
		cases: []string{"checkpoint_replaces", "takeover_after_lease_expiry"}},
	{in: "Store.Checkpoint", text: "It returns ErrLeaseLost as Renew does, and ErrTooLarge when the store cannot keep the value.",
		cases: []string{"stale_holder_changes_nothing", "expired_is_absent", "repeated_operations", "too_large"}},
	{in: "Store.Checkpoint", text: "It does not change the lease.",
		cases: []string{"checkpoint_replaces"}},

	{in: "Store.Complete", text: "Complete moves the STARTED record held under token to COMPLETED with result, drops its checkpoints (no later Claim returns them, not even after the record expires), and keeps it for retention from the store's now.",
		cases: []string{"replay_exact_bytes", "complete_drops_checkpoints", "completed_expires_after_retention"}},
	{in: "Store.Complete", text: "Completing again a record already COMPLETED under the same token succeeds and changes nothing, neither the result nor the retention.",
		cases: []string{"repeated_operations", "completed_expires_after_retention"}},
	{in: "Store.Complete", text: "It returns ErrLeaseLost when the record is absent, expired or held under another token, and ErrTooLarge, having written nothing, when result is larger than the store can keep.",
		cases: []string{"stale_holder_changes_nothing", "expired_is_absent", "too_large"}},

	{in: "Store.Release", text: "Release deletes the STARTED record held under token, so that the next Claim acquires it afresh (with a greater fence).",
		cases: []string{"release_then_reclaim"}},
	{in: "Store.Release", text: "Releasing an absent or expired record succeeds, whoever held it and in whatever state.",
		cases: []string{"repeated_operations", "release_then_reclaim", "expired_is_absent"}},
	{in: "Store.Release", text: "It returns ErrLeaseLost when the record is held under another token or is COMPLETED.",
		cases: []string{"release_then_reclaim", "repeated_operations"}},

	{in: "Sweeper", text: "Sweeper is the part of a store whose expired records are not removed by the backend itself (or not promptly); see [Capabilities].",
		cases: []string{"sweep_removes_only_expired"}},
	{in: "Sweeper", text: "Sweep deletes expired records, at most limit of them (limit <= 0 means no limit), and reports how many it deleted.",
		cases: []string{"sweep_removes_only_expired"}},
	{in: "Sweeper", text: "It may delete fewer, working in batches or skipping records that concurrent calls hold, but it makes progress: a call that finds expired records nobody holds deletes at least one, so calling it until it returns 0 deletes every record that expired before the first call.",
		cases: []string{"sweep_removes_only_expired"}},
	{in: "Sweeper", text: "It never deletes a live record: a STARTED one within its lease plus grace, even after a Renew or a repeated Claim moved that deadline, or a COMPLETED one within its retention.",
		cases: []string{"sweep_removes_only_expired"}},
	{in: "Sweeper", text: "It is safe to run from several processes at once.",
		cases: []string{"sweep_removes_only_expired"}},
	{in: "Sweeper", text: "Correctness never depends on sweeping: it only bounds storage.",
		cases: []string{"expired_is_absent", "completed_expires_after_retention", "abandoned_started_expires"}},

	{in: "Watcher", text: "Watcher is the part of a store that can push a change of a record (completion, release, deletion) instead of being polled; see [Capabilities].",
		cases: []string{"watch_wakes"}},
	{in: "Watcher", text: "Watch blocks until the record under key may have changed since the call began, or until ctx is done, in which case it returns the context's error.",
		cases: []string{"watch_wakes", "canceled_context"}},
	{in: "Watcher", text: "It must not miss a Complete or Release of the record made after it began; other changes (a takeover, the end of a lease, expiry, a sweep) it may miss, since callers also poll at the lease's retry-after hint.",
		cases: []string{"watch_wakes"}},
	{in: "Watcher", text: "A spurious wake-up is allowed.",
		cases: []string{"watch_wakes"}}, // the case watches again after one

	{in: "Inspector", text: "Inspector is the part of a store that lets operators and the reconciler see and fix records (see [Runner.Inspect], [Runner.Purge], [Runner.Stuck] and [Reconcile]); see [Capabilities].",
		cases: []string{"inspect_describes", "purge_deletes", "stuck_lists_ended_leases"}},
	{in: "Inspector", text: "It reads and deletes; it never claims, so it cannot make two holders.",
		cases: []string{"inspect_describes", "stuck_lists_ended_leases"}}, // records stay held by their holders
	{in: "Inspector.Inspect", text: "Inspect returns the record under key, with its result and its checkpoints.",
		cases: []string{"inspect_describes"}},
	{in: "Inspector.Inspect", text: "It returns [ErrNotFound] when the record is absent or expired.",
		cases: []string{"inspect_describes", "purge_deletes"}},
	{in: "Inspector.Purge", text: "Purge deletes the record under key, whatever its state.",
		cases: []string{"purge_deletes"}},
	{in: "Inspector.Purge", text: "The next Claim acquires the key afresh, with a greater fence, and a holder of the purged record gets ErrLeaseLost from its next Renew, Checkpoint, Complete or Release.",
		cases: []string{"purge_deletes"}},
	{in: "Inspector.Purge", text: "Purging an absent or expired record succeeds.",
		cases: []string{"purge_deletes"}},
	{in: "Inspector.Stuck", text: "Stuck lists the STARTED records whose lease has ended and which have not expired: their holder stopped renewing, and nobody took them over.",
		cases: []string{"stuck_lists_ended_leases"}},
	{in: "Inspector.Stuck", text: `It returns at most limit of them (limit is positive), starting after cursor ("" for the first page), and the cursor of the next page, "" after the last.`,
		cases: []string{"stuck_lists_ended_leases"}},
	{in: "Inspector.Stuck", text: "Every record that is stuck during the whole listing is listed once; one that changes during it may be listed or not.",
		cases: []string{"stuck_lists_ended_leases"}},
	{in: "RecordInfo", text: "RecordInfo describes a record, for [Inspector].",
		why: "definition"},
	{in: "RecordInfo.Key", text: "Key is the storage key.",
		cases: []string{"inspect_describes"}},
	{in: "RecordInfo.State", text: "State is StateStarted or StateCompleted.",
		cases: []string{"inspect_describes", "stuck_lists_ended_leases"}},
	{in: "RecordInfo.Fingerprint", text: "Fingerprint is the fingerprint of the request that created the record.",
		cases: []string{"inspect_describes", "stuck_lists_ended_leases"}},
	{in: "RecordInfo.Fence", text: "Fence and Attempt are those of the record's last acquisition.",
		cases: []string{"inspect_describes", "stuck_lists_ended_leases"}},
	{in: "RecordInfo.LeaseLeft", text: "LeaseLeft is, for a STARTED record, the time left on its holder's lease by the store's clock; zero once the lease has ended.",
		cases: []string{"inspect_describes", "stuck_lists_ended_leases"}},
	{in: "RecordInfo.ExpiresIn", text: "ExpiresIn is the time left before the record expires, by the store's clock.",
		cases: []string{"inspect_describes"}},
	{in: "RecordInfo.Result", text: "Result is the stored result of a COMPLETED record.",
		cases: []string{"inspect_describes"}},
	{in: "RecordInfo.ResultSize", text: "ResultSize is the length of the stored result.",
		why: "filled by the Runner; root package tests check it"},
	{in: "RecordInfo.ResultSize", text: "Stores may leave it zero; [Runner.Inspect] sets it, and leaves Result out unless asked.",
		why: "a permission for stores, and the Runner's duty, which root package tests check"},
	{in: "RecordInfo.Checkpoints", text: "Checkpoints are the recovery points of a STARTED record.",
		cases: []string{"inspect_describes"}},

	{in: "Token", text: "Token identifies one holder's lease on a record.",
		why: "definition"},
	{in: "Token", text: "[Do] generates 128 random bits for every call (rendered as 32 lowercase hex digits); stores treat it as an opaque string and compare it exactly.",
		cases: []string{"stale_holder_changes_nothing"}},

	{in: "ClaimRequest", text: "ClaimRequest is the input of [Store.Claim].",
		why: "definition"},
	{in: "ClaimRequest.Key", text: "Key is the storage key: scope and client key, already encoded without ambiguity by the caller.",
		cases: []string{"scope_isolation"}},
	{in: "ClaimRequest.Key", text: "Stores must accept any valid UTF-8 string without NUL of up to [MaxStorageKeyLen] bytes.",
		cases: []string{"odd_keys"}},
	{in: "ClaimRequest.Fingerprint", text: "Fingerprint identifies the request; only equality matters.",
		cases: []string{"mismatch"}},
	{in: "ClaimRequest.Token", text: "Token is the new holder's token.",
		cases: []string{"takeover_after_lease_expiry", "stale_holder_changes_nothing"}},
	{in: "ClaimRequest.Lease", text: "Lease is how long the lease lasts from the store's now.",
		cases: []string{"in_progress_retry_after"}},
	{in: "ClaimRequest.Lease", text: "Positive.",
		why: "a precondition on the caller: the suite never passes another lease"},
	{in: "ClaimRequest.Grace", text: "Grace is how long a STARTED record is kept after its lease ends, so a takeover can find its checkpoints.",
		cases: []string{"abandoned_started_expires", "renew_keeps_grace", "repeated_claim_sets_grace"}},
	{in: "ClaimRequest.Grace", text: "Not negative.",
		cases: []string{"expired_is_absent"}}, // zero is valid: the case claims with no grace

	{in: "ClaimResult", text: "ClaimResult is the output of [Store.Claim].",
		why: "definition"},
	{in: "ClaimResult.Outcome", text: "Outcome is what the store decided.",
		cases: []string{"fresh_claim", "mismatch", "in_progress_retry_after", "replay_exact_bytes"}},
	{in: "ClaimResult.Fence", text: "Fence is the record's fence: for OutcomeAcquired the new holder's fence, for the other outcomes the current one, when known.",
		cases: []string{"in_progress_retry_after", "replay_exact_bytes", "repeated_operations"}},
	{in: "ClaimResult.Attempt", text: "Attempt counts the acquisitions of this record: 1 for a fresh claim, one more for every takeover.",
		cases: []string{"fresh_claim", "takeover_after_lease_expiry"}},
	{in: "ClaimResult.RetryAfter", text: "RetryAfter is, for OutcomeInProgress, the time left on the current holder's lease as judged by the store.",
		cases: []string{"in_progress_retry_after", "renew_extends"}},
	{in: "ClaimResult.Result", text: "Result is the stored result, for OutcomeReplay.",
		cases: []string{"replay_exact_bytes", "mismatch"}},
	{in: "ClaimResult.ExpiresIn", text: "ExpiresIn is, for OutcomeReplay, the time left before the record expires, by the store's clock, when the store knows it without another round trip; zero when it does not say.",
		cases: []string{"completed_expires_after_retention"}},
	{in: "ClaimResult.ExpiresIn", text: "It is optional: [Do] then neither caches the replay ([WithReplayCache]) nor tells when the record expires (Result.ExpiresAt).",
		why: "what Do does with it, not a rule of the store"},
	{in: "ClaimResult.Checkpoints", text: "Checkpoints are the recovery points of the record, for OutcomeAcquired by takeover or by a repeated claim.",
		cases: []string{"takeover_after_lease_expiry", "repeated_operations"}},
	{in: "ClaimResult.Checkpoints", text: "Empty otherwise.",
		cases: []string{"fresh_claim", "in_progress_retry_after", "complete_drops_checkpoints"}},
	{in: "Batcher", text: "Batcher is the part of a store that claims, and then finishes, many independent records in one round trip each, for [DoBatch].",
		cases: []string{"batch_claims_as_claims", "batch_finish_per_item"}},
	{in: "Batcher", text: "Each item obeys the rules of [Store] as its own call would: ClaimBatch decides each claim as Claim does, and FinishBatch completes or releases each record as Complete or Release does, conditional on the item's token.",
		cases: []string{"batch_claims_as_claims", "batch_racing_single_claims", "batch_finish_per_item"}},
	{in: "Batcher", text: "Items are independent: one's failure or refusal never changes another's outcome, and a repeat of a batch with the same tokens (after an ambiguous error) is safe item by item (rule 4).",
		cases: []string{"batch_finish_per_item", "batch_repeat_same_tokens", "batch_claims_as_claims"}},
	{in: "Batcher", text: "The keys of one batch are distinct ([DoBatch] sends each storage key once).",
		why: "what the caller promises; the cases send distinct keys"},
	{in: "Batcher", text: "A batch larger than the backend takes in one operation is split by the store, or declared in [Limits] MaxBatch.",
		cases: []string{"batch_racing_single_claims"}}, // 64 items in one batch
	{in: "Batcher.ClaimBatch", text: "ClaimBatch claims each request.",
		cases: []string{"batch_claims_as_claims"}},
	{in: "Batcher.ClaimBatch", text: "It returns one result and one error per request, in order; errs[i] is what Claim would have returned for reqs[i] (an error for the whole batch, such as a lost connection, is the error of every item it may have applied to).",
		cases: []string{"batch_claims_as_claims", "batch_racing_single_claims"}},
	{in: "Batcher.FinishBatch", text: "FinishBatch completes (Release false) or releases (Release true) each record held under its item's token.",
		cases: []string{"batch_finish_per_item", "batch_repeat_same_tokens"}},
	{in: "Batcher.FinishBatch", text: "It returns one error per item, in order: nil, ErrLeaseLost, ErrTooLarge, or what the store's Complete or Release would return.",
		cases: []string{"batch_finish_per_item"}},
	{in: "Finish", text: "Finish is one item of [Batcher.FinishBatch]: the completion or the release of the record under Key held under Token.",
		why: "definition"},
	{in: "Finish.Release", text: "Release makes the item a Release; otherwise it is a Complete with Result and Retention.",
		cases: []string{"batch_finish_per_item", "batch_repeat_same_tokens"}},
}

// contractDocs returns the doc comments the clauses cover, keyed like
// clause.in, with runs of spaces collapsed.
func contractDocs(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../store.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatalf("reading the contract: %v", err)
	}
	covered := []string{"Store", "Sweeper", "Watcher", "Inspector", "RecordInfo", "Token", "ClaimRequest", "ClaimResult", "Batcher", "Finish"}
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range g.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok || !slices.Contains(covered, ts.Name.Name) {
				continue
			}
			docs[ts.Name.Name] = collapse(g.Doc.Text())
			var fields *ast.FieldList
			switch typ := ts.Type.(type) {
			case *ast.InterfaceType:
				fields = typ.Methods
			case *ast.StructType:
				fields = typ.Fields
			}
			if fields == nil {
				continue
			}
			for _, field := range fields.List {
				if doc := collapse(field.Doc.Text()); doc != "" {
					docs[ts.Name.Name+"."+field.Names[0].Name] = doc
				}
			}
		}
	}
	for _, name := range covered {
		if docs[name] == "" {
			t.Fatalf("../store.go has no documented type %s", name)
		}
	}
	return docs
}

func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestClauses checks that every sentence of the contract is in the table,
// every entry of the table is in the contract, every entry has a case or
// says why it needs none, and every case checks some sentence.
func TestClauses(t *testing.T) {
	docs := contractDocs(t)
	left := maps.Clone(docs)
	checked := map[string]bool{}
	for _, c := range clauses {
		doc, ok := left[c.in]
		switch {
		case !ok:
			t.Errorf("clause %q: no doc comment %s in ../store.go", c.text, c.in)
			continue
		case !strings.Contains(doc, c.text):
			t.Errorf("clause %q is not (or no longer) in the doc comment of %s", c.text, c.in)
			continue
		case len(c.cases) == 0 && c.why == "":
			t.Errorf("clause %q of %s: no case checks it and no reason is given", c.text, c.in)
		}
		left[c.in] = strings.Replace(doc, c.text, "", 1)
		for _, name := range c.cases {
			if !slices.ContainsFunc(cases, func(tc testCase) bool { return tc.name == name }) {
				t.Errorf("clause %q names case %s, which the suite does not have", c.text, name)
			}
			checked[name] = true
		}
	}
	for in, rest := range left {
		if rest = strings.TrimSpace(rest); rest != "" {
			t.Errorf("the doc comment of %s says what no clause maps to a case: %q", in, rest)
		}
	}
	for _, tc := range cases {
		if !checked[tc.name] {
			t.Errorf("case %s checks no clause of the contract", tc.name)
		}
	}
}
