package outbox

import (
	"strconv"
	"strings"
)

// statements are the outbox's SQL, rendered once for its table.
//
// As in the store (store/postgres/sql.go): times come from the server's
// clock only, read once per statement (clock_timestamp() in a CTE, or
// statement_timestamp()), durations arrive as bigint microseconds, and
// every parameter carries a cast, so the statements also work in pgx's
// exec and simple-protocol modes (PgBouncer transaction pooling).
type statements struct {
	enqueue, enqueueNotify, enqueueKeyed, enqueueKeyedNotify string
	claim, delivered, record                                 string
	cleanup, deadLetters, redrive, redriveBatch, lastDead    string
	backlog                                                  string
}

// The insert of Enqueue. $1 event IDs, $2 topics, $3 ordering keys (empty for
// none), $4 payloads, $5 headers as JSON (empty for none): one array element
// per event. Rows are inserted in the order of the arrays, so ids (and
// delivery order) follow it. {FROM} is "l, " when the keys are locked
// first.
const insertSQL = `INSERT INTO {T} (event_id, topic, ordering_key, payload, headers, state, attempts, available_at, created_at)
	SELECT u.event_id, u.topic, NULLIF(u.k, ''), u.payload, NULLIF(u.headers, '')::jsonb, 'pending', 0, c.now, c.now
	FROM {FROM}(SELECT clock_timestamp() AS now) AS c,
		unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[])
			WITH ORDINALITY AS u(event_id, topic, k, payload, headers, ord)
	ORDER BY u.ord
`

// lockKeysSQL takes a transaction-scoped advisory lock per distinct
// ordering key of the events, in a fixed order (so that two enqueues of
// the same keys cannot deadlock on each other). A transaction enqueueing
// a key therefore waits for the one before it to end, and its rows get
// ids after that one's: per key, id order is commit order, which is what
// lets the relay deliver in id order without missing an event committed
// late. The insert reads from "l", so the locks are held before its ids
// are drawn.
const lockKeysSQL = `l AS MATERIALIZED (
	SELECT count(pg_advisory_xact_lock({CLASS}, s.h)) AS n
	FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($3::text[]) AS k WHERE k <> '' ORDER BY 1) AS s
)`

// The notification is one per statement (and PostgreSQL folds equal
// notifications of one transaction into one), sent when the caller's
// transaction commits. A data-modifying CTE always runs to completion,
// whether the main query reads it or not.
const notifySQL = `SELECT pg_notify('{CH}', '')`

// The claim: the oldest pending events whose time has come, and which
// are the head of their ordering key (no undelivered event of the same key
// before them, so an event in flight, backing off or dead holds back its
// key), locked with SKIP LOCKED so that concurrent claims take different
// events, then leased to this claim in the same statement: available_at
// moves to the end of the lease and claim_token names the claim. The
// statement commits at once; nothing stays locked while the relay sends.
// An event whose attempts are used up already (its last relay died
// mid-send and its lease ran out) is dead-lettered here instead.
//
// $1 batch size, $2 lease µs, $3 max attempts, $4 claim token.
const claimSQL = `
WITH picked AS (
	SELECT e.id FROM {T} AS e
	WHERE e.state = 'pending' AND e.available_at <= statement_timestamp()
		AND (e.ordering_key IS NULL OR NOT EXISTS (
			SELECT FROM {T} AS p
			WHERE p.ordering_key = e.ordering_key AND p.id < e.id AND p.state <> 'delivered'))
	ORDER BY e.id
	LIMIT $1::integer
	FOR NO KEY UPDATE OF e SKIP LOCKED
)
UPDATE {T} AS e SET
	state = CASE WHEN e.attempts >= $3::integer THEN 'dead' ELSE 'pending' END,
	attempts = CASE WHEN e.attempts >= $3::integer THEN e.attempts ELSE e.attempts + 1 END,
	last_error = CASE WHEN e.attempts >= $3::integer
		THEN format('attempt %s ended without an outcome: its relay stopped or lost its lease%s',
			e.attempts, '; the error before it: ' || e.last_error)
		ELSE e.last_error END,
	done_at = CASE WHEN e.attempts >= $3::integer THEN statement_timestamp() END,
	available_at = statement_timestamp() + $2::bigint * interval '1 microsecond',
	claim_token = $4::text
FROM picked
WHERE e.id = picked.id
RETURNING e.id, e.event_id, e.topic, coalesce(e.ordering_key, ''), e.payload, e.headers::text,
	e.attempts, e.created_at, e.state = 'dead', e.last_error`

// Every event of the batch delivered: the common case, one statement. A
// delivered event is marked so (or, with Options.DeleteDelivered,
// deleted) whoever holds it now (its lease may have ended and another
// relay claimed it): it was delivered. $1 ids.
const deliveredSQL = `{OK}`

// markDeliveredSQL and deleteDeliveredSQL are {OK}: the events with ids $1
// that were delivered, as e.
const (
	markDeliveredSQL = `
UPDATE {T} AS e SET state = 'delivered', done_at = (SELECT clock_timestamp())
WHERE e.id = ANY($1::bigint[]) AND e.state <> 'delivered'`
	deleteDeliveredSQL = `
DELETE FROM {T} AS e WHERE e.id = ANY($1::bigint[])`
)

// The outcome of a batch with failures or events left unsent, in one
// statement: delivered events as above (the CTE "ok"); failed ones go back to pending
// after their backoff (a negative delay: dead at once), or dead when
// their attempts are used up, keeping the error; unsent ones are released
// (available at once, their attempt not counted). Failures and releases
// only apply while the claim is still this batch's (the token): once its
// lease has ended another relay may hold the event. Both clear the token:
// the event is no longer in flight (see backlogSQL).
//
// $1 delivered ids; $2 failed ids, $3 their errors, $4 their delays µs;
// $5 claim token, $6 max attempts; $7 unsent ids. Returns the event IDs
// that became dead.
const recordSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
ok AS ({OK}),
unsent AS (
	UPDATE {T} AS e SET attempts = e.attempts - 1, available_at = c.now, claim_token = NULL
	FROM c
	WHERE e.id = ANY($7::bigint[]) AND e.claim_token = $5::text AND e.state = 'pending'
),
failed AS (
	UPDATE {T} AS e SET
		state = CASE WHEN u.delay_us < 0 OR e.attempts >= $6::integer THEN 'dead' ELSE 'pending' END,
		done_at = CASE WHEN u.delay_us < 0 OR e.attempts >= $6::integer THEN c.now END,
		available_at = c.now + greatest(u.delay_us, 0) * interval '1 microsecond',
		last_error = u.err,
		claim_token = NULL
	FROM c, unnest($2::bigint[], $3::text[], $4::bigint[]) AS u(id, err, delay_us)
	WHERE e.id = u.id AND e.claim_token = $5::text AND e.state = 'pending'
	RETURNING e.event_id, e.state
)
SELECT event_id FROM failed WHERE state = 'dead'`

// One statement of the cleanup: the oldest delivered events past the
// retention that no one holds locked, so that relays cleaning up at the
// same time divide the work. $1 retention µs, $2 batch size.
const cleanupSQL = `
DELETE FROM {T} WHERE id IN (
	SELECT id FROM {T}
	WHERE state = 'delivered'
		AND done_at <= (SELECT clock_timestamp()) - $1::bigint * interval '1 microsecond'
	ORDER BY done_at
	LIMIT $2::bigint
	FOR UPDATE SKIP LOCKED)`

// $1 limit.
const deadLettersSQL = `
SELECT event_id, topic, coalesce(ordering_key, ''), payload, headers::text, attempts, created_at,
	coalesce(last_error, ''), done_at
FROM {T} WHERE state = 'dead' ORDER BY id LIMIT $1::bigint`

// redriveSetSQL puts a dead event back to pending, its attempts reset.
const redriveSetSQL = `SET state = 'pending', attempts = 0, available_at = (SELECT clock_timestamp()), done_at = NULL, claim_token = NULL`

// $1 event IDs.
const redriveSQL = `
UPDATE {T} ` + redriveSetSQL + `
WHERE event_id = ANY($1::text[]) AND state = 'dead'`

// One statement of RedriveAll: the oldest dead events after id $1 and up
// to id $2 (the last dead one when the call began, so that events that die
// again meanwhile are not redriven twice), at most $3 of them, skipping
// rows locked by a concurrent redrive. Returns how many it redrove and
// the last id (0 for none), for the next statement.
const redriveBatchSQL = `
WITH b AS (
	SELECT id FROM {T}
	WHERE state = 'dead' AND id > $1::bigint AND id <= $2::bigint
	ORDER BY id
	LIMIT $3::bigint
	FOR UPDATE SKIP LOCKED
),
u AS (
	UPDATE {T} AS e ` + redriveSetSQL + `
	FROM b WHERE e.id = b.id
	RETURNING e.id
)
SELECT count(*), coalesce(max(id), 0) FROM u`

// The backlog, by the server's clock: the undelivered events that wait for
// a relay, of which those that failed (or lost) an attempt; those leased
// by a relay now (a claim's token, its lease not over: being sent); the
// dead ones; the age of the oldest undelivered one (microseconds, 0 if
// none). It reads the pending and dead rows through their partial
// indexes: the cost grows with the backlog, not with the delivered events
// kept.
const backlogSQL = `
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
p AS (
	SELECT count(*) FILTER (WHERE e.claim_token IS NOT NULL AND e.available_at > c.now) AS in_flight,
		count(*) FILTER (WHERE e.attempts > 0 AND NOT (e.claim_token IS NOT NULL AND e.available_at > c.now)) AS retrying,
		count(*) AS n
	FROM {T} AS e, c WHERE e.state = 'pending'
)
SELECT p.n - p.in_flight, p.retrying, p.in_flight, (SELECT count(*) FROM {T} WHERE state = 'dead'),
	coalesce((SELECT ceil(extract(epoch FROM c.now - e.created_at) * 1000000)::bigint
		FROM {T} AS e WHERE e.state = 'pending' ORDER BY e.id LIMIT 1), 0)
FROM p, c`

// The last dead event's id: where RedriveAll stops.
const lastDeadSQL = `SELECT coalesce(max(id), 0) FROM {T} WHERE state = 'dead'`

// buildStatements renders the statements for the names n, the
// notification channel (a validated identifier plus hex digits, safe in a
// literal) and the class of the ordering keys' advisory locks.
func buildStatements(n objectNames, channel string, class int32, deleteDelivered bool) statements {
	ok := markDeliveredSQL
	if deleteDelivered {
		ok = deleteDeliveredSQL
	}
	r := strings.NewReplacer("{T}", n.Table, "{CH}", channel, "{CLASS}", strconv.Itoa(int(class)))
	deliveredSQL, recordSQL := strings.ReplaceAll(deliveredSQL, "{OK}", ok), strings.ReplaceAll(recordSQL, "{OK}", ok)
	plain := strings.ReplaceAll(insertSQL, "{FROM}", "")
	keyed := strings.ReplaceAll(insertSQL, "{FROM}", "l, ")
	return statements{
		enqueue:            r.Replace(plain),
		enqueueNotify:      r.Replace("WITH ins AS (" + plain + ")\n" + notifySQL),
		enqueueKeyed:       r.Replace("WITH " + lockKeysSQL + "\n" + keyed),
		enqueueKeyedNotify: r.Replace("WITH " + lockKeysSQL + ",\nins AS (" + keyed + ")\n" + notifySQL),
		claim:              r.Replace(claimSQL),
		delivered:          r.Replace(deliveredSQL),
		record:             r.Replace(recordSQL),
		cleanup:            r.Replace(cleanupSQL),
		deadLetters:        r.Replace(deadLettersSQL),
		redrive:            r.Replace(redriveSQL),
		redriveBatch:       r.Replace(redriveBatchSQL),
		lastDead:           r.Replace(lastDeadSQL),
		backlog:            r.Replace(backlogSQL),
	}
}
