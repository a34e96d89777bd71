-- The floor of a replay: benchmarks/postgres_floor_test.go's read of a completed row.
\set k random(1, 1000)
SELECT st, resp FROM pgb.floor WHERE key = 'hot/' || :k;
