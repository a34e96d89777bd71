package mongo

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/exactlyonce/idempotency"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// MaxBatch is the most items [Store.ClaimBatch] and [Store.FinishBatch]
// take in one call ([idempotency.Limits] MaxBatch: idempotency.DoBatch
// splits larger batches). It keeps the read of a batch's records, a find
// whose filter lists every key, far below MongoDB's 16 MiB command limit
// (1,000 keys of up to 1 KiB), and its reply within a few batches; the
// bulk writes themselves the driver splits at the server's limits.
const MaxBatch = 1000

var _ idempotency.Batcher = (*Store)(nil)

// ClaimBatch implements [idempotency.Batcher]: it claims every request
// with two commands, whatever their number (up to [MaxBatch]; a larger
// batch is split into runs of MaxBatch, two commands each): one bulk
// write of the items' claims and one find of their records. An empty
// batch sends nothing; an invalid request (see
// [idempotency.ValidateClaim]) gets its error and is not sent; a batch of
// one valid request is a call of [Store.Claim] (one command for a fresh
// key).
//
// Each claim is the statement of Claim's findAndModify, as an update
// with upsert (claimFilter and claimPipeline, the item's values bound
// inside the statement): one atomic single-document write judged by the
// server's $$NOW, as Claim's is. The bulk write is unordered, so one
// item's refusal never stops another's. A bulk write reports per item only
// whether it failed, not the document it wrote, so the find then reads
// every item's record in the same causally consistent session: an item
// whose update applied finds its own record (its fence, attempt and,
// read once more only when it has some, checkpoints); one refused by the
// unique index (E11000) is decided from the record that holds the key,
// as Claim decides after its refused upsert (decideFromRead). An item
// whose record changed between the two commands (taken over, expired or
// released since) is sent again, with the same token, as Claim sends its
// update again; the others are answered.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	results, errs := make([]idempotency.ClaimResult, len(reqs)), make([]error, len(reqs))
	for lo, hi := range chunks(len(reqs)) {
		s.claimChunk(ctx, reqs[lo:hi], results[lo:hi], errs[lo:hi])
	}
	return results, errs
}

// chunks yields the bounds of the runs of at most MaxBatch items into
// which a batch of n is split.
func chunks(n int) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for lo := 0; lo < n; lo += MaxBatch {
			if !yield(lo, min(lo+MaxBatch, n)) {
				return
			}
		}
	}
}

// claimChunk claims at most MaxBatch requests, setting results[i] and
// errs[i] for reqs[i].
func (s *Store) claimChunk(ctx context.Context, reqs []idempotency.ClaimRequest, results []idempotency.ClaimResult, errs []error) {
	var todo []int
	for i, r := range reqs {
		if errs[i] = idempotency.ValidateClaim("mongo", r); errs[i] == nil {
			todo = append(todo, i)
		}
	}
	fail := func(items []int, err error) {
		for _, i := range items {
			errs[i] = err
		}
	}
	switch len(todo) {
	case 0:
		return
	case 1:
		// Claim's findAndModify returns the record it wrote: one command
		// for a fresh key where the bulk write needs its find.
		i := todo[0]
		results[i], errs[i] = s.Claim(ctx, reqs[i])
		return
	}
	if err := s.begin(ctx); err != nil {
		fail(todo, err)
		return
	}
	cctx, end, err := s.c.causal(ctx)
	if err != nil {
		fail(todo, s.fail(ctx, "claim", err))
		return
	}
	defer end()
	for range claimAttempts {
		stmts := make([]update, len(todo))
		for k, i := range todo {
			r := reqs[i]
			let := claimLet(string(r.Fingerprint), string(r.Token), r.Lease, r.Grace)
			stmts[k] = update{filter: boundFilter(claimFilter(r.Key), let), pipeline: boundPipeline(claimPipeline(), let, nil)}
		}
		werrs, err := s.c.bulkUpdate(cctx, stmts)
		if err != nil {
			fail(todo, s.fail(ctx, "claim", err))
			return
		}
		// The items to read: those whose update applied (own), and those
		// the record holding the key refused.
		var read []int
		own := make(map[int]bool, len(todo))
		for k, i := range todo {
			switch {
			case werrs[k] == nil:
				read, own[i] = append(read, i), true
			case mongo.IsDuplicateKeyError(werrs[k]):
				read = append(read, i)
			default:
				errs[i] = s.fail(ctx, "claim", werrs[k])
			}
		}
		if len(read) == 0 {
			return
		}
		docs, err := s.readBatch(cctx, reqs, read, batchReadProjection())
		if err != nil {
			// The applied claims are acquisitions nobody was told of:
			// errors, which the caller repeats with the same tokens.
			fail(read, s.fail(ctx, "claim: reading the records", err))
			return
		}
		var again, more []int
		for _, i := range read {
			r, doc := reqs[i], docs[reqs[i].Key]
			switch {
			case !own[i]:
				// Another record holds the key: never "not claimed" on the
				// duplicate key error alone.
				if res, ok := decideFromRead(doc, r); ok {
					results[i] = res
				} else {
					again = append(again, i)
				}
			case !ownFromRead(doc, r):
				again = append(again, i)
			case hasCheckpoints(doc):
				more = append(more, i)
			default:
				results[i], errs[i] = acquired(doc, r)
			}
		}
		if len(more) > 0 {
			// A takeover or a repeat with checkpoints: they are read now,
			// so that the in-progress and replayed items of the first read
			// did not carry theirs.
			docs, err := s.readBatch(cctx, reqs, more, checkpointProjection())
			if err != nil {
				fail(more, s.fail(ctx, "claim: reading the checkpoints", err))
				return
			}
			for _, i := range more {
				r, doc := reqs[i], docs[reqs[i].Key]
				if ownFromRead(doc, r) {
					results[i], errs[i] = acquired(doc, r)
				} else {
					again = append(again, i)
				}
			}
		}
		if len(again) == 0 {
			return
		}
		todo = again
	}
	for _, i := range todo {
		errs[i] = fmt.Errorf("mongo: claim: the record of key %q changed between the update and the read %d times; try again", reqs[i].Key, claimAttempts)
	}
}

// ownFromRead reports whether doc, read after a claim's update applied,
// is still the claim's record: live, STARTED and held under its token.
// Only a takeover, the record's expiry or a purge changes that, and each
// leaves another record (or none), for which the claim is sent again.
func ownFromRead(doc bson.Raw, r idempotency.ClaimRequest) bool {
	if doc == nil {
		return false
	}
	live, _ := doc.Lookup("live").BooleanOK()
	state, _ := doc.Lookup(fieldState).StringValueOK()
	tok, _ := decodeString(doc.Lookup(fieldToken))
	return live && state == stateStarted && tok == string(r.Token)
}

// hasCheckpoints reports whether a record read with batchReadProjection
// has checkpoints.
func hasCheckpoints(doc bson.Raw) bool {
	has, _ := doc.Lookup("cps").BooleanOK()
	return has
}

// readBatch reads the records of reqs[i] for i in items, by storage key.
func (s *Store) readBatch(ctx context.Context, reqs []idempotency.ClaimRequest, items []int, projection bson.D) (map[string]bson.Raw, error) {
	keys := make([]string, len(items))
	for k, i := range items {
		keys[k] = reqs[i].Key
	}
	return s.readKeys(ctx, keys, projection)
}

// readKeys reads the records under keys in one find, by storage key.
func (s *Store) readKeys(ctx context.Context, keys []string, projection bson.D) (map[string]bson.Raw, error) {
	found, err := s.c.findIDs(ctx, keys, projection)
	if err != nil {
		return nil, err
	}
	docs := make(map[string]bson.Raw, len(found))
	for _, doc := range found {
		key, ok := decodeString(doc.Lookup(fieldID))
		if !ok {
			return nil, fmt.Errorf("mongo: a record with the _id %s, which no storage key encodes", doc.Lookup(fieldID))
		}
		docs[key] = doc
	}
	return docs, nil
}

// FinishBatch implements [idempotency.Batcher]: it completes or releases
// every item with one bulk write, whatever their number (up to
// [MaxBatch]; a larger batch is split into runs of MaxBatch), plus one
// find when a release finds no record held under its token.
//
// Each item is the statement of Complete's or Release's update,
// conditional on the item's token (completeFilter, heldFilter) and sent
// as an upsert whose pipeline refuses to insert (boundPipeline): so the
// reply says of each statement whether it applied (no write error) or
// its filter matched nothing (the guard's error), which an update's
// match count, one number for the whole command, would not. A completion
// that matched nothing gets idempotency.ErrLeaseLost, as Complete's does;
// a release that matched nothing is decided, as Release's is, from its
// record read afterwards (releaseFromRead): absent or not live is a
// success, held by another token or completed is ErrLeaseLost. A result
// over [Options.MaxValueSize] gets idempotency.ErrTooLarge before anything
// is sent, and one the server refuses (a document over 16 MiB) after,
// with nothing written, for that item only.
func (s *Store) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	errs := make([]error, len(items))
	for lo, hi := range chunks(len(items)) {
		s.finishChunk(ctx, items[lo:hi], errs[lo:hi])
	}
	return errs
}

// finishChunk finishes at most MaxBatch items, setting errs[i] for
// items[i].
func (s *Store) finishChunk(ctx context.Context, items []idempotency.Finish, errs []error) {
	var todo []int
	for i, f := range items {
		if !f.Release {
			errs[i] = s.checkCompletion(f.Result, f.Retention)
		}
		if errs[i] == nil {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return
	}
	if err := s.begin(ctx); err != nil {
		for _, i := range todo {
			errs[i] = err
		}
		return
	}
	cctx, end, err := s.c.causal(ctx)
	if err != nil {
		for _, i := range todo {
			errs[i] = s.fail(ctx, finishName(items[i]), err)
		}
		return
	}
	defer end()
	for range claimAttempts {
		stmts := make([]update, len(todo))
		for k, i := range todo {
			stmts[k] = finishStatement(items[i])
		}
		werrs, err := s.c.bulkUpdate(cctx, stmts)
		if err != nil {
			if isTooLarge(err) && ctx.Err() == nil {
				// The whole write refused as too large, which no item
				// should be (each result is within MaxValueLimit): one
				// call per item, so that only the item too large gets
				// ErrTooLarge, never the whole batch.
				for _, i := range todo {
					errs[i] = s.finishOne(ctx, items[i])
				}
				return
			}
			for _, i := range todo {
				errs[i] = s.fail(ctx, finishName(items[i]), err)
			}
			return
		}
		var unheld []int
		for k, i := range todo {
			switch notHeld := isNotHeld(werrs[k]); {
			case werrs[k] == nil:
			case notHeld && !items[i].Release:
				errs[i] = idempotency.ErrLeaseLost
			case notHeld:
				unheld = append(unheld, i)
			default:
				errs[i] = s.fail(ctx, finishName(items[i]), werrs[k])
			}
		}
		if len(unheld) == 0 {
			return
		}
		keys := make([]string, len(unheld))
		for k, i := range unheld {
			keys[k] = items[i].Key
		}
		docs, err := s.readKeys(cctx, keys, readProjection())
		if err != nil {
			for _, i := range unheld {
				errs[i] = s.fail(ctx, "release: reading the record", err)
			}
			return
		}
		var again []int
		for _, i := range unheld {
			if done, lost := releaseFromRead(docs[items[i].Key], items[i].Token); done {
				errs[i] = lost
			} else {
				again = append(again, i)
			}
		}
		if len(again) == 0 {
			return
		}
		todo = again
	}
	for _, i := range todo {
		errs[i] = fmt.Errorf("mongo: release: the record of key %q changed between the update and the read %d times; try again", items[i].Key, claimAttempts)
	}
}

// isNotHeld reports whether a finishing statement's write error says its
// filter matched nothing: the guard's refusal (codeNotHeld) or, should a
// server try the insert before the pipeline, the unique index's (E11000).
// Either way nothing was written.
func isNotHeld(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(codeNotHeld) || mongo.IsDuplicateKeyError(err)
}

// finishStatement is the statement of a Finish: Complete's update or
// Release's, guarded so that it never inserts.
func finishStatement(f idempotency.Finish) update {
	tok := letDoc(varToken, encodeString(string(f.Token)))
	if f.Release {
		filter := heldFilter(f.Key)
		return update{filter: boundFilter(filter, tok), pipeline: boundPipeline(releasePipeline(), tok, filterExpr(filter))}
	}
	filter := completeFilter(f.Key)
	let := letDoc(varToken, encodeString(string(f.Token)), varRetention, millis(f.Retention), varResult, binary(f.Result))
	return update{filter: boundFilter(filter, tok), pipeline: boundPipeline(completePipeline(), let, filterExpr(filter))}
}

// finishOne finishes one item with the single call.
func (s *Store) finishOne(ctx context.Context, f idempotency.Finish) error {
	if f.Release {
		return s.Release(ctx, f.Key, f.Token)
	}
	return s.Complete(ctx, f.Key, f.Token, f.Result, f.Retention)
}

func finishName(f idempotency.Finish) string {
	if f.Release {
		return "release"
	}
	return "complete"
}
