-- Tables for run.sh, in a schema of their own (dropped by run.sh).
--   floor: the issue-15 floor table.
--   store: the store's table as schema.sql creates it (no CHECK, a primary
--          key, the expires_at index for Sweep, the partial index of
--          STARTED rows for Stuck).
--   store_pk: the same columns with the primary key only: what the two
--          secondary indexes cost.
--   store_check: the store's table with the CHECK on state it had before:
--          what the constraint cost.
CREATE SCHEMA pgb;
CREATE SEQUENCE pgb.seq AS bigint;
CREATE TABLE pgb.floor (key text PRIMARY KEY, st text, resp bytea, lease timestamptz);
CREATE TABLE pgb.store (
    key         text COLLATE "C" NOT NULL PRIMARY KEY,
    fingerprint text NOT NULL,
    state       text NOT NULL,
    token       text NOT NULL,
    fence       bigint NOT NULL,
    attempt     integer NOT NULL,
    lease_until timestamptz NOT NULL,
    grace       interval NOT NULL,
    expires_at  timestamptz NOT NULL,
    checkpoints jsonb,
    result      bytea,
    created_at  timestamptz NOT NULL);
CREATE INDEX ON pgb.store (expires_at);
CREATE INDEX ON pgb.store (key) WHERE state = 'started';
CREATE TABLE pgb.store_pk (LIKE pgb.store INCLUDING DEFAULTS);
ALTER TABLE pgb.store_pk ADD PRIMARY KEY (key);
CREATE TABLE pgb.store_check (LIKE pgb.store INCLUDING DEFAULTS);
ALTER TABLE pgb.store_check ADD PRIMARY KEY (key);
ALTER TABLE pgb.store_check ADD CHECK (state IN ('started', 'completed'));
CREATE INDEX ON pgb.store_check (expires_at);
CREATE INDEX ON pgb.store_check (key) WHERE state = 'started';
