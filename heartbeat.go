package idempotency

import (
	"container/heap"
	"sync"
	"time"
)

// heartbeats schedules the lease renewals of all of a runner's holders on
// one timer. A timer per call would cost two allocations and a timer
// operation on every Do; most calls finish long before their first
// renewal is due, and for them the schedule costs a heap push and pop.
// A due renewal runs on a goroutine of its own, so a slow store delays
// no other holder's.
type heartbeats struct {
	mu    sync.Mutex
	queue beatQueue
	timer *time.Timer // made on first use, then Reset
	armed mono        // when timer fires; zero when it is not armed
}

// schedule queues h's next renewal at h.next. It reschedules the timer
// only when h is due before the timer fires, which, as every holder renews
// at the same interval, is rare while holders keep arriving.
func (hb *heartbeats) schedule(h *holder) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	heap.Push(&hb.queue, h)
	if hb.armed == 0 || h.next < hb.armed {
		hb.arm(h.next)
	}
}

// unschedule removes h from the queue if it is there. The timer is left
// armed: a spurious firing finds nothing due and costs less than stopping
// and restarting it for every call.
func (hb *heartbeats) unschedule(h *holder) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if h.index >= 0 {
		heap.Remove(&hb.queue, h.index)
	}
}

// arm makes the timer fire at t. Called with mu held.
func (hb *heartbeats) arm(t mono) {
	d := time.Duration(t - monoNow())
	if hb.timer == nil {
		hb.timer = time.AfterFunc(d, hb.fire)
	} else {
		hb.timer.Reset(d)
	}
	hb.armed = t
}

// fire starts the renewals that are due and arms the timer for the next.
func (hb *heartbeats) fire() {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.armed = 0
	now := monoNow()
	for len(hb.queue) > 0 && hb.queue[0].next <= now {
		h := heap.Pop(&hb.queue).(*holder)
		go h.beat() // it schedules its next renewal itself
	}
	if len(hb.queue) > 0 {
		hb.arm(hb.queue[0].next)
	}
}

// beatQueue is a min-heap of holders by their next renewal.
type beatQueue []*holder

func (q beatQueue) Len() int           { return len(q) }
func (q beatQueue) Less(i, j int) bool { return q[i].next < q[j].next }
func (q beatQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}

func (q *beatQueue) Push(x any) {
	h := x.(*holder)
	h.index = len(*q)
	*q = append(*q, h)
}

func (q *beatQueue) Pop() any {
	old := *q
	n := len(old)
	h := old[n-1]
	old[n-1] = nil
	h.index = -1
	*q = old[:n-1]
	return h
}
