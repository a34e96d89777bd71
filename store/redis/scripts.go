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
//	m    the retention in ms the fence's high-water mark already covers (started
//	     only; see below; records of earlier releases lack it: 0)
//	c    "1" when the record has or had checkpoints (started only; records of
//	     earlier releases lack it, and Complete looks for checkpoints in
//	     every record without m)
//	r    result (completed only)
//	c:*  checkpoints, "c:" followed by the checkpoint's name (started only)
//
// Next to each record, a string key <prefix>{<shard>}\x00f<storage key>
// holds the highest fence handed out for the storage key (its high-water
// mark). It lives at least the fence memory (Options.FenceMemory) longer
// than the record: a claim sets it with a time to live of the record's
// (lease plus grace) plus m plus the fence memory, where m is the retention
// of the store's latest completion (0 before the first one), so that when
// Complete later gives the record a retention of at most m, the mark
// already outlives the record by the fence memory and Complete leaves it
// alone; a greater retention makes Complete set it again. Renew and every
// claim that moves the lease set it again with the same margin; Release
// and Purge keep it for the fence memory once the record is gone. A fresh
// claim takes its fence above it (reading and setting it in one SET ...
// GET), so fences grow across deletion and re-creation whatever the
// server's clock does, while the mark lives.
//
// Why m is enough: a started record's expiry is always its lease deadline
// plus its grace, in the server's clock, and so is the mark's minus m and
// the fence memory (both are set together, relative to the same clock).
// A completion runs while the record exists, so before that expiry; the
// record then lives the retention from the completion, which ends before
// the mark's expiry minus the fence memory when the retention is at most m.
//
// Next to the records, each of the 1024 shards (the hash tag of its keys,
// see Store.Key) has an index of its STARTED records: a sorted set
// <prefix>{<shard>}\x00started of storage keys scored by their lease
// deadline (l). Claims and Renew add or move a record's entry; Complete,
// Release and Purge remove it; entries of records that expired by TTL are
// stale until Stuck, a fresh claim in the shard, or the index's own expiry
// drops them (see indexLua). Stuck reads it instead of the keyspace.
//
// Every script's keys share one hash tag (one slot, one Ring shard), so
// Redis Cluster runs it on the node that owns that slot. The scripts that
// look a record up from an index entry (the stale-entry check of a fresh
// claim, Stuck) read a key they did not declare: Redis allows it for a key
// of the declared slot (servers that insist on declared keys, such as
// Dragonfly, need their allow-undeclared-keys setting).
//
// Numbers are written with string.format('%.0f'), so that their text never
// depends on how a Redis version renders a Lua number (a double); every
// number stored stays below 2^53, where a double is exact (a fence is a
// count of microseconds since 1970: 2^53 µs is the year 2255).

// indexLua is the index upkeep the scripts share. A record's index key is
// its record key's prefix and hash tag followed by "\0started" (8 bytes),
// so the record key is the index key's first #idx-8 bytes followed by the
// storage key, which is the entry's member.
//
//   - member(k, idx): the storage key of record k.
//   - dropStale(idx, now): look at the two entries with the earliest
//     deadlines; drop those whose deadline passed and whose record is gone
//     or not STARTED any more (it expired by TTL: no script ran to remove
//     it). A fresh claim calls it before adding its own entry, so each new
//     entry pays for up to two stale ones: with one grace for the shard's
//     records, deadlines and expiries come in the same order, stale
//     entries gather at the low end, and they cannot pile up in a shard
//     that keeps getting claims. It costs a ZRANGE, and two HGETs only
//     when the earliest deadlines have passed (crashed holders). It
//     returns true when it found the index empty (absent).
//   - index(idx, member, deadline, ttl, fresh): add or move the entry, and
//     keep the index at least ttl ms (the record's own time to live), with
//     a minute to spare so that PEXPIRE runs about once a minute per shard
//     rather than on every claim. The index thus outlives every record it
//     lists, and expires a minute after the last of them. fresh says the
//     index was absent before the ZADD, so it has no TTL to read.
const indexLua = `
local function member(k, idx) return string.sub(k, #idx - 7) end
local function dropStale(idx, now)
  local low = redis.call('ZRANGE', idx, 0, 1, 'WITHSCORES')
  local base = string.sub(idx, 1, #idx - 8)
  for i = 1, #low, 2 do
    if tonumber(low[i + 1]) > now then break end
    if redis.call('HGET', base .. low[i], 's') ~= 'started' then
      redis.call('ZREM', idx, low[i])
    end
  end
  return #low == 0
end
local function index(idx, m, deadline, ttl, fresh)
  redis.call('ZADD', idx, string.format('%.0f', deadline), m)
  if fresh or redis.call('PTTL', idx) < ttl then
    redis.call('PEXPIRE', idx, ttl + 60000)
  end
end
`

// nowLua reads the server's clock: now in ms, and in µs. skew, when
// given, moves the clock by that many µs (tests step it back with
// Options' hidden clock skew; it is 0 otherwise).
//
// keepFence(hk, fence, ttl) records fence as the key's high-water mark
// for ttl ms. fmt(x) is the decimal text of the integer x.
const nowLua = `
local function fmt(x) return string.format('%.0f', x) end
local function clock(skew)
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + (skew or 0)
  return math.floor(us / 1000), us
end
local function keepFence(hk, fence, ttl)
  redis.call('SET', hk, fmt(fence), 'PX', fmt(ttl))
end
`

// claimScript decides a claim: see Store.Claim for the table.
//
// KEYS[1] record, KEYS[2] its shard's index, KEYS[3] its fence's
// high-water mark. ARGV: fingerprint, token, lease ms, grace ms, fence
// memory ms, clock skew µs, retention ms the mark is to cover (m). Reply:
// {outcome, fence, attempt, extra, name1, value1, ...} where extra is the
// time left on the lease in ms for in-progress, the result for replay,
// and "" otherwise; checkpoint pairs follow for an acquisition of an
// existing record.
//
// A replay and a mismatch, which write nothing, are answered first, before
// the script defines the functions the other outcomes use.
var claimScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'f', 's', 't', 'n', 'a', 'l', 'r')
if h[1] then
  if h[1] ~= ARGV[1] then
    return {4, tonumber(h[4]), tonumber(h[5]), ''}
  end
  if h[2] == 'completed' then
    return {2, tonumber(h[4]), tonumber(h[5]), h[7] or ''}
  end
end
` + indexLua + nowLua + `
local k, idx, hk = KEYS[1], KEYS[2], KEYS[3]
local lease, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local memory, skew, cover = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
if not h[1] then
  -- Absent (or expired: Redis never shows an expired key). The fence is the
  -- server's clock in microseconds, or one more than the highest fence
  -- handed out for this key while that is remembered, whichever is
  -- greater: it exceeds every fence handed out before the record was
  -- deleted or expired, even after the clock stepped back. The mark is
  -- read and set in one command; it is set again in the rare case that
  -- it was not below the clock.
  local now, fence = clock(skew)
  local px = fmt(lease + grace + tonumber(cover) + memory)
  local hw = tonumber(redis.call('SET', hk, fmt(fence), 'PX', px, 'GET'))
  if hw and hw >= fence then
    fence = hw + 1
    redis.call('SET', hk, fmt(fence), 'PX', px)
  end
  redis.call('HSET', k, 'f', ARGV[1], 's', 'started', 't', ARGV[2],
    'n', fmt(fence), 'a', '1', 'l', fmt(now + lease), 'g', ARGV[4], 'm', cover)
  redis.call('PEXPIRE', k, lease + grace)
  local fresh = dropStale(idx, now)
  index(idx, member(k, idx), now + lease, lease + grace, fresh)
  return {1, fence, 1, ''}
end
local fence, attempt = tonumber(h[4]), tonumber(h[5])
local now, us = clock(skew)
local reply = {1, fence, attempt, ''}
-- A takeover, or a repeated claim by the same holder whose reply was lost:
-- the lease restarts from now and the checkpoints are handed over.
local set = {'l', fmt(now + lease), 'g', ARGV[4], 'm', cover}
if h[3] ~= ARGV[2] then
  local deadline = tonumber(h[6])
  if deadline > now then
    return {3, fence, attempt, deadline - now}
  end
  -- Takeover of an expired lease: a greater fence, one more attempt.
  local nf = us
  if nf <= fence then nf = fence + 1 end
  attempt = attempt + 1
  set[7], set[8], set[9], set[10], set[11], set[12] = 't', ARGV[2], 'n', fmt(nf), 'a', fmt(attempt)
  reply = {1, nf, attempt, ''}
  fence = nf
end
local all = redis.call('HGETALL', k)
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'c:' then
    reply[#reply + 1] = string.sub(all[i], 3)
    reply[#reply + 1] = all[i + 1]
  end
end
-- A record of an earlier release has checkpoints without the "c" field.
if #reply > 4 then
  set[#set + 1] = 'c'
  set[#set + 1] = '1'
end
redis.call('HSET', k, unpack(set))
redis.call('PEXPIRE', k, lease + grace)
keepFence(hk, fence, lease + grace + tonumber(cover) + memory)
index(idx, member(k, idx), now + lease, lease + grace, false)
return reply
`)

// renewScript extends a lease held under a token. A record that is gone
// leaves a stale index entry, which it drops.
//
// KEYS[1] record, KEYS[2] its index, KEYS[3] its fence's high-water mark.
// ARGV: token, lease ms, fence memory ms. Reply: 1, or 0 for a lost lease.
var renewScript = goredis.NewScript(indexLua + nowLua + `
local k, idx, hk = KEYS[1], KEYS[2], KEYS[3]
local h = redis.call('HMGET', k, 's', 't', 'g', 'n', 'm')
if not h[1] then
  redis.call('ZREM', idx, member(k, idx))
  return 0
end
if h[1] ~= 'started' or h[2] ~= ARGV[1] then return 0 end
local now = clock()
local ttl = tonumber(ARGV[2]) + tonumber(h[3])
redis.call('HSET', k, 'l', fmt(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', k, ttl)
keepFence(hk, tonumber(h[4]), ttl + (tonumber(h[5]) or 0) + tonumber(ARGV[3]))
index(idx, member(k, idx), now + tonumber(ARGV[2]), ttl, false)
return 1
`)

// checkpointScript stores a recovery point under a token, and marks the
// record as having checkpoints (field "c"), so that Complete looks for
// them. The record's expiry (lease deadline plus grace, both absolute) is
// set again, unchanged, and so is its index entry.
//
// KEYS[1] record. ARGV: token, name, value. Reply: 1, or 0 for a lost lease.
var checkpointScript = goredis.NewScript(`
local k = KEYS[1]
local h = redis.call('HMGET', k, 's', 't', 'l', 'g')
if h[1] ~= 'started' or h[2] ~= ARGV[1] then return 0 end
redis.call('HSET', k, 'c:' .. ARGV[2], ARGV[3], 'c', '1')
redis.call('PEXPIREAT', k, tonumber(h[3]) + tonumber(h[4]))
return 1
`)

// completeScript records the result under a token: it deletes the lease
// fields and the checkpoints (looked for only when the record says it has
// some, or is of an earlier release: it has no field m), sets the state
// and the result, and drops the record's index entry. The fence's
// high-water mark is set again only when the retention exceeds the one it
// covers (field m). A record already completed under the token is left as
// it is; when ARGV[4] is "1" (the caller will WAIT for replicas) a write
// that changes nothing is made, so that WAIT on this connection also
// covers the earlier completion. When ARGV[5] is "1" a message is
// published on the record's shard channel for Watch. A record that is gone
// leaves a stale index entry, which it drops.
//
// The fields are deleted before the result is set: a record whose result
// makes Redis convert it from a listpack to a hash table is converted with
// the fields it keeps only, as small as when it was written whole.
//
// KEYS[1] record, KEYS[2] its index, KEYS[3] its fence's high-water mark.
// ARGV: token, result, retention ms, touch, notify, fence memory ms.
// Reply: 1, or 0 for a lost lease.
var completeScript = goredis.NewScript(indexLua + nowLua + `
local k, idx, hk = KEYS[1], KEYS[2], KEYS[3]
local h = redis.call('HMGET', k, 's', 't', 'n', 'm', 'c')
if not h[1] then
  redis.call('ZREM', idx, member(k, idx))
  return 0
end
if h[2] ~= ARGV[1] then return 0 end
if h[1] == 'completed' then
  if ARGV[4] == '1' then redis.call('HSET', k, 's', 'completed') end
  return 1
end
if h[1] ~= 'started' then return 0 end
if ARGV[5] == '1' then redis.call('SPUBLISH', k, 'completed') end
local gone = {'l', 'g', 'm', 'c'}
if h[5] or not h[4] then
  for _, f in ipairs(redis.call('HKEYS', k)) do
    if string.sub(f, 1, 2) == 'c:' then gone[#gone + 1] = f end
  end
end
for i = 1, #gone, 500 do
  redis.call('HDEL', k, unpack(gone, i, math.min(i + 499, #gone)))
end
redis.call('HSET', k, 's', 'completed', 'r', ARGV[2])
local retention = tonumber(ARGV[3])
redis.call('PEXPIRE', k, retention)
if (tonumber(h[4]) or 0) < retention then
  keepFence(hk, tonumber(h[3]), retention + tonumber(ARGV[6]))
end
redis.call('ZREM', idx, member(k, idx))
return 1
`)

// releaseScript deletes a started record held under a token, and its index
// entry; releasing an absent record drops the entry it may have left.
//
// KEYS[1] record, KEYS[2] its index, KEYS[3] its fence's high-water mark.
// ARGV: token, notify, fence memory ms. Reply: 1, or 0 for a lost lease.
var releaseScript = goredis.NewScript(indexLua + nowLua + `
local k, idx, hk = KEYS[1], KEYS[2], KEYS[3]
local h = redis.call('HMGET', k, 's', 't', 'n')
if not h[1] then
  redis.call('ZREM', idx, member(k, idx))
  return 1
end
if h[1] ~= 'started' or h[2] ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('SPUBLISH', k, 'released') end
keepFence(hk, tonumber(h[3]), tonumber(ARGV[3]))
redis.call('DEL', k)
redis.call('ZREM', idx, member(k, idx))
return 1
`)

// purgeScript deletes a record whatever its state, and its index entry,
// publishing on the record's shard channel when ARGV[1] is "1" and there
// was a record.
//
// KEYS[1] record, KEYS[2] its index, KEYS[3] its fence's high-water mark.
// ARGV: notify, fence memory ms. Reply: 1.
var purgeScript = goredis.NewScript(indexLua + nowLua + `
local k, idx, hk = KEYS[1], KEYS[2], KEYS[3]
local n = redis.call('HGET', k, 'n')
if n then keepFence(hk, tonumber(n), tonumber(ARGV[2])) end
if redis.call('DEL', k) == 1 and ARGV[1] == '1' then
  redis.call('SPUBLISH', k, 'purged')
end
redis.call('ZREM', idx, member(k, idx))
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

// stuckScript lists the stuck records of one shard from its index: the
// entries whose deadline passed (score <= now), in index order (score,
// then member byte by byte), after the position (ARGV[3], ARGV[4]). Each
// entry is checked against its record: a record that is gone or not
// STARTED any more makes the entry stale, and it is dropped; a STARTED
// record whose lease ended is listed (its expiry not passed, since Redis
// shows no expired key). It stops after listing want records or looking
// at budget entries, and reports whether the shard is done.
//
// Members of one score are compared byte by byte (as the sorted set orders
// them), not with Lua's <, which follows the server's locale. Stale
// entries are removed at the end, so that the LIMIT offsets stay valid.
//
// KEYS[1] index. ARGV: want, budget, score and member of the last entry
// already looked at ("" and "" for the start of the shard).
// Reply: {done (1 or 0), last score, last member, now ms, {record...}},
// each record {member, score, PTTL ms, {field1, value1, ...}}.
var stuckScript = goredis.NewScript(nowLua + `
local idx = KEYS[1]
local base = string.sub(idx, 1, #idx - 8)
local want, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local after, afterm = tonumber(ARGV[3]), ARGV[4]
local lastS, lastM = ARGV[3], ARGV[4]
local now = clock()
local function passed(m)
  if m == afterm then return true end
  for i = 1, math.min(#m, #afterm) do
    local x, y = string.byte(m, i), string.byte(afterm, i)
    if x ~= y then return x < y end
  end
  return #m < #afterm
end
local recs, stale = {}, {}
local seen, off, done = 0, 0, 1
local min = '-inf'
if after then min = ARGV[3] end
while done == 1 do
  local batch = redis.call('ZRANGEBYSCORE', idx, min, now, 'WITHSCORES', 'LIMIT', off, 128)
  if #batch == 0 then break end
  off = off + #batch / 2
  for i = 1, #batch, 2 do
    local m, sc = batch[i], tonumber(batch[i + 1])
    if not after or sc > after or not passed(m) then
      if seen >= budget or #recs >= want then
        done = 0
        break
      end
      seen = seen + 1
      local k = base .. m
      local h = redis.call('HMGET', k, 's', 'l')
      if h[1] ~= 'started' then
        stale[#stale + 1] = m
      elseif tonumber(h[2]) <= now then
        recs[#recs + 1] = {m, batch[i + 1], redis.call('PTTL', k), redis.call('HGETALL', k)}
      end
      lastS, lastM = batch[i + 1], m
    end
  end
end
for i = 1, #stale, 500 do
  redis.call('ZREM', idx, unpack(stale, i, math.min(i + 499, #stale)))
end
return {done, lastS, lastM, now, recs}
`)

// stateScript reads a record's state for Watch: "started", "completed",
// or "" for no record.
//
// KEYS[1] record.
var stateScript = goredis.NewScript(`
return redis.call('HGET', KEYS[1], 's') or ''
`)
