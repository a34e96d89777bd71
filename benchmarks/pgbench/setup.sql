-- Tables for run.sh, in a schema of their own (dropped by run.sh).
--   floor: the floor's table (benchmarks/postgres_floor_test.go).
--   store: the store's table as store/postgres/schema.sql creates it (a
--          primary key, the index on sweep_at, fillfactor 90; no CHECK).
--   store_pk: the same with the primary key only: what the index on
--          sweep_at costs the claim that writes it.
--   store_old: the table before issue 23: indexes on expires_at and on
--          the STARTED rows' keys (which made the completion move two
--          indexed columns, so it could not be a HOT update), fillfactor
--          100. Its script runs that version's completion.
--   store_noseq: the store's table, on which the script takes the fence
--          from a literal instead of the sequence: what nextval costs.
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
    created_at  timestamptz NOT NULL,
    sweep_at    timestamptz NOT NULL
) WITH (fillfactor = 90);
CREATE INDEX ON pgb.store (sweep_at);
CREATE TABLE pgb.store_pk (LIKE pgb.store INCLUDING DEFAULTS) WITH (fillfactor = 90);
ALTER TABLE pgb.store_pk ADD PRIMARY KEY (key);
CREATE TABLE pgb.store_noseq (LIKE pgb.store INCLUDING ALL) WITH (fillfactor = 90);
CREATE TABLE pgb.store_old (
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
CREATE INDEX ON pgb.store_old (expires_at);
CREATE INDEX ON pgb.store_old (key) WHERE state = 'started';
-- The replays read 1000 completed records of the floor and of the store.
INSERT INTO pgb.floor (key, st, resp, lease)
SELECT 'hot/' || i, 'completed', f.resp, clock_timestamp() FROM generate_series(1, 1000) AS i,
	(SELECT decode(repeat('7b226964223a2270695f3132333435363738227d', 10), 'hex') AS resp) AS f;
INSERT INTO pgb.store (key, fingerprint, state, token, fence, attempt, lease_until, grace, expires_at,
	checkpoints, result, created_at, sweep_at)
SELECT 'hot/' || i, 'c1f0e3d2b4a5968778695a4b3c2d1e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091', 'completed',
	'0123456789abcdef0123456789abcdef', nextval('pgb.seq'), 1, clock_timestamp(), interval '1 day',
	clock_timestamp() + interval '1 day', NULL, f.resp, clock_timestamp(), clock_timestamp() + interval '1 day'
FROM generate_series(1, 1000) AS i,
	(SELECT decode(repeat('7b226964223a2270695f3132333435363738227d', 10), 'hex') AS resp) AS f;
VACUUM ANALYZE pgb.floor;
VACUUM ANALYZE pgb.store;
