package etcd

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Deadlines are etcd leases: a key attached to a lease is deleted by the
// server when the lease's TTL, counted by the leader's clock, runs out. A
// lease grant is a round trip, so the store shares leases between records
// whose deadlines are close, as Kubernetes' API server does for its events:
// a lease granted with a TTL padded by a small window serves every
// operation that needs a deadline inside that window.
//
// A lease serves an operation that needs a deadline at least need after
// the operation began (start) only if it surely lasts that long: its
// grant request was sent at sent, and the leader counts its TTL from when
// it received the request, which is later, so it ends no earlier than
// sent + TTL. The check uses the client's monotonic clock to measure the
// time since sent, never a wall-clock deadline. A leader change only moves
// lease ends later (the new leader restarts every lease's TTL), so a lease
// never ends before that bound.
//
// The padding is at most lateWindow(need): 5% of it, at most a minute,
// rounded down to whole seconds (etcd's TTLs are whole seconds). Below 20s
// it is zero: a lease then serves the operations that began before its
// grant was sent, which in a burst of claims with the same lease is all of
// them, and a deadline ends at most a second late however short it is.

// maxWindow bounds how much later than asked a shared lease may end.
const maxWindow = time.Minute

// lateWindow is how much later than need a deadline may end because its
// lease is shared.
func lateWindow(need time.Duration) time.Duration {
	return min(need/20, maxWindow)
}

// ttlFor is the TTL, in whole seconds, of the lease granted for need: at
// least need, at most need plus its window (when the window allows a
// whole second).
func ttlFor(need time.Duration) int64 {
	ceil := int64((need + time.Second - 1) / time.Second)
	padded := int64((need + lateWindow(need)) / time.Second)
	return max(ceil, padded, 1)
}

// A grant is one lease, granted or being granted.
type grant struct {
	sent time.Time // before the request was sent
	ttl  int64     // the TTL asked for, in seconds
	done chan struct{}
	id   clientv3.LeaseID // valid once done is closed and err is nil
	err  error
}

// lasts reports whether the lease surely lasts until need after start.
func (g *grant) lasts(start time.Time, need time.Duration) bool {
	return !g.sent.Add(time.Duration(g.ttl) * time.Second).Before(start.Add(need))
}

// leaseClass holds the leases of one TTL: the last one granted, and one
// being granted.
type leaseClass struct {
	cur, pending *grant
}

// leasePool hands out leases, sharing them as described above.
type leasePool struct {
	client Client
	mu     sync.Mutex
	byTTL  map[int64]*leaseClass
	// raised is the largest TTL the server gave for a smaller request: its
	// minimum lease TTL (etcd raises shorter ones to 1.5 election timeouts,
	// rounded up to seconds), in seconds; 0 until seen.
	raised atomic.Int64
}

func newLeasePool(c Client) *leasePool {
	return &leasePool{client: c, byTTL: make(map[int64]*leaseClass)}
}

// pooled returns a lease of the pool that lasts at least need from start,
// if there is one, without waiting.
func (p *leasePool) pooled(need time.Duration, start time.Time) (clientv3.LeaseID, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.byTTL[ttlFor(need)]; c != nil && c.cur != nil && c.cur.lasts(start, need) {
		return c.cur.id, true
	}
	return 0, false
}

// get returns a lease that lasts at least need from start, granting one if
// none of the pool's does.
func (p *leasePool) get(ctx context.Context, need time.Duration, start time.Time) (clientv3.LeaseID, error) {
	ttl := ttlFor(need)
	p.mu.Lock()
	c := p.byTTL[ttl]
	if c == nil {
		p.prune()
		c = &leaseClass{}
		p.byTTL[ttl] = c
	}
	if g := c.cur; g != nil && g.lasts(start, need) {
		p.mu.Unlock()
		return g.id, nil
	}
	if g := c.pending; g != nil && g.lasts(start, need) {
		p.mu.Unlock()
		select {
		case <-g.done:
			if g.err == nil {
				return g.id, nil
			}
			// The grant failed, perhaps only for the context of the call
			// that sent it: try one of our own.
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		p.mu.Lock()
	}
	g := &grant{sent: time.Now(), ttl: ttl, done: make(chan struct{})}
	c.pending = g
	p.mu.Unlock()

	resp, err := p.client.Grant(ctx, ttl)
	if err == nil {
		g.id = resp.ID
		if resp.TTL > ttl {
			for {
				old := p.raised.Load()
				if resp.TTL <= old || p.raised.CompareAndSwap(old, resp.TTL) {
					break
				}
			}
		}
	}
	g.err = err
	close(g.done)
	p.mu.Lock()
	if c.pending == g {
		c.pending = nil
	}
	if err == nil && (c.cur == nil || g.sent.After(c.cur.sent)) {
		c.cur = g
	}
	p.mu.Unlock()
	return g.id, err
}

// forget drops leases the server no longer has (a Txn that used them
// failed with "lease not found": revoked by someone, or lost in a restore),
// so that the next operation is granted a new one.
func (p *leasePool) forget(ids ...clientv3.LeaseID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.byTTL {
		for _, id := range ids {
			if c.cur != nil && c.cur.id == id {
				c.cur = nil
			}
		}
	}
}

// prune drops classes whose last lease has ended, so that a store that saw
// many different durations does not keep them all. Called with mu held.
func (p *leasePool) prune() {
	if len(p.byTTL) < 64 {
		return
	}
	now := time.Now()
	for ttl, c := range p.byTTL {
		if c.pending == nil && (c.cur == nil || !c.cur.lasts(now, 0)) {
			delete(p.byTTL, ttl)
		}
	}
}
