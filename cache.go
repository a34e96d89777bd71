package idempotency

import (
	"container/list"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// The replay cache ([WithReplayCache]): a completed record is immutable
// until it expires, so a runner may answer a repeat of it from memory, in
// this process, without a round trip. It is what a retry storm after an
// outage needs: the store is spared exactly when it is under stress.

// cacheShards spreads the cache's lock: a power of two.
const cacheShards = 16

// replayCache holds completed records by storage key, bounded in bytes
// and in time.
type replayCache struct {
	ttl    time.Duration
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

// cacheShard is one lock's part of the cache, its entries in a list from
// the most recently added. A hit takes the lock for reading only and marks
// its entry used; an entry to evict is found from the back of the list,
// giving each used one a second chance at the front (the CLOCK
// approximation of least recently used), so hits on hot keys from many
// goroutines do not queue on one lock.
type cacheShard struct {
	mu       sync.RWMutex
	entries  map[string]*list.Element
	lru      list.List
	bytes    int64
	maxBytes int64
}

// cached is a completed record: what a replay needs, and until when it may
// be answered from memory.
type cached struct {
	key         string
	fingerprint Fingerprint
	stored      []byte // the stored result, as the store keeps it
	fence       int64
	attempt     int
	until       mono      // no answer from memory from then on
	expires     time.Time // the record's Result.ExpiresAt
	used        atomic.Bool
}

// cacheOverhead is what an entry costs beyond its key, fingerprint and
// result: the entry, its list element and its map slot, about.
const cacheOverhead = 200

func (e *cached) size() int64 {
	return int64(len(e.key) + len(e.fingerprint) + len(e.stored) + cacheOverhead)
}

func newReplayCache(maxBytes int64, ttl time.Duration) *replayCache {
	c := &replayCache{ttl: ttl, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].entries = make(map[string]*list.Element)
		c.shards[i].maxBytes = max(maxBytes/cacheShards, 1)
	}
	return c
}

func (c *replayCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)&(cacheShards-1)]
}

// get returns the entry of key, if it is there and still to be answered
// from memory.
func (c *replayCache) get(key string) (*cached, bool) {
	s := c.shard(key)
	s.mu.RLock()
	el, ok := s.entries[key]
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	e := el.Value.(*cached)
	if monoNow() >= e.until {
		return nil, false // put or an eviction drops it
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	return e, true
}

// put keeps e (its fields, not its mark of use), at most the cache's time
// to live and never past expiry,
// the mono reading by which the store surely still keeps the record. An
// entry larger than its shard's share of the bound is not kept.
func (c *replayCache) put(in *cached, expiry mono) {
	e := cached{key: in.key, fingerprint: in.fingerprint, stored: in.stored, fence: in.fence, attempt: in.attempt, expires: in.expires}
	e.until = min(monoNow().add(c.ttl), expiry)
	if e.until <= monoNow() {
		return
	}
	e.stored = append([]byte(nil), e.stored...) // the store's copy may be the caller's
	s := c.shard(e.key)
	size := e.size()
	if size > s.maxBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.entries[e.key]; ok {
		s.removeLocked(el)
	}
	for s.bytes+size > s.maxBytes {
		back := s.lru.Back()
		if old := back.Value.(*cached); old.used.Load() && monoNow() < old.until {
			old.used.Store(false) // a second chance
			s.lru.MoveToFront(back)
			continue
		}
		s.removeLocked(back)
	}
	s.entries[e.key] = s.lru.PushFront(&e)
	s.bytes += size
}

// drop forgets key (a purge through this runner).
func (c *replayCache) drop(key string) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.entries[key]; ok {
		s.removeLocked(el)
	}
}

func (s *cacheShard) removeLocked(el *list.Element) {
	e := s.lru.Remove(el).(*cached)
	delete(s.entries, e.key)
	s.bytes -= e.size()
}
