package etcd

import (
	"sync"

	"github.com/exactlyonce/idempotency"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// holderState is what the store remembers of a record held under a token
// after it last wrote or read it: enough to renew it or write a checkpoint
// in one transaction. It is only a guess: every transaction that relies
// on it compares the record's revision, and reads the record when they
// differ.
type holderState struct {
	hRev  int64            // the record key's mod revision
	lease clientv3.LeaseID // the record's life lease
	meta  meta
	names []string // checkpoint names; shared, never changed in place
	known bool
}

type holderID struct {
	key   string
	token idempotency.Token
}

// maxHolders bounds the holder cache: records whose holders vanished
// (crashed, or a claim whose reply was lost) are never dropped otherwise.
const maxHolders = 1 << 14

// holderCache maps (storage key, token) to what the store remembers.
type holderCache struct {
	mu sync.Mutex
	m  map[holderID]holderState
}

func (c *holderCache) get(key string, tok idempotency.Token) holderState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[holderID{key, tok}]
}

func (c *holderCache) put(key string, tok idempotency.Token, st holderState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := holderID{key, tok}
	if old, ok := c.m[id]; ok && old.hRev > st.hRev {
		return // a later write by a concurrent call of the holder's
	}
	if len(c.m) >= maxHolders {
		for k := range c.m { // drop an arbitrary entry: it is only a guess
			delete(c.m, k)
			break
		}
	}
	c.m[id] = st
}

func (c *holderCache) drop(key string, tok idempotency.Token) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, holderID{key, tok})
}
