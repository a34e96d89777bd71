package queue

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// The index is the queue's memory of its pending items: per item its ID,
// key, order and retry state, never its request (read from the file when
// it is sent). Everything here is guarded by Queue.mu.

// retryState is the part of an item's head that its attempts change; it
// is written to the file when it changes.
type retryState struct {
	// sent is when a request of the item may first have reached the
	// server: the start of the key's lifetime there. It is written
	// before the first attempt (a crash right after the request left
	// must not lose it) and, to spare a flush per item, for the next
	// items of the order in the same write (markWindow): marked early is
	// only cautious. A mark whose attempts all failed to connect is
	// cleared, so that a client offline for days keeps its items.
	sent     time.Time
	expires  time.Time // the key's expiry as the server advertised it (our clock)
	next     time.Time // the next attempt's time, zero for at once
	attempts int
	lastErr  string
}

func (st *retryState) setHead(h *head) {
	h.sent, h.expires, h.next, h.attempts, h.lastErr = st.sent, st.expires, st.next, st.attempts, st.lastErr
}

// entry is a pending item in the index.
type entry struct {
	id    uint64
	key   string
	order *order // nil for a damaged item whose order is unknown
	st    retryState
	// speculative reports that st.sent was marked by this process and no
	// attempt of the item has connected to a server since: the mark may
	// be cleared.
	speculative bool
	inflight    bool
	damaged     error
	sched       *edge.Schedule // this process's retries; nil before the first
}

// order is the FIFO of one ordering key; items[0] is its head, the only
// one that may be sent.
type order struct {
	key   string
	items []*entry
	heap  int // index in Queue.ready, or -1
}

// readyHeap holds the orders whose head may be sent (not in flight, not
// damaged, not behind a damaged item of unknown order), earliest due
// first, then lowest ID.
type readyHeap []*order

func (h readyHeap) Len() int { return len(h) }
func (h readyHeap) Less(i, j int) bool {
	a, b := h[i].items[0], h[j].items[0]
	if !a.st.next.Equal(b.st.next) {
		return a.st.next.Before(b.st.next)
	}
	return a.id < b.id
}
func (h readyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heap, h[j].heap = i, j
}
func (h *readyHeap) Push(x any) {
	o := x.(*order)
	o.heap = len(*h)
	*h = append(*h, o)
}
func (h *readyHeap) Pop() any {
	old := *h
	o := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	o.heap = -1
	return o
}

// barrier is the lowest ID of a damaged item whose order is unknown: no
// item after it may be sent, as it might be of their order.
func (q *Queue) barrier() uint64 {
	b := ^uint64(0)
	for _, e := range q.unknown {
		b = min(b, e.id)
	}
	return b
}

// push puts o in the ready heap if its head may be sent.
func (q *Queue) push(o *order) {
	if o.heap >= 0 || len(o.items) == 0 {
		return
	}
	e := o.items[0]
	if e.inflight || e.damaged != nil || e.id > q.barrier() {
		return
	}
	heap.Push(&q.ready, o)
}

// fix updates o's place in the ready heap after its head changed.
func (q *Queue) fix(o *order) {
	if o.heap >= 0 {
		heap.Remove(&q.ready, o.heap)
	}
	q.push(o)
}

// rebuild remakes the ready heap, after the barrier moved.
func (q *Queue) rebuild() {
	for _, o := range q.ready {
		o.heap = -1
	}
	q.ready = q.ready[:0]
	for _, o := range q.orders {
		q.push(o)
	}
}

// remove takes e out of the index.
func (q *Queue) remove(e *entry) {
	delete(q.byKey, e.key)
	o := e.order
	if o == nil {
		for i, u := range q.unknown {
			if u == e {
				q.unknown = append(q.unknown[:i], q.unknown[i+1:]...)
				break
			}
		}
		q.rebuild()
		return
	}
	if o.items[0] == e {
		o.items[0] = nil
		o.items = o.items[1:]
	} else {
		for i, x := range o.items {
			if x == e {
				copy(o.items[i:], o.items[i+1:])
				o.items[len(o.items)-1] = nil
				o.items = o.items[:len(o.items)-1]
				break
			}
		}
	}
	if len(o.items) == 0 {
		if o.heap >= 0 {
			heap.Remove(&q.ready, o.heap)
		}
		delete(q.orders, o.key)
		return
	}
	q.fix(o)
}

// damage is the error of a damaged record.
func damage(id uint64, err error) error {
	return fmt.Errorf("%w: item %d: %v", ErrCorrupt, id, err)
}
