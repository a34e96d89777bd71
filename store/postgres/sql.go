package postgres

import "strings"

// statements are the store's SQL, rendered once for its table.
//
// Conventions: statements read the server's clock with clock_timestamp()
// (not now(), which inside a long transaction would be the transaction's
// start), most of them once, in a CTE or subquery "c" (completeSQL, on the
// hot path, reads it inline); durations arrive as bigint microseconds;
// every parameter carries a cast, so the statements also work with pgx's
// exec and simple-protocol modes (PgBouncer transaction pooling).
type statements struct {
	claimInsert, claimRead, completeFallback                                  string
	claim, renew, checkpoint, complete, completeTx, release, sweep, leaseLeft string
	inspect, purge, stuck                                                     string
	batchInsert, batchClaim, batchFinish, batchFinishCheck                    string
}

// The claim. One INSERT ... ON CONFLICT DO UPDATE decides, atomically:
//   - no row, or an expired one (a released row is an expired tombstone):
//     a fresh record (a fence greater than the old row's, attempt 1);
//   - STARTED, same fingerprint, lease ended: takeover (new token and
//     fence, attempt+1, checkpoints kept);
//   - STARTED under the same token: a repeated claim (same fence, lease
//     set again, checkpoints returned).
//
// Otherwise ON CONFLICT leaves the row unchanged (but locked), and the
// "cur" CTE reads it FOR SHARE: in READ COMMITTED a locking read returns
// the latest committed version even when it was written after the
// statement's snapshot, so the outcome (replay, in progress, mismatch) is
// computed from the very row ON CONFLICT judged. When that row was
// inserted after the snapshot it is not visible at all and the statement
// returns no row; the caller runs it again (see claimRetries). The row
// read is judged by the clock after its lock was granted ("t"), not the
// statement's start: the row may have been written by a claim that began
// after this statement did, and its time left must not exceed a lease.
//
// $1 key, $2 fingerprint, $3 token, $4 lease µs, $5 grace µs.
const claimSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
ins AS (
` + freshRowSQL + `	FROM c
` + takeoverSQL + `	RETURNING r.fence, r.attempt, r.checkpoints
),
cur AS (
	SELECT r.fingerprint, r.state, r.token, r.fence, r.attempt, r.lease_until, r.expires_at, r.result
	FROM {T} AS r
	WHERE r.key = $1::text AND NOT EXISTS (SELECT FROM ins)
	FOR SHARE
)
SELECT true, ins.fence, ins.attempt, ins.checkpoints::text,
	NULL::text, NULL::text, 0::bigint, NULL::bytea, false
FROM ins
UNION ALL
SELECT false, cur.fence, cur.attempt, NULL::text,
	cur.fingerprint, cur.state,
	GREATEST(0, ceil(extract(epoch FROM cur.lease_until - t.now) * 1000000))::bigint,
	cur.result,
	cur.expires_at <= t.now OR (cur.state = 'started' AND cur.fingerprint = $2::text
		AND (cur.lease_until <= t.now OR cur.token = $3::text))
FROM cur, LATERAL (SELECT clock_timestamp() AS now) AS t`

// Claim first runs one or both of two plain statements, neither of
// which takes a lock or writes anything when the key has a row (see
// Store.claim for their order): claimInsertSQL, an INSERT ... ON CONFLICT
// DO NOTHING of a fresh record, and claimReadSQL, a plain read of the row.
// Together they decide every claim of a key that has no row (one
// insertion), and every claim that finds a live row it may not take: a
// replay, a mismatch, a claim in progress under another token. Only
// takeovers, expired rows and races go on to claimSQL, which decides under
// the row's lock.
//
// claimInsertSQL returns the fence when it inserted the row (a fresh
// record: attempt 1, no checkpoints), and no row when the key had one (or
// had one committed while the statement waited). Its clock is read once,
// in the subquery "c", which the planner keeps as one evaluation because
// the function is volatile.
//
// $1 key, $2 fingerprint, $3 token, $4 lease µs, $5 grace µs.
const claimInsertSQL = freshRowSQL + `	FROM (SELECT clock_timestamp() AS now) AS c
	ON CONFLICT (key) DO NOTHING
	RETURNING r.fence`

// claimReadSQL reads the row and the server's clock, read after the
// statement's snapshot; no row when the key has none. Store.claimRead
// decides from them whether the row answers the claim: when it is live and
// not the caller's to take. A COMPLETED record is immutable until it
// expires, and a STARTED one under another token whose lease has not ended
// (or with another fingerprint) changes only by its holder, so the
// snapshot answers as well as a lock would, at the moment it was taken,
// and the clock judges expiry and lease (a row live then was live at the
// snapshot). A row that is expired, or that the caller may take over, is
// stale: claimSQL decides it under the row's lock. The comparisons are
// made by the caller on the server's values, rather than in the
// statement, which then costs PostgreSQL no more than a plain read.
//
// $1 key.
const claimReadSQL = `
SELECT r.fence, r.attempt, r.fingerprint, r.state, r.token, r.lease_until, r.expires_at, r.result,
	clock_timestamp()
FROM {T} AS r
WHERE r.key = $1::text`

// Renew keeps sweep_at at most the new expiry (see schema.sql), which
// moves it only after a sweep moved it to the expiry of a longer lease:
// otherwise it changes no indexed column, and is a HOT update.
// $1 key, $2 token, $3 lease µs.
const renewSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE {T} AS r SET
	lease_until = c.now + $3::bigint * interval '1 microsecond',
	expires_at = c.now + $3::bigint * interval '1 microsecond' + r.grace,
	sweep_at = LEAST(r.sweep_at, c.now + $3::bigint * interval '1 microsecond' + r.grace)
FROM c
WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'started' AND r.expires_at > c.now`

// $1 key, $2 token, $3 name, $4 value. Values are kept base64 in a jsonb
// object, which encoding/json decodes straight into map[string][]byte.
const checkpointSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE {T} AS r SET
	checkpoints = coalesce(r.checkpoints, '{}'::jsonb) ||
		jsonb_build_object($3::text, translate(encode(coalesce($4::bytea, ''::bytea), 'base64'), E'\n', ''))
FROM c
WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'started' AND r.expires_at > c.now`

// $1 key, $2 token, $3 result, $4 retention µs, and with Options.Notify
// $5 the key's hash, the payload of the notification sent (at commit) when
// the row changes: {RETURNING5} is then RETURNING pg_notify(...), which
// the statement (run to completion) evaluates for every changed row, so
// the payload goes out exactly when the record completes; without Notify
// it is empty. One row changed: the record is now COMPLETED under the
// token.
//
// This statement runs once per fresh Do, so it reads the clock inline
// rather than in a CTE: the join with a materialized CTE cost PostgreSQL
// more than the three reads, which happen within microseconds of each
// other in one execution. The WHERE reads it when it judges the row (again
// when it re-checks a row that changed while it waited for its lock), and
// the new lease end and expiry are counted from the time of the write.
//
// It keeps sweep_at at most the new expiry (see schema.sql), and leaves it
// as it is when the retention is at least the claim's grace (the default:
// the grace is the retention), and so changes no indexed column: PostgreSQL
// then makes it a HOT update when the row's page has room, which the
// table's fillfactor keeps, a new version of the row on the same page and
// no index entry.
const completeSQL = `
UPDATE {T} AS r SET` + completeSetSQL + `
WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'started' AND r.expires_at > clock_timestamp()
{RETURNING5}`

// completeSetSQL is the SET list of a completion, shared by completeSQL
// and batchFinishSQL: {RES} is the result, {RET} the retention in µs,
// {NOW} the server's clock (clock_timestamp(), read inline: see
// completeSQL; completeTxSQL's c.now).
const completeSetSQL = `
	state = 'completed',
	result = coalesce({RES}, ''::bytea),
	checkpoints = NULL,
	lease_until = {NOW},
	expires_at = {NOW} + {RET} * interval '1 microsecond',
	sweep_at = LEAST(r.sweep_at, r.created_at + {RET} * interval '1 microsecond')`

// completeFallbackSQL runs when completeSQL changed nothing, and returns
// whether the record already is COMPLETED under the token (a repeat of
// this Complete, rule 4) rather than lost. The read is a locking one, and
// tests state and token in its select list rather than its WHERE: when a
// repeat of this Complete runs at the same time, completeSQL waited for
// it, then found the row no longer STARTED and changed nothing; a locking
// read returns the row as the other call committed it (a read in the same
// statement would have seen the statement's snapshot, still STARTED).
// $1 key, $2 token.
const completeFallbackSQL = `
SELECT coalesce((
	SELECT r.state = 'completed' AND r.token = $2::text
	FROM {T} AS r, (SELECT clock_timestamp() AS now) AS c
	WHERE r.key = $1::text AND r.expires_at > c.now
	FOR SHARE OF r), false)`

// completeTxSQL completes a record claimed earlier in the same
// transaction. The transaction holds the row's lock since the claim, so no
// one can have taken it over, and its lease (which nobody else could see)
// does not matter: fn may have run for longer than it. Like completeSQL,
// it moves no indexed column when the retention is at least the grace, and
// is then a HOT update.
// $1 key, $2 token, $3 result, $4 retention µs.
var completeTxSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE {T} AS r SET` + strings.ReplaceAll(completeSetSQL, "{NOW}", "c.now") + `
FROM c
WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'started'`

// $1 key, $2 token, and with Options.Notify $3 the key's hash, notified
// when the row is deleted (see completeSQL). Returns true when the record
// is gone: released now, or absent or expired already. The fallback read
// locks for the reason given at completeSQL: a concurrent repeat of this
// Release may have released the row after the statement's snapshot.
//
// A released row is not deleted but left as a tombstone, expired since
// forever, for the sweep to delete (its sweep_at too, so the next sweep
// does, as it would a row deleted at once): a claim that re-creates the record then
// goes through ON CONFLICT, which sees the old fence and hands out a
// greater one. Deleting the row would let the re-creating INSERT use the
// sequence value it drew when its statement began, which can be smaller
// than a fence handed out while it waited for the row's lock (the
// lincheck module found exactly that).
const releaseSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
del AS (
	UPDATE {T} AS r SET` + releaseSetSQL + `
	FROM c
	WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'started' AND r.expires_at > c.now
	RETURNING {NOTIFY3}
)
SELECT EXISTS (SELECT FROM del) OR NOT EXISTS (
	SELECT FROM {T} AS r, c WHERE r.key = $1::text AND r.expires_at > c.now
	FOR SHARE OF r)`

// releaseSetSQL is the SET list of a release, shared by releaseSQL and
// batchFinishSQL: the row becomes a tombstone (see releaseSQL).
const releaseSetSQL = `
		expires_at = '-infinity',
		lease_until = '-infinity',
		sweep_at = '-infinity',
		checkpoints = NULL`

// One batch of the sweep: the rows whose sweep_at has come, first come
// first, that no one holds locked. Rows locked by a concurrent sweeper (or
// claim) are skipped, so several sweepers divide the work instead of
// queueing. Of the rows it locked, the batch deletes those that have
// expired, and moves the sweep_at of the others (live rows, see
// schema.sql) to their expiry, when the sweep looks at them again. It returns
// how many rows it locked and how many it deleted. The subquery makes the
// clock a constant, so the index on sweep_at is used; expiry is judged by
// the clock when a row is locked, on the row as locked.
// $1 batch size.
const sweepSQL = `
WITH due AS (
	SELECT r.key, r.expires_at, r.expires_at <= clock_timestamp() AS expired
	FROM {T} AS r
	WHERE r.sweep_at <= (SELECT clock_timestamp())
	ORDER BY r.sweep_at
	LIMIT $1::bigint
	FOR UPDATE SKIP LOCKED
),
del AS (
	DELETE FROM {T} AS r USING due
	WHERE r.key = due.key AND due.expired
	RETURNING 1
),
later AS (
	UPDATE {T} AS r SET sweep_at = due.expires_at
	FROM due
	WHERE r.key = due.key AND NOT due.expired
)
SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM del)`

// leaseLeftSQL reads, for Watch, the time left on the lease of a live
// STARTED record, in µs (0 when it has ended); no row when the record is
// absent, expired or COMPLETED. $1 key.
const leaseLeftSQL = `
SELECT GREATEST(0, ceil(extract(epoch FROM r.lease_until - c.now) * 1000000))::bigint
FROM {T} AS r, (SELECT clock_timestamp() AS now) AS c
WHERE r.key = $1::text AND r.state = 'started' AND r.expires_at > c.now`

// The columns Inspect and Stuck read, in the order scanInfo scans them:
// times left as µs by the server's clock c.now.
const infoColumns = `r.key, r.fingerprint, r.state, r.fence, r.attempt,
	GREATEST(0, ceil(extract(epoch FROM r.lease_until - c.now) * 1000000))::bigint,
	GREATEST(0, ceil(extract(epoch FROM r.expires_at - c.now) * 1000000))::bigint,
	r.checkpoints::text`

// $1 key. The result comes last: Stuck does not read it.
const inspectSQL = `
SELECT ` + infoColumns + `, r.result
FROM {T} AS r, (SELECT clock_timestamp() AS now) AS c
WHERE r.key = $1::text AND r.expires_at > c.now`

// Purge leaves a tombstone, as Release does and for the same reason (the
// re-creating claim must see the old fence), for the next sweep; with Options.Notify, $2 the
// key's hash is notified when a live row is purged.
// $1 key.
const purgeSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE {T} AS r SET
	expires_at = '-infinity',
	lease_until = '-infinity',
	sweep_at = '-infinity',
	checkpoints = NULL,
	result = NULL
FROM c
WHERE r.key = $1::text AND r.expires_at > c.now
RETURNING {NOTIFY2}`

// One page of Stuck: the stuck rows among those stored in the table's
// blocks from the tuple after $1 up to the block of $3 (tuple IDs, read
// with a TID range scan, in the table's physical order), at most $2, each
// with false and its tuple ID in the first two columns. A last row, with
// true first, gives in place of the tuple ID the table's size in blocks.
// No index lists STARTED rows (it would cost every claim and completion):
// a page reads a bounded range of the table, and a pass over the table
// reads all of it, paid by the operator's or the reconciler's call. A
// stuck row is never updated, so its tuple ID stays the same during a
// listing (but for VACUUM FULL, CLUSTER or another rewrite of the table).
const stuckSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
(SELECT false, r.ctid::text, ` + infoColumns + `
FROM {T} AS r, c
WHERE r.ctid > $1::tid AND r.ctid < $3::tid
	AND r.state = 'started' AND r.lease_until <= c.now AND r.expires_at > c.now
ORDER BY r.ctid
LIMIT $2::bigint)
UNION ALL
SELECT true, (pg_relation_size('{T}'::regclass) / current_setting('block_size')::bigint)::text,
	'', '', '', 0, 0, 0, 0, NULL`

// buildStatements renders the statements for the names n. With notify,
// Complete and Release notify channel (a validated identifier, safe in a
// literal) with the key's hash.
func buildStatements(n objectNames, channel string, notify bool) statements {
	n5, n3, n2 := "", "1", "1"
	if notify {
		n5 = "RETURNING pg_notify('" + channel + "', $5::text)"
		n3 = "pg_notify('" + channel + "', $3::text)"
		n2 = "pg_notify('" + channel + "', $2::text)"
	}
	names := []string{"{T}", n.Table, "{S}", n.Seq, "{RETURNING5}", n5, "{NOTIFY3}", n3, "{NOTIFY2}", n2,
		"{NOTIFYB}", batchNotify(channel, notify)}
	// A single call's statements take their values as parameters, a
	// batch's from its input rows "i" (see freshRowSQL, completeSetSQL).
	r := strings.NewReplacer(append(names, "{KEY}", "$1::text", "{FP}", "$2::text", "{TOK}", "$3::text",
		"{LEASE}", "$4::bigint", "{GRACE}", "$5::bigint", "{RES}", "$3::bytea", "{RET}", "$4::bigint",
		"{NOW}", "clock_timestamp()")...)
	rb := strings.NewReplacer(append(names, "{KEY}", "i.key", "{FP}", "i.fp", "{TOK}", "i.tok",
		"{LEASE}", "i.lease", "{GRACE}", "i.grace", "{RES}", "i.res", "{RET}", "i.ret",
		"{NOW}", "clock_timestamp()")...)
	return statements{
		batchInsert:      rb.Replace(batchInsertSQL),
		batchClaim:       rb.Replace(batchClaimSQL),
		batchFinish:      rb.Replace(batchFinishSQL),
		batchFinishCheck: rb.Replace(batchFinishCheckSQL),
		leaseLeft:        r.Replace(leaseLeftSQL),
		inspect:          r.Replace(inspectSQL),
		purge:            r.Replace(purgeSQL),
		stuck:            r.Replace(stuckSQL),
		claimInsert:      r.Replace(claimInsertSQL),
		claimRead:        r.Replace(claimReadSQL),
		claim:            r.Replace(claimSQL),
		completeFallback: r.Replace(completeFallbackSQL),
		renew:            r.Replace(renewSQL),
		checkpoint:       r.Replace(checkpointSQL),
		complete:         r.Replace(completeSQL),
		completeTx:       r.Replace(completeTxSQL),
		release:          r.Replace(releaseSQL),
		sweep:            r.Replace(sweepSQL),
	}
}

// takeoverSQL is the conflict clause of claimSQL and batchClaimSQL, which
// decides under the row's lock what to do with a row the fresh record
// conflicts with (see claimSQL): take it over, repeat the holder's claim,
// re-create an expired record, or leave it (locked) as it is.
const takeoverSQL = `	ON CONFLICT (key) DO UPDATE SET
		fingerprint = EXCLUDED.fingerprint,
		state = 'started',
		token = EXCLUDED.token,
		fence = CASE WHEN r.expires_at > EXCLUDED.created_at AND r.token = EXCLUDED.token
			THEN r.fence ELSE greatest(EXCLUDED.fence, r.fence + 1) END,
		attempt = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN 1
			WHEN r.token = EXCLUDED.token THEN r.attempt ELSE r.attempt + 1 END,
		lease_until = EXCLUDED.lease_until,
		grace = EXCLUDED.grace,
		expires_at = EXCLUDED.expires_at,
		checkpoints = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN NULL ELSE r.checkpoints END,
		result = NULL,
		created_at = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.created_at ELSE r.created_at END,
		sweep_at = EXCLUDED.sweep_at
	WHERE r.expires_at <= EXCLUDED.created_at
		OR (r.state = 'started' AND r.fingerprint = EXCLUDED.fingerprint
			AND (r.lease_until <= EXCLUDED.created_at OR r.token = EXCLUDED.token))
`

// freshRowSQL is the INSERT of a fresh claim that claimSQL and
// claimInsertSQL share: a STARTED row under a new fence, with its lease,
// grace and expiry counted from c.now, one read of the server's clock, and
// sweep_at the grace after c.now (see schema.sql). The
// statements add the FROM that reads it (claimSQL's first CTE, or
// claimInsertSQL's subquery) and their own conflict handling.
//
// Its values are placeholders, rendered by buildStatements: $1 key,
// $2 fingerprint, $3 token, $4 lease µs, $5 grace µs in a single claim's
// statements; the columns of the input rows "i" in a batch's (see
// batchInputSQL).
const freshRowSQL = `
	INSERT INTO {T} AS r (key, fingerprint, state, token, fence, attempt,
		lease_until, grace, expires_at, checkpoints, result, created_at, sweep_at)
	SELECT {KEY}, {FP}, 'started', {TOK}, nextval('{S}'), 1,
		c.now + {LEASE} * interval '1 microsecond',
		{GRACE} * interval '1 microsecond',
		c.now + ({LEASE} + {GRACE}) * interval '1 microsecond',
		NULL, NULL, c.now,
		c.now + {GRACE} * interval '1 microsecond'
`
