-- A replay on the store's table: store/postgres/sql.go's claimReadSQL.
\set k random(1, 1000)
SELECT r.fence, r.attempt, r.fingerprint, r.state, r.token, r.lease_until, r.expires_at, r.result,
	clock_timestamp()
FROM pgb.store AS r
WHERE r.key = 'hot/' || :k;
