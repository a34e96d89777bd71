-- The floor of a fresh call: benchmarks/postgres_floor_test.go's two statements.
\set k random(1, 2000000000)
INSERT INTO pgb.floor (key, st, lease) VALUES ('bench/' || :client_id || '/' || :k, 'started', clock_timestamp() + interval '30s') ON CONFLICT DO NOTHING RETURNING key;
UPDATE pgb.floor SET st = 'completed', resp = '\x7b226964223a2270695f3132333435363738227d' WHERE key = 'bench/' || :client_id || '/' || :k;
