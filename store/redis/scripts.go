package redis

import goredis "github.com/redis/go-redis/v9"

// The record of a storage key is one hash:
//
//	f    fingerprint, in the form of encodeFingerprint
//	t    token of the current holder
//	n    fence, a decimal integer
//	a    attempt, one more for every takeover; absent for 1 (a fresh claim)
//	l    "<deadline>:<grace>:<m>" (STARTED only: a record with l is
//	     STARTED): the lease deadline, Unix ms by the server's clock; the
//	     grace in ms, so that Renew can recompute the expiry; m, the
//	     retention in ms the shard's fence mark already covers (see below).
//	     One field rather than three: a fresh claim writes four fields.
//	c    "1" when the record has checkpoints (STARTED only)
//	c:*  checkpoints, "c:" followed by the checkpoint's name (STARTED only)
//	r    result (COMPLETED only: a record with r is COMPLETED)
//
// Each of the 1024 shards (the hash tag of its keys, see Store.Key) has a
// fence mark, a string key <prefix>{<shard>}\x00fence holding
// "<fence>:<expiry>": the highest fence handed out in the shard, and the
// time (Unix ms, the scripts' clock) until which the mark must live. A
// claim that acquires takes its fence above the mark and sets the mark to
// it (reading and setting it in one SET ... GET; a second SET only when
// the clock is behind the mark, or when the mark was meant to live longer
// than this claim needs), so fences grow across takeover, deletion and
// re-creation of the record whatever the server's clock does, while the
// mark lives. It lives at least the fence memory (Options.FenceMemory)
// past the end of every record of its shard: a claim makes it live the
// record's time to live (lease plus grace) plus m plus the fence memory,
// where m is the retention of the store's latest completion (0 before the
// first), so that when Complete later gives the record a retention of at
// most m, the mark already outlives the record by the fence memory and
// Complete leaves it alone; a greater retention makes Complete extend it,
// and so does Renew. Release and Purge need nothing: the record they
// delete ends before its lease and grace do. The mark's expiry never moves
// back: a claim that needs less than the mark was given keeps the longer
// expiry.
//
// Every script's keys share one hash tag (one slot, one Ring shard), so
// Redis Cluster runs it on the node that owns that slot; only stuckScript,
// which walks one node's keyspace, reads keys of many slots of its node.
//
// Numbers: the scripts take durations as arguments (Lua coerces the
// decimal strings when it adds them) and send numbers to Redis as they
// are where they have at most 14 digits (Redis formats a Lua number with
// %.14g: Unix ms are 13 digits); fences (µs, 16 digits) go through fmt,
// string.format('%.0f'). Every number stays below 2^53, where a double is
// exact (a fence is a count of microseconds since 1970: 2^53 µs is the
// year 2255).

// nowLua reads the server's clock: now in ms, and in µs. skew, when
// given, moves the clock by that many µs (tests step it back with the
// store's hidden clock skew; production calls pass none).
//
// mark(hk, fence, expiry, now) keeps the shard's fence mark hk for a
// claim that acquires with fence: it sets the mark to fence, to live
// until expiry (Unix ms; now is the script's clock), and returns the
// fence to hand out: fence, or one more than the mark when the mark was
// not below it. A mark that was to live longer keeps its expiry.
//
// extend(hk, fence, expiry, now) makes the mark live until expiry at
// least, for a record of fence that lives longer (Renew, a completion
// with a longer retention than the claim covered).
const nowLua = `
local function fmt(x) return string.format('%.0f', x) end
local function clock(skew)
  local t = redis.call('TIME')
  local us = t[1] * 1000000 + t[2] + (skew or 0)
  return math.floor(us / 1000), us
end
local function parse(v)
  local a, b = string.match(v, '^(%d+):(%d+)')
  return tonumber(a), tonumber(b)
end
local function mark(hk, fence, expiry, now)
  local v = redis.call('SET', hk, fmt(fence) .. ':' .. fmt(expiry), 'PX', fmt(expiry - now), 'GET')
  if not v then return fence end
  local hf, he = parse(v)
  if hf < fence and he <= expiry then return fence end
  if hf >= fence then fence = hf + 1 end
  if he < expiry then he = expiry end
  redis.call('SET', hk, fmt(fence) .. ':' .. fmt(he), 'PX', fmt(he - now))
  return fence
end
local function extend(hk, fence, expiry, now)
  local v = redis.call('GET', hk)
  if v then
    local hf, he = parse(v)
    if he >= expiry then return end
    if hf > fence then fence = hf end
  end
  redis.call('SET', hk, fmt(fence) .. ':' .. fmt(expiry), 'PX', fmt(expiry - now))
end
`

// claimScript decides a claim: see Store.Claim for the table.
//
// KEYS[1] record, KEYS[2] its shard's fence mark. ARGV: fingerprint,
// token, lease ms, grace ms, the retention ms the mark is to cover (m),
// fence memory ms, and, from tests only, a clock skew in µs. Reply:
// {outcome, fence, attempt, extra, name1, value1, ...} where extra is the
// time left on the lease in ms for in-progress, the result for replay
// (followed by the record's time to live in ms), and "" otherwise;
// checkpoint pairs follow for an acquisition of an existing record.
//
// A replay and a mismatch, which write nothing, are answered first, before
// the script defines the functions the other outcomes use.
var claimScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'f', 't', 'n', 'a', 'l', 'r')
if h[1] then
  if h[1] ~= ARGV[1] then return {4, tonumber(h[3]), tonumber(h[4] or 1), ''} end
  if h[6] then return {2, tonumber(h[3]), tonumber(h[4] or 1), h[6], redis.call('PTTL', KEYS[1])} end
  if not h[5] then return redis.error_reply('corrupt record: neither lease nor result') end
end
` + nowLua + `
local k, lease, grace = KEYS[1], ARGV[3], ARGV[4]
local now, us = clock(ARGV[7])
local keep = now + lease + grace + ARGV[5] + ARGV[6]
if not h[1] then
  -- Absent (or expired: Redis never shows an expired key). The fence is
  -- the server's clock in µs, or one more than the shard's mark when the
  -- clock is not above it.
  local fence = mark(KEYS[2], us, keep, now)
  redis.call('HSET', k, 'f', ARGV[1], 't', ARGV[2], 'n', fmt(fence), 'l', (now + lease) .. ':' .. grace .. ':' .. ARGV[5])
  redis.call('PEXPIRE', k, lease + grace)
  return {1, fence, 1, ''}
end
local fence, attempt = tonumber(h[3]), tonumber(h[4] or 1)
-- A takeover, or a repeated claim by the same holder whose reply was lost:
-- the lease restarts from now and the checkpoints are handed over.
local set = {'l', (now + lease) .. ':' .. grace .. ':' .. ARGV[5]}
if h[2] ~= ARGV[2] then
  local deadline = tonumber(string.match(h[5], '^%d+'))
  if deadline > now then return {3, fence, attempt, deadline - now} end
  -- Takeover of an expired lease: a greater fence, one more attempt.
  local nf = us
  if nf <= fence then nf = fence + 1 end
  fence = mark(KEYS[2], nf, keep, now)
  attempt = attempt + 1
  set[3], set[4], set[5], set[6], set[7], set[8] = 't', ARGV[2], 'n', fmt(fence), 'a', attempt
else
  extend(KEYS[2], fence, keep, now)
end
local reply = {1, fence, attempt, ''}
if redis.call('HEXISTS', k, 'c') == 1 then
  local all = redis.call('HGETALL', k)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'c:' then
      reply[#reply + 1] = string.sub(all[i], 3)
      reply[#reply + 1] = all[i + 1]
    end
  end
end
redis.call('HSET', k, unpack(set))
redis.call('PEXPIRE', k, lease + grace)
return reply
`)

// renewScript extends a lease held under a token, and the shard's fence
// mark with it.
//
// KEYS[1] record, KEYS[2] its shard's fence mark. ARGV: token, lease ms,
// fence memory ms. Reply: 1, or 0 for a lost lease.
var renewScript = goredis.NewScript(nowLua + `
local k = KEYS[1]
local h = redis.call('HMGET', k, 't', 'l', 'n')
if not h[2] or h[1] ~= ARGV[1] then return 0 end
local grace, cover = string.match(h[2], '^%d+:(%d+):(%d+)')
local now = clock()
local ttl = ARGV[2] + grace
redis.call('HSET', k, 'l', (now + ARGV[2]) .. ':' .. grace .. ':' .. cover)
redis.call('PEXPIRE', k, ttl)
extend(KEYS[2], tonumber(h[3]), now + ttl + cover + ARGV[3], now)
return 1
`)

// checkpointScript stores a recovery point under a token, and marks the
// record as having checkpoints (field "c"), so that Complete and a claim
// that acquires look for them.
//
// KEYS[1] record. ARGV: token, name, value. Reply: 1, or 0 for a lost lease.
var checkpointScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 't', 'l')
if not h[2] or h[1] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'c:' .. ARGV[2], ARGV[3], 'c', '1')
return 1
`)

// completeScript records the result under a token: it deletes the lease
// fields and the checkpoints (looked for only when the record says it has
// some), sets the result, and gives the record its retention. The shard's
// fence mark is extended only when the retention exceeds the one it
// covers (field m). A record already completed under the token is left as
// it is; when ARGV[4] is "1" (the caller will WAIT for replicas) a write
// that changes nothing is made, so that WAIT on this connection also
// covers the earlier completion. When ARGV[5] is "1" a message is
// published on the record's shard channel for Watch.
//
// The fields are deleted before the result is set: a record whose result
// makes Redis convert it from a listpack to a hash table is converted with
// the fields it keeps only, as small as when it was written whole.
//
// KEYS[1] record, KEYS[2] its shard's fence mark. ARGV: token, result,
// retention ms, touch, notify, fence memory ms. Reply: 1, or 0 for a lost
// lease.
var completeScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 't', 'l', 'c')
if h[1] ~= ARGV[1] then return 0 end
if not h[2] then
  if ARGV[4] == '1' then redis.call('HSET', k, 't', ARGV[1]) end
  return 1
end
if ARGV[5] == '1' then redis.call('SPUBLISH', k, 'completed') end
if h[3] then
  local gone = {'l', 'c'}
  for _, f in ipairs(redis.call('HKEYS', k)) do
    if string.sub(f, 1, 2) == 'c:' then gone[#gone + 1] = f end
  end
  for i = 1, #gone, 500 do
    redis.call('HDEL', k, unpack(gone, i, math.min(i + 499, #gone)))
  end
else
  redis.call('HDEL', k, 'l')
end
redis.call('HSET', k, 'r', ARGV[2])
redis.call('PEXPIRE', k, ARGV[3])
if tonumber(string.match(h[2], '^%d+:%d+:(%d+)')) < tonumber(ARGV[3]) then
` + nowLua + `
  local now = clock()
  extend(KEYS[2], tonumber(redis.call('HGET', k, 'n')), now + ARGV[3] + ARGV[6], now)
end
return 1
`)

// releaseScript deletes a STARTED record held under a token; releasing an
// absent record succeeds. The shard's fence mark already outlives the
// record's lease and grace by the fence memory.
//
// KEYS[1] record. ARGV: token, notify. Reply: 1, or 0 for a lost lease.
var releaseScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 't', 'l')
if not h[1] then return 1 end
if not h[2] or h[1] ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('SPUBLISH', KEYS[1], 'released') end
redis.call('DEL', KEYS[1])
return 1
`)

// purgeScript deletes a record whatever its state, publishing on the
// record's shard channel when ARGV[1] is "1" and there was a record. The
// shard's fence mark already outlives the record by the fence memory.
//
// KEYS[1] record. ARGV: notify. Reply: 1.
var purgeScript = goredis.NewScript(`
if redis.call('DEL', KEYS[1]) == 1 and ARGV[1] == '1' then
  redis.call('SPUBLISH', KEYS[1], 'purged')
end
return 1
`)

// inspectScript reads a record for Inspect.
//
// KEYS[1] record. Reply: {} for no record, else {now ms, PTTL ms,
// {field1, value1, ...}}.
var inspectScript = goredis.NewScript(nowLua + `
local h = redis.call('HGETALL', KEYS[1])
if #h == 0 then return {} end
return {(clock()), redis.call('PTTL', KEYS[1]), h}
`)

// stuckScript lists stuck records of one node: it walks the node's
// keyspace with SCAN from cursor ARGV[2], over the keys matching ARGV[1]
// (the store's record keys) that are hashes, and judges every record it
// gets by the server's clock in the same script: a record with a lease
// deadline (STARTED) that passed is stuck. A stuck record is listed
// unless the listing's set ARGV[5] (a key of a slot of this node) already
// has it, as SCAN may return a key twice when the keyspace shrinks during
// the walk; the set lives ARGV[6] ms past the listing's latest page. The
// script makes at most ARGV[4] SCAN steps of ARGV[3] keys and lists at
// most ARGV[7] records. When a step holds more stuck records than it may
// still list, the script ends before that step: the next page walks it
// again, and the set skips those already listed.
//
// It declares no keys: it runs on one node, and reads keys of many slots
// of that node (allow-cross-slot-keys).
//
// Reply: {next cursor, done (1 at the end of the node's keyspace), now
// ms, {key1, PTTL1, {field1, value1, ...}, key2, ...}}.
var stuckScript = goredis.NewScript(`#!lua flags=allow-cross-slot-keys
local cursor, count, steps, want, set = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[7]), ARGV[5]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local recs, listed, done = {}, 0, 0
for _ = 1, steps do
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', count, 'TYPE', 'hash')
  local full = false
  for _, k in ipairs(r[2]) do
    local l = redis.call('HGET', k, 'l')
    if l and tonumber(string.match(l, '^%d+')) <= now then
      if listed >= want then
        full = true
        break
      end
      if redis.call('SADD', set, k) == 1 then
        recs[#recs + 1] = k
        recs[#recs + 1] = redis.call('PTTL', k)
        recs[#recs + 1] = redis.call('HGETALL', k)
        listed = listed + 1
      end
    end
  end
  if full then break end
  cursor = r[1]
  if cursor == '0' then
    done = 1
    break
  end
end
if listed > 0 or redis.call('EXISTS', set) == 1 then
  redis.call('PEXPIRE', set, ARGV[6])
end
return {cursor, done, now, recs}
`)

// stateScript reads a record's state for Watch: "started", "completed",
// or "" for no record.
//
// KEYS[1] record.
var stateScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'l', 'r')
if h[1] then return 'started' end
if h[2] then return 'completed' end
return ''
`)
