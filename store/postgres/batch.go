package postgres

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The statements of a batch take each column of their items as one array
// parameter, unnested into the input rows "i", numbered n from 1 in the
// order sent: a statement has the same few parameters whatever the size of
// its batch, so PostgreSQL's limit of 65535 parameters never applies, and
// one prepared statement serves every size. Each array goes as the text of
// an array literal (see arrayText), cast on the server, which costs the
// client a fraction of pgx's encoding of a Go slice, element by element.
//
// batchClaimInputSQL: $1 keys, $2 fingerprints, $3 tokens, $4 leases µs,
// $5 graces µs.
const batchClaimInputSQL = `
i AS MATERIALIZED (SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::text[], $4::text::bigint[], $5::text::bigint[])
	WITH ORDINALITY AS i(key, fp, tok, lease, grace, n))`

// batchInsertSQL is the batch's first statement, the two plain statements
// of a single claim (claimInsertSQL, claimReadSQL) in one: it inserts a
// fresh record for every key that has no row, takes no lock on a row that
// exists, and returns for each item its number, the fence it inserted (or
// NULL), and the row the statement's snapshot has of its key when it
// inserted none, with the server's clock read after the snapshot: as a
// single claim's read does, that row answers a replay, a mismatch or a
// claim in progress under another token (see claimReadSQL). The items it
// leaves undecided (a takeover, an expired row, a row committed after the
// snapshot) go on to batchClaimSQL. The read of an item it inserted is
// skipped: OFFSET 0 keeps the lateral subquery a subquery, whose
// condition on ins PostgreSQL then checks once, before its index scan.
const batchInsertSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),` + batchClaimInputSQL + `,
ins AS (` + freshRowSQL + `	FROM c, i
	ON CONFLICT (key) DO NOTHING
	RETURNING r.key, r.fence
)
SELECT i.n, ins.fence, r.fence, r.attempt, r.fingerprint, r.state, r.token, r.lease_until, r.expires_at, r.result, c.now
FROM c, i
LEFT JOIN ins ON ins.key = i.key
LEFT JOIN LATERAL (SELECT * FROM {T} AS r WHERE r.key = i.key AND ins.key IS NULL OFFSET 0) AS r ON true`

// batchClaimSQL is claimSQL over the input rows: each item is decided
// under its row's lock by the same conflict clause (takeoverSQL), and
// returned with its number and the columns of claimSQL. An item without a
// row (its row was committed after the snapshot) runs again.
const batchClaimSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),` + batchClaimInputSQL + `,
ins AS (` + freshRowSQL + `	FROM c, i
` + takeoverSQL + `	RETURNING r.key, r.fence, r.attempt, r.checkpoints
),
cur AS (
	SELECT i.n, i.fp, i.tok, r.fingerprint, r.state, r.token, r.fence, r.attempt, r.lease_until, r.expires_at, r.result
	FROM i JOIN {T} AS r ON r.key = i.key
	WHERE NOT EXISTS (SELECT FROM ins WHERE ins.key = i.key)
	FOR SHARE OF r
)
SELECT i.n, true, ins.fence, ins.attempt, ins.checkpoints::text,
	NULL::text, NULL::text, 0::bigint, NULL::bytea, false
FROM ins JOIN i ON i.key = ins.key
UNION ALL
SELECT cur.n, false, cur.fence, cur.attempt, NULL::text,
	cur.fingerprint, cur.state,
	GREATEST(0, ceil(extract(epoch FROM cur.lease_until - t.now) * 1000000))::bigint,
	cur.result,
	cur.expires_at <= t.now OR (cur.state = 'started' AND cur.fingerprint = cur.fp
		AND (cur.lease_until <= t.now OR cur.token = cur.tok))
FROM cur, LATERAL (SELECT clock_timestamp() AS now) AS t`

// batchFinishSQL completes (rel false) or releases (rel true) each item's
// record held under its token, with the SET lists of completeSQL and
// releaseSQL, and returns the numbers of the items it changed. With
// Options.Notify, each changed row notifies its key's hash ($6), as the
// single statements do; without, $6 is empty.
//
// $1 keys, $2 tokens, $3 results, $4 retentions µs, $5 releases, $6 hashes.
const batchFinishSQL = `
WITH i AS MATERIALIZED (SELECT * FROM unnest($1::text::text[], $2::text::text[], $3::text::bytea[], $4::text::bigint[], $5::text::bool[], $6::text::text[])
	WITH ORDINALITY AS i(key, tok, res, ret, rel, hash, n)),
done AS (
	UPDATE {T} AS r SET` + completeSetSQL + `
	FROM i
	WHERE r.key = i.key AND NOT i.rel AND r.token = i.tok AND r.state = 'started' AND r.expires_at > clock_timestamp()
	RETURNING i.n{NOTIFYB}
),
gone AS (
	UPDATE {T} AS r SET` + releaseSetSQL + `
	FROM i
	WHERE r.key = i.key AND i.rel AND r.token = i.tok AND r.state = 'started' AND r.expires_at > clock_timestamp()
	RETURNING i.n{NOTIFYB}
)
SELECT n FROM done UNION ALL SELECT n FROM gone`

// batchFinishCheckSQL is completeFallbackSQL and releaseSQL's check over
// the items batchFinishSQL changed nothing for: it returns, for each item
// whose key has a live row, whether that row is COMPLETED under the item's
// token, with a locking read for the reason given at completeFallbackSQL.
// A completion is done when it is; a release is done when its key has no
// live row.
//
// $1 keys, $2 tokens.
const batchFinishCheckSQL = `
SELECT i.n, r.state = 'completed' AND r.token = i.tok
FROM unnest($1::text::text[], $2::text::text[]) WITH ORDINALITY AS i(key, tok, n)
JOIN {T} AS r ON r.key = i.key
WHERE r.expires_at > clock_timestamp()
FOR SHARE OF r`

// batchNotify is the RETURNING of batchFinishSQL's changes with notify.
func batchNotify(channel string, notify bool) string {
	if !notify {
		return ""
	}
	return ", pg_notify('" + channel + "', i.hash)"
}

const (
	// batchItems is the most items one statement of a batch carries:
	// larger batches are sent in several statements, so that none holds
	// many row locks for long.
	batchItems = 1000
	// batchBytes bounds the results one FinishBatch statement carries,
	// far below the 1 GB of a bytea[] parameter.
	batchBytes = 16 << 20
	// batchDeadlockRetries bounds how often a batch statement that
	// PostgreSQL aborted to break a deadlock (with another batch on the
	// same keys, locking them in another order) runs again: it was rolled
	// back entirely.
	batchDeadlockRetries = 3
)

// ClaimBatch implements [idempotency.Batcher]: it claims every request in
// one statement over arrays (batchInsertSQL), which inserts the fresh keys
// and answers the replays, mismatches and claims in progress it reads, and
// decides the takeovers, expired rows and races in one more
// (batchClaimSQL), each item by the same clauses and the same server clock
// as its single [Store.Claim]. A batch of any size costs one round trip per
// 1000 items (two with a takeover among them); the items go in the order
// of their keys, so that batches on the same keys lock them in one order,
// and a deadlock PostgreSQL breaks anyway (the statement is rolled back)
// runs the statement again. A request Claim refuses gets that error, and a
// statement that fails fails its own items. Requests for the same key in
// one batch are claimed one after another, as single calls in that order.
//
// A batch of one valid request is a single Claim. In a transaction bound
// to ctx ([DoTx], a [TxExecutor]), each item is a Claim in that
// transaction.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	if s.txOf(ctx) != nil {
		return idempotency.ClaimEach(ctx, s, reqs)
	}
	results, errs := make([]idempotency.ClaimResult, len(reqs)), make([]error, len(reqs))
	todo := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if errs[i] = idempotency.ValidateClaim("postgres", r); errs[i] == nil {
			todo = append(todo, i)
		}
	}
	if len(todo) == 1 {
		// One item: a single claim's plain statements cost the server
		// less than the statement over arrays.
		i := todo[0]
		results[i], errs[i] = s.claim(ctx, s.db, reqs[i])
		return results, errs
	}
	key := func(i int) string { return reqs[i].Key }
	eachRound(todo, key, func(chunk []int) bool { return len(chunk) < batchItems }, func(chunk []int) {
		s.claimChunk(ctx, reqs, chunk, results, errs)
	})
	return results, errs
}

// eachRound runs do on items (indexes) in rounds of distinct keys: the
// first item of each key, then the second, and so on, each round in the
// order of its keys and in chunks that room(chunk) lets grow.
func eachRound(items []int, key func(int) string, room func(chunk []int) bool, do func(chunk []int)) {
	for len(items) > 0 {
		seen := make(map[string]struct{}, len(items))
		var round, rest []int
		for _, i := range items {
			if _, dup := seen[key(i)]; dup {
				rest = append(rest, i)
				continue
			}
			seen[key(i)] = struct{}{}
			round = append(round, i)
		}
		slices.SortFunc(round, func(a, b int) int { return cmp.Compare(key(a), key(b)) })
		for len(round) > 0 {
			n := 1
			for n < len(round) && room(round[:n]) {
				n++
			}
			do(round[:n])
			round = round[n:]
		}
		items = rest
	}
}

// claimArgs are the array parameters of the claim statements for items.
func claimArgs(reqs []idempotency.ClaimRequest, items []int) []any {
	var keys, fps, toks, leases, graces arrayText
	n := 0
	for _, i := range items {
		n += len(reqs[i].Key)
	}
	keys.grow(n + 3*len(items))
	fps.grow(len(items) * (len(reqs[items[0]].Fingerprint) + 3))
	toks.grow(len(items) * (len(reqs[items[0]].Token) + 3))
	leases.grow(len(items) * 12)
	graces.grow(len(items) * 12)
	for _, i := range items {
		r := reqs[i]
		keys.text(r.Key)
		fps.text(string(r.Fingerprint))
		toks.text(string(r.Token))
		leases.int(micros(r.Lease))
		graces.int(micros(r.Grace))
	}
	return []any{keys.String(), fps.String(), toks.String(), leases.String(), graces.String()}
}

// arrayText builds the text of a PostgreSQL array literal, element by
// element: strings quoted (a backslash or a double quote escaped), bytes
// as quoted bytea hex, numbers and booleans bare. Its String, the
// parameter, is cast to the array type by the statement.
type arrayText struct{ b []byte }

// grow makes room for about n bytes of elements, before the first.
func (a *arrayText) grow(n int) {
	if a.b == nil {
		a.b = make([]byte, 0, n+2)
	}
}

func (a *arrayText) next() {
	if len(a.b) == 0 {
		a.b = append(a.b, '{')
	} else {
		a.b = append(a.b, ',')
	}
}

func (a *arrayText) text(s string) {
	a.next()
	a.b = append(a.b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			a.b = append(a.b, '\\')
		}
		a.b = append(a.b, s[i])
	}
	a.b = append(a.b, '"')
}

func (a *arrayText) bytea(v []byte) {
	a.next()
	a.b = append(a.b, `"\\x`...)
	a.b = hex.AppendEncode(a.b, v)
	a.b = append(a.b, '"')
}

func (a *arrayText) int(v int64) {
	a.next()
	a.b = strconv.AppendInt(a.b, v, 10)
}

func (a *arrayText) bool(v bool) {
	a.next()
	if v {
		a.b = append(a.b, 't')
	} else {
		a.b = append(a.b, 'f')
	}
}

// String closes the literal; an array of no elements is "{}".
func (a *arrayText) String() string {
	if len(a.b) == 0 {
		return "{}"
	}
	return string(append(a.b, '}'))
}

// claimChunk claims items, whose keys are distinct, into results and
// errs.
func (s *Store) claimChunk(ctx context.Context, reqs []idempotency.ClaimRequest, items []int, results []idempotency.ClaimResult, errs []error) {
	type row struct {
		n        int64
		inserted pgtype.Int8 // the fence inserted
		found    bool        // the snapshot has a row
		readRow
	}
	rows, err := batchQuery(ctx, s, "claim", s.sql.batchInsert, len(items), claimArgs(reqs, items), func(rs pgx.CollectableRow) (row, error) {
		var r row
		var fence pgtype.Int8
		var attempt pgtype.Int4
		var fp, state, token pgtype.Text
		err := rs.Scan(&r.n, &r.inserted, &fence, &attempt, &fp, &state, &token, &r.leaseUntil, &r.expiresAt, &r.result, &r.now)
		r.found = fence.Valid && attempt.Valid && fp.Valid && state.Valid && token.Valid
		r.fence, r.attempt, r.fingerprint, r.state, r.token = fence.Int64, attempt.Int32, fp.String, state.String, token.String
		return r, err
	})
	if err != nil {
		fillErr(errs, items, err)
		return
	}
	var pending []int
	for _, r := range rows {
		i := items[r.n-1]
		req := reqs[i]
		switch {
		case r.inserted.Valid:
			results[i] = idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: r.inserted.Int64, Attempt: 1}
			continue
		case r.found:
			res, decided, err := claimResult(r.claimRow(req), req)
			if err != nil || decided {
				if err == nil && res.Outcome == idempotency.OutcomeReplay && r.expiresAt.InfinityModifier == pgtype.Finite {
					res.ExpiresIn = max(r.expiresAt.Time.Sub(r.now.Time), 0)
				}
				results[i], errs[i] = res, err
				continue
			}
		}
		pending = append(pending, i)
	}
	for range claimRetries {
		if len(pending) == 0 {
			return
		}
		pending = s.claimLocked(ctx, reqs, pending, results, errs)
	}
	for _, i := range pending {
		errs[i] = fmt.Errorf("postgres: claim: the row of key %q kept changing under the statement %d times; try again", reqs[i].Key, claimRetries)
	}
}

// claimLocked runs batchClaimSQL for items and returns those it must run
// again for.
func (s *Store) claimLocked(ctx context.Context, reqs []idempotency.ClaimRequest, items []int, results []idempotency.ClaimResult, errs []error) (again []int) {
	type row struct {
		n int64
		claimRow
	}
	rows, err := batchQuery(ctx, s, "claim", s.sql.batchClaim, len(items), claimArgs(reqs, items), func(rs pgx.CollectableRow) (row, error) {
		var r row
		c := &r.claimRow
		err := rs.Scan(&r.n, &c.acquired, &c.fence, &c.attempt, &c.checkpoints, &c.fingerprint, &c.state, &c.retryAfterMicros, &c.result, &c.stale)
		return r, err
	})
	if err != nil {
		fillErr(errs, items, err)
		return nil
	}
	answered := make([]bool, len(items))
	for _, r := range rows {
		i := items[r.n-1]
		res, ok, err := claimResult(r.claimRow, reqs[i])
		if err != nil || ok {
			results[i], errs[i], answered[r.n-1] = res, err, true
		}
	}
	for j, i := range items {
		if !answered[j] {
			again = append(again, i)
		}
	}
	return again
}

// FinishBatch implements [idempotency.Batcher]: it completes and releases
// every item in one statement over arrays (batchFinishSQL), with the SET
// lists of [Store.Complete] and [Store.Release] and their conditions on
// each item's token, and reads the items it changed nothing for in one
// more (batchFinishCheckSQL): a repeat of a completion already applied
// succeeds, a release of a record already gone succeeds, the others get
// [idempotency.ErrLeaseLost]. A result above MaxValueSize gets
// [idempotency.ErrTooLarge] and is sent to nobody. With [Options.Notify]
// each record changed notifies its waiters. Statements carry at most 1000
// items and 16 MiB of results, in the order of their keys; a statement
// that fails fails its own items.
//
// A batch of one valid item is a single Complete or Release. In a
// transaction bound to ctx, each item is a Complete or a Release in that
// transaction.
func (s *Store) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	if s.txOf(ctx) != nil {
		return idempotency.FinishEach(ctx, s, items)
	}
	errs := make([]error, len(items))
	todo := make([]int, 0, len(items))
	for i, f := range items {
		switch {
		case f.Release:
		case len(f.Result) > s.opts.MaxValueSize:
			errs[i] = s.tooLarge("complete", len(f.Result))
		case f.Retention <= 0:
			errs[i] = fmt.Errorf("%w: postgres: retention must be positive, got %v", idempotency.ErrInvalidArgument, f.Retention)
		}
		if errs[i] == nil {
			todo = append(todo, i)
		}
	}
	if len(todo) == 1 {
		errs[todo[0]] = idempotency.FinishEach(ctx, s, items[todo[0]:todo[0]+1])[0]
		return errs
	}
	key := func(i int) string { return items[i].Key }
	room := func(chunk []int) bool {
		size := 0
		for _, i := range chunk {
			size += len(items[i].Result)
		}
		return len(chunk) < batchItems && size < batchBytes
	}
	eachRound(todo, key, room, func(chunk []int) { s.finishChunk(ctx, items, chunk, errs) })
	return errs
}

// finishChunk finishes items, whose keys are distinct, into errs.
func (s *Store) finishChunk(ctx context.Context, items []idempotency.Finish, chunk []int, errs []error) {
	var keys, toks, res, rets, rels, hashes arrayText
	kn, rn := 0, 0
	for _, i := range chunk {
		kn, rn = kn+len(items[i].Key), rn+len(items[i].Result)
	}
	keys.grow(kn + 3*len(chunk))
	toks.grow(len(chunk) * (len(items[chunk[0]].Token) + 3))
	res.grow(2*rn + 6*len(chunk))
	rets.grow(len(chunk) * 12)
	rels.grow(len(chunk) * 2)
	if s.notify {
		hashes.grow(len(chunk) * 19)
	}
	for _, i := range chunk {
		f := items[i]
		keys.text(f.Key)
		toks.text(string(f.Token))
		rels.bool(f.Release)
		res.bytea(f.Result)
		rets.int(micros(f.Retention))
		if s.notify {
			hashes.text(keyHash(f.Key))
		}
	}
	scanN := func(rs pgx.CollectableRow) (int64, error) {
		var n int64
		return n, rs.Scan(&n)
	}
	changed, err := batchQuery(ctx, s, "finish", s.sql.batchFinish, len(chunk), []any{keys.String(), toks.String(), res.String(), rets.String(), rels.String(), hashes.String()}, scanN)
	if err != nil {
		fillErr(errs, chunk, err)
		return
	}
	done := make([]bool, len(chunk))
	for _, n := range changed {
		done[n-1] = true
	}
	var left []int // positions in chunk
	var lk, lt arrayText
	for j, i := range chunk {
		if !done[j] {
			left = append(left, j)
			lk.text(items[i].Key)
			lt.text(string(items[i].Token))
		}
	}
	if len(left) == 0 {
		return
	}
	type check struct {
		n         int64
		completed bool
	}
	live, err := batchQuery(ctx, s, "finish", s.sql.batchFinishCheck, len(left), []any{lk.String(), lt.String()}, func(rs pgx.CollectableRow) (check, error) {
		var c check
		return c, rs.Scan(&c.n, &c.completed)
	})
	if err != nil {
		for _, j := range left {
			errs[chunk[j]] = err
		}
		return
	}
	found := make(map[int64]bool, len(live)) // position in left -> completed under the token
	for _, c := range live {
		found[c.n-1] = c.completed
	}
	for x, j := range left {
		completed, isLive := found[int64(x)]
		if rel := items[chunk[j]].Release; rel && !isLive || !rel && completed {
			continue // released already, completed already by this token
		}
		errs[chunk[j]] = idempotency.ErrLeaseLost
	}
}

// batchQuery runs one statement of a batch and scans all its rows (about
// size), or
// returns the error that failed it (wrapped for op), after running it
// again if PostgreSQL broke a deadlock by aborting it, unless the store's
// DB is a transaction (which the abort lost).
func batchQuery[R any](ctx context.Context, s *Store, op, sql string, size int, args []any, scan func(pgx.CollectableRow) (R, error)) ([]R, error) {
	_, inTx := s.db.(pgx.Tx)
	for attempt := 0; ; attempt++ {
		out := make([]R, 0, size)
		rows, err := s.db.Query(ctx, sql, args...)
		if err == nil {
			out, err = pgx.AppendRows(out, rows, scan)
		}
		if err == nil {
			return out, nil
		}
		if inTx || attempt >= batchDeadlockRetries || !isRetryableCode(err) || ctx.Err() != nil {
			return nil, wrapErr(ctx, op, err)
		}
	}
}

// fillErr sets err for each of items.
func fillErr(errs []error, items []int, err error) {
	for _, i := range items {
		errs[i] = err
	}
}
