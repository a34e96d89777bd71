-- Schema of github.com/exactlyonce/idempotency/store/postgres.
--
-- One row per storage key. A row is live while expires_at is in the
-- future (judged by the server's clock_timestamp()); an expired row is
-- treated as absent by every operation and deleted by Store.Sweep.
-- Fences come from one sequence, so they strictly increase for a key across
-- takeovers and across deletion and re-creation of its row.
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
    created_at  timestamptz NOT NULL                     -- first claim of this record
);
ALTER SEQUENCE {{.Seq}} OWNED BY {{.Table}}.fence;
CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (expires_at);
-- Stuck (the operator's and the reconciler's listing) reads STARTED rows
-- in key order: usually a few among many completed ones.
CREATE INDEX IF NOT EXISTS {{.StuckIndex}} ON {{.Table}} (key) WHERE state = 'started';
