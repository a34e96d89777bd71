-- Schema of github.com/exactlyonce/idempotency/store/postgres.
--
-- One row per storage key. A row is live while expires_at is in the
-- future (judged by the server's clock_timestamp()); an expired row is
-- treated as absent by every operation and deleted by Store.Sweep.
-- Fences come from one sequence, so they strictly increase for a key across
-- takeovers and across deletion and re-creation of its row.
--
-- One index besides the primary key, on sweep_at, and the hot path writes
-- it only when it creates a row: the completion (with the default grace,
-- which is the retention), a renewal and a checkpoint change no indexed
-- column, so with the room fillfactor leaves on each page they are HOT
-- updates, a new version of the row on the same page and no index entry.
--
-- sweep_at is when Store.Sweep looks at a row, and never later than the
-- row's expiry, so that calling Sweep until it returns 0 deletes every row
-- that had expired before the first call:
--   - a claim sets it to its time plus the grace (a lease before the
--     STARTED row's expiry), and so does a takeover;
--   - a renewal lowers it to the new expiry when that is earlier, which
--     happens only after a sweep moved it (see below) to the expiry of a
--     longer lease: the expiry a renewal sets counts a positive lease, then
--     the same grace, from a later time than the claim's;
--   - a completion lowers it to the first claim's time (created_at) plus
--     the retention when that is earlier, which happens only when the
--     retention is shorter than the grace;
--   - Release and Purge set it to -infinity, as they do the expiry: the
--     next sweep deletes the tombstone.
-- A sweep that finds a row still live when its sweep_at has come moves
-- sweep_at to the row's expiry. With the default grace a completed row
-- expires fn's time after its sweep_at, so a sweep run every minute finds
-- nearly every row expired the first time it looks, and deletes it.
--
-- state has no CHECK constraint: PostgreSQL rebuilds a table's CHECK
-- expressions on every INSERT and UPDATE statement it executes, which cost
-- about a tenth of a fresh claim and its completion. The store's statements
-- write only 'started' and 'completed', and a row read with any other state
-- is reported as corrupt (idempotency.ErrCorrupt), never acted on.
{{- if .Schema}}
CREATE SCHEMA IF NOT EXISTS {{.Schema}};
{{- end}}
CREATE SEQUENCE IF NOT EXISTS {{.Seq}} AS bigint;
CREATE TABLE IF NOT EXISTS {{.Table}} (
    key         text COLLATE "C" NOT NULL PRIMARY KEY,   -- storage key (scope + client key)
    fingerprint text NOT NULL,                           -- request fingerprint; compared for equality
    state       text NOT NULL,                           -- 'started' or 'completed' (see above)
    token       text NOT NULL,                           -- current holder's token
    fence       bigint NOT NULL,                         -- from the sequence; grows on every takeover
    attempt     integer NOT NULL,                        -- 1, plus one per takeover
    lease_until timestamptz NOT NULL,                    -- end of the holder's lease
    grace       interval NOT NULL,                       -- kept after the lease ends, for a takeover
    expires_at  timestamptz NOT NULL,                    -- the row is absent from then on
    checkpoints jsonb,                                   -- recovery points: name -> base64 bytes
    result      bytea,                                   -- stored result, when completed
    created_at  timestamptz NOT NULL,                    -- first claim of this record
    sweep_at    timestamptz NOT NULL                     -- when Sweep looks at the row (see above)
) WITH (fillfactor = 90);
ALTER SEQUENCE {{.Seq}} OWNED BY {{.Table}}.fence;
-- A table made by a version before sweep_at (none was released) gets the
-- column, with a default so that such a version, which does not write it,
-- still can (the next sweep looks at those rows at once), and loses that
-- version's two indexes. A table that has the column is left alone, and
-- not locked.
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_attribute
		WHERE attrelid = '{{.Table}}'::regclass AND attname = 'sweep_at' AND NOT attisdropped) THEN
		ALTER TABLE {{.Table}} ADD COLUMN sweep_at timestamptz NOT NULL DEFAULT '-infinity', SET (fillfactor = 90);
		DROP INDEX IF EXISTS {{.OldIndexes}};
	END IF;
END $$;
CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (sweep_at);
