-- A fresh call of the store before issue 23 (on pgb.store_old): the same
-- claim without sweep_at, and the completion of that version.
\set k random(1, 2000000000)
INSERT INTO pgb.store_old AS r (key, fingerprint, state, token, fence, attempt,
	lease_until, grace, expires_at, checkpoints, result, created_at)
SELECT 'bench/' || :client_id || '/' || :k, 'c1f0e3d2b4a5968778695a4b3c2d1e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091', 'started', '0123456789abcdef0123456789abcdef', nextval('pgb.seq'), 1,
	c.now + 30000000::bigint * interval '1 microsecond',
	86400000000::bigint * interval '1 microsecond',
	c.now + (30000000::bigint + 86400000000::bigint) * interval '1 microsecond',
	NULL, NULL, c.now
FROM (SELECT clock_timestamp() AS now) AS c
ON CONFLICT (key) DO NOTHING
RETURNING r.fence;
UPDATE pgb.store_old AS r SET
	state = 'completed',
	result = coalesce('\x7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d7b226964223a2270695f3132333435363738227d'::bytea, ''::bytea),
	checkpoints = NULL,
	lease_until = clock_timestamp(),
	expires_at = clock_timestamp() + 86400000000::bigint * interval '1 microsecond'
WHERE r.key = 'bench/' || :client_id || '/' || :k AND r.token = '0123456789abcdef0123456789abcdef' AND r.state = 'started' AND r.expires_at > clock_timestamp();
