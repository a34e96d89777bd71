package redis

import goredis "github.com/redis/go-redis/v9"

// The record of a storage key is one hash. Field names are persisted: never
// change them.
//
//	f    fingerprint, in the form of encodeFingerprint
//	s    state: "started" or "completed" (idempotency.State values)
//	t    token of the current holder
//	n    fence, a decimal integer
//	a    attempt: 1 for a fresh claim, one more for every takeover
//	l    lease deadline, Unix milliseconds by the server's clock (started only)
//	g    grace in milliseconds, so that Renew can recompute retention (started only)
//	r    result (completed only)
//	c:*  checkpoints, "c:" followed by the checkpoint's name (started only)
//
// Every script touches KEYS[1] only, so Redis Cluster runs it on the node
// that owns the key's slot. Numbers are written with string.format('%.0f'),
// so that their text never depends on how a Redis version renders a Lua
// number (a double); every number stored stays below 2^53, where a double
// is exact (a fence is a count of microseconds since 1970: 2^53 µs
// is the year 2255).

// claimScript decides a claim: see Store.Claim for the table.
//
// KEYS[1] record. ARGV: fingerprint, token, lease ms, grace ms.
// Reply: {outcome, fence, attempt, extra, name1, value1, ...} where extra is
// the time left on the lease in ms for in-progress, the result for replay,
// and "" otherwise; checkpoint pairs follow for an acquisition of an
// existing record.
var claimScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 'f', 's', 't', 'n', 'a', 'l', 'r')
local t, sec, usec, now
if not h[1] then
  -- Absent (or expired: Redis never shows an expired key). The fence is the
  -- server's clock in microseconds, so it exceeds every fence handed out
  -- for this key before the record was deleted or expired.
  t = redis.call('TIME')
  sec, usec = tonumber(t[1]), tonumber(t[2])
  now = sec * 1000 + math.floor(usec / 1000)
  local fence = sec * 1000000 + usec
  redis.call('HSET', k, 'f', ARGV[1], 's', 'started', 't', ARGV[2],
    'n', string.format('%.0f', fence), 'a', '1',
    'l', string.format('%.0f', now + tonumber(ARGV[3])), 'g', ARGV[4])
  redis.call('PEXPIRE', k, tonumber(ARGV[3]) + tonumber(ARGV[4]))
  return {1, fence, 1, ''}
end
local fence, attempt = tonumber(h[4]), tonumber(h[5])
if h[1] ~= ARGV[1] then
  return {4, fence, attempt, ''}
end
if h[2] == 'completed' then
  return {2, fence, attempt, h[7] or ''}
end
t = redis.call('TIME')
sec, usec = tonumber(t[1]), tonumber(t[2])
now = sec * 1000 + math.floor(usec / 1000)
local reply = {1, fence, attempt, ''}
if h[3] ~= ARGV[2] then
  local deadline = tonumber(h[6])
  if deadline > now then
    return {3, fence, attempt, deadline - now}
  end
  -- Takeover of an expired lease: a greater fence, one more attempt.
  local nf = sec * 1000000 + usec
  if nf <= fence then nf = fence + 1 end
  attempt = attempt + 1
  redis.call('HSET', k, 't', ARGV[2], 'n', string.format('%.0f', nf),
    'a', string.format('%.0f', attempt))
  reply = {1, nf, attempt, ''}
end
-- A takeover, or a repeated claim by the same holder whose reply was lost:
-- the lease restarts from now and the checkpoints are handed over.
redis.call('HSET', k, 'l', string.format('%.0f', now + tonumber(ARGV[3])), 'g', ARGV[4])
redis.call('PEXPIRE', k, tonumber(ARGV[3]) + tonumber(ARGV[4]))
local all = redis.call('HGETALL', k)
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'c:' then
    reply[#reply + 1] = string.sub(all[i], 3)
    reply[#reply + 1] = all[i + 1]
  end
end
return reply
`)

// renewScript extends a lease held under a token.
//
// KEYS[1] record. ARGV: token, lease ms. Reply: 1, or 0 for a lost lease.
var renewScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 's', 't', 'g')
if h[1] ~= 'started' or h[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('HSET', k, 'l', string.format('%.0f', now + lease))
redis.call('PEXPIRE', k, lease + tonumber(h[3]))
return 1
`)

// checkpointScript stores a recovery point under a token. The record's
// expiry (lease deadline plus grace, both absolute) is set again, unchanged.
//
// KEYS[1] record. ARGV: token, name, value. Reply: 1, or 0 for a lost lease.
var checkpointScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 's', 't', 'l', 'g')
if h[1] ~= 'started' or h[2] ~= ARGV[1] then return 0 end
redis.call('HSET', k, 'c:' .. ARGV[2], ARGV[3])
redis.call('PEXPIREAT', k, tonumber(h[3]) + tonumber(h[4]))
return 1
`)

// completeScript records the result under a token, rewriting the record
// without its checkpoints and lease fields. A record already completed under the token is left as it is;
// when ARGV[4] is "1" (the caller will WAIT for replicas) a write that
// changes nothing is made, so that WAIT on this connection also covers the
// earlier completion. When ARGV[5] is "1" a message is published on the
// record's shard channel for Watch.
//
// KEYS[1] record. ARGV: token, result, retention ms, touch, notify.
// Reply: 1, or 0 for a lost lease.
var completeScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 's', 't', 'f', 'n', 'a')
if h[2] ~= ARGV[1] then return 0 end
if h[1] == 'completed' then
  if ARGV[4] == '1' then redis.call('HSET', k, 's', 'completed') end
  return 1
end
if h[1] ~= 'started' then return 0 end
if ARGV[5] == '1' then redis.call('SPUBLISH', k, 'completed') end
-- Rewriting the record drops the checkpoints and the lease fields.
redis.call('DEL', k)
redis.call('HSET', k, 'f', h[3], 's', 'completed', 't', h[2], 'n', h[4], 'a', h[5], 'r', ARGV[2])
redis.call('PEXPIRE', k, ARGV[3])
return 1
`)

// releaseScript deletes a started record held under a token.
//
// KEYS[1] record. ARGV: token, notify. Reply: 1, or 0 for a lost lease.
var releaseScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 's', 't')
if not h[1] then return 1 end
if h[1] ~= 'started' or h[2] ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('SPUBLISH', k, 'released') end
redis.call('DEL', k)
return 1
`)

// stateScript reads a record's state for Watch: "started", "completed",
// or "" for no record.
//
// KEYS[1] record.
var stateScript = goredis.NewScript(`
return redis.call('HGET', KEYS[1], 's') or ''
`)
