package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/internal/edge"
)

// Run sends the queue's items until ctx is done or the queue is closed,
// and then returns ctx's error (or [ErrClosed]) once the attempts it
// started have ended. Only one Run may run at a time.
//
// The items of an order are sent one after the other: an item is sent
// once every earlier item of its order has ended (its answer definitive,
// or it went to the dead letters), so no item ever overtakes an
// unfinished one of its order. What an answer means, with the library's
// HTTP semantics (package httpidem):
//
//	answer                                        the item
//	2xx, 3xx, another 4xx; any replayed answer    done: the handler is told, the item removed
//	409 in progress (Retry-After, or its problem) retried, waiting at least Retry-After
//	5xx, 408, 429                                 retried, waiting at least Retry-After
//	a network error, an attempt's timeout          retried
//	422 (the key was used for another request)    dead: stopped, kept with the answer
//	410 (the effect happened, its answer lost)    dead
//	500 "stored answer unreadable" (its problem)  dead: the server will not run it again
//	the key would expire before the next attempt  dead, saying so
//
// Retries wait a capped, jittered, doubling backoff ([WithBackoff]), or
// the server's Retry-After if that is longer; they stop once the next
// attempt would come after the key's expiry less [ExpiryMargin]: the
// expiry the server advertised ([WithExpiresHeader]) or, failing that,
// [WithKeyLifetime] after the item may first have reached the server. A
// retry after it could run the request again. Nothing is ever retried
// with a new key.
func (q *Queue) Run(ctx context.Context) error {
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return ErrClosed
	case q.running:
		q.mu.Unlock()
		return ErrRunning
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q.running, q.stop = true, cancel
	q.mu.Unlock()

	limit := q.cfg.concurrency
	done := make(chan struct{}, q.cfg.concurrency)
	inflight := 0
	defer func() {
		for ; inflight > 0; inflight-- {
			<-done
		}
		q.mu.Lock()
		q.running, q.stop = false, nil
		q.mu.Unlock()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if inflight < limit {
			if e := q.take(); e != nil {
				inflight++
				go func() {
					q.attempt(ctx, e)
					done <- struct{}{}
				}()
				continue
			}
		}
		wait := time.Duration(1<<63 - 1) // every slot busy: wait for one
		if inflight < limit {
			wait = q.untilDue()
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			if q.isClosed() {
				return ErrClosed
			}
			return ctx.Err()
		case <-q.wake:
		case <-done:
			inflight--
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func (q *Queue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// take returns the next item due, now in flight, or nil.
func (q *Queue) take() *entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ready) == 0 {
		return nil
	}
	e := q.ready[0].items[0]
	if e.st.next.After(q.cfg.now()) {
		return nil
	}
	e.inflight = true
	q.fix(q.ready[0]) // takes it out: its head is in flight
	return e
}

// untilDue is how long until the next item is due (an hour when none
// is: a new item, or a retry now, wakes Run).
func (q *Queue) untilDue() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ready) == 0 {
		return time.Hour
	}
	return max(q.ready[0].items[0].st.next.Sub(q.cfg.now()), time.Millisecond)
}

// verdict is what an answer means for its item.
type verdict uint8

const (
	retry verdict = iota
	done
	dead
)

// answers maps the statuses that do not follow their class's rule (2xx,
// 3xx and 4xx done, 5xx retried) to their verdict.
var answers = map[int]verdict{
	http.StatusRequestTimeout:      retry,
	http.StatusTooManyRequests:     retry,
	http.StatusGone:                dead,
	http.StatusUnprocessableEntity: dead,
}

// problems maps httpidem's problem types that decide by themselves.
var problems = map[string]struct {
	v      verdict
	reason string
}{
	httpidem.ProblemInProgress: {retry, ""},
	httpidem.ProblemKeyReused: {dead, "the server has this key for another request (422, key reused): " +
		"a client bug; the item is never sent with another key"},
	httpidem.ProblemResponseNotStored: {dead, "the server ran the request but could not store its answer (410): " +
		"its effect happened, its answer is lost"},
	httpidem.ProblemResultCorrupt: {dead, "the server cannot read its stored answer for this key (500): " +
		"it will not run the request again; its operator must inspect the key"},
}

// classify returns what resp means for its item, and for a dead one why.
func (q *Queue) classify(resp *Response) (verdict, string) {
	typ := problemType(resp)
	if p, ok := problems[typ]; ok {
		return p.v, p.reason
	}
	s := resp.Status
	if v, ok := answers[s]; ok {
		if v == dead {
			return dead, fmt.Sprintf("the server answered %d %s: the item stops", s, http.StatusText(s))
		}
		if !resp.Replayed {
			return v, ""
		}
	}
	switch {
	case resp.Replayed:
		return done, "" // the stored answer: every retry would get it again
	case s == http.StatusConflict && resp.Header.Get("Retry-After") != "":
		return retry, "" // in progress, from a server that names no problem type
	case s >= 200 && s < 500:
		return done, ""
	}
	return retry, ""
}

// problemType returns the type of an RFC 9457 problem response, or "".
func problemType(resp *Response) string {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != httpidem.ProblemContentType {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(resp.Body, &p) != nil {
		return ""
	}
	return p.Type
}

// attempt sends e's request once and acts on the answer. e is in flight.
func (q *Queue) attempt(ctx context.Context, e *entry) {
	now := q.cfg.now()
	if at, why := q.deadline(e); !at.IsZero() && !now.Before(at) {
		q.stopLate(ctx, e, why, at)
		return
	}
	if err := q.markSent(e, now); err != nil {
		q.failed(ctx, e, nil, "could not record the attempt: "+err.Error(), false, false)
		return
	}
	q.mu.Lock()
	e.st.attempts++
	q.mu.Unlock()
	it, err := q.read(e)
	if err != nil {
		q.mu.Lock()
		e.damaged = err
		e.inflight = false
		q.mu.Unlock()
		return
	}
	resp, reached, err := q.send(ctx, e.key, it)
	if ctx.Err() != nil {
		// Stopped, not failed: the next Run sends it again.
		q.mu.Lock()
		e.inflight = false
		ids, states := q.settle(e, reached)
		q.fix(e.order)
		q.mu.Unlock()
		q.saveStates(ids, states)
		return
	}
	if err != nil {
		q.failed(ctx, e, nil, err.Error(), reached, false)
		return
	}
	q.noteExpiry(e, resp)
	v, reason := q.classify(resp)
	switch v {
	case retry:
		q.failed(ctx, e, resp, fmt.Sprintf("the server answered %d %s", resp.Status, http.StatusText(resp.Status)), true, false)
	case done:
		it.State, it.Response = Done, resp
		q.end(ctx, e, it, nil)
	case dead:
		it.State, it.Response, it.Reason = Dead, resp, reason
		q.end(ctx, e, it, &end{reason: reason, resp: resp})
	}
}

// deadline returns when e's key may expire on the server less the
// margin, and from what that is known; zero if it cannot have reached
// the server yet.
func (q *Queue) deadline(e *entry) (time.Time, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case !e.st.expires.IsZero():
		return e.st.expires.Add(-q.cfg.margin), "the server forgets the key at " +
			e.st.expires.UTC().Format(time.RFC3339) + " (its " + q.cfg.expiresHeader + ")"
	case !e.st.sent.IsZero() && !e.speculative:
		return e.st.sent.Add(q.cfg.keyLifetime - q.cfg.margin), "the request may have reached the server at " +
			e.st.sent.UTC().Format(time.RFC3339) + ", which keeps keys for " + q.cfg.keyLifetime.String() + " (WithKeyLifetime)"
	}
	return time.Time{}, ""
}

// stopLate moves e to the dead letters because its next attempt would
// start after deadline.
func (q *Queue) stopLate(ctx context.Context, e *entry, why string, deadline time.Time) {
	it, err := q.read(e)
	if err != nil {
		q.mu.Lock()
		e.damaged, e.inflight = err, false
		q.mu.Unlock()
		return
	}
	reason := fmt.Sprintf("too late to retry: %s; the next attempt would start after %s (that less a margin of %v), "+
		"when a retry could run the request a second time", why, deadline.UTC().Format(time.RFC3339), q.cfg.margin)
	it.State, it.Reason = Dead, reason
	q.end(ctx, e, it, &end{reason: reason})
}

// markSent records, before e's attempt, that its request may reach the
// server from now on; with it the next items of its order that have no
// mark yet, in the same write.
func (q *Queue) markSent(e *entry, now time.Time) error {
	q.mu.Lock()
	if !e.st.sent.IsZero() {
		q.mu.Unlock()
		return nil
	}
	var marked []*entry
	var states []retryState
	for _, x := range e.order.items {
		if len(marked) == markWindow {
			break
		}
		if x.st.sent.IsZero() && x.damaged == nil {
			x.st.sent, x.speculative = now, true
			marked = append(marked, x)
			states = append(states, x.st)
		}
	}
	q.mu.Unlock()
	err := q.w.do(&op{apply: func(tx *bolt.Tx) error {
		for i, x := range marked {
			if err := saveState(tx, x.id, &states[i]); err != nil {
				return err
			}
		}
		return nil
	}})
	if err != nil {
		q.mu.Lock()
		for _, x := range marked {
			if x.st.sent.Equal(now) {
				x.st.sent, x.speculative = time.Time{}, false
			}
		}
		q.mu.Unlock()
	}
	return err
}

// saveState rewrites the retry state in the head of pending item id, if
// the item is still there and its head readable.
func saveState(tx *bolt.Tx, id uint64, st *retryState) error {
	b := tx.Bucket(bucketItems)
	old := b.Get(idKey(id))
	if old == nil {
		return nil
	}
	h, _, err := splitHead(old)
	if err != nil {
		return nil // damaged: leave it for the operator
	}
	st.setHead(h)
	return b.Put(idKey(id), headRecord(h))
}

// deletePending deletes both records of pending item id.
func deletePending(tx *bolt.Tx, id uint64) error {
	if err := tx.Bucket(bucketItems).Delete(idKey(id)); err != nil {
		return err
	}
	return tx.Bucket(bucketBodies).Delete(idKey(id))
}

// read returns the stored request of e.
func (q *Queue) read(e *entry) (*Item, error) {
	var it *Item
	err := guard(q.path, func() error {
		return q.db.View(func(tx *bolt.Tx) error {
			it = readPending(tx, e.id)
			if it == nil {
				return fmt.Errorf("%w: item %d is missing from the file", ErrCorrupt, e.id)
			}
			return it.Damaged
		})
	})
	return it, err
}

// send makes one attempt of it's request, and reports whether it
// connected to a server (else the request cannot have reached one).
func (q *Queue) send(ctx context.Context, key string, it *Item) (*Response, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.attemptTimeout)
	defer cancel()
	reached := false
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { reached = true },
	})
	req, err := q.newRequest(ctx, key, &head{method: it.Method, url: it.URL}, &body{header: it.Header, data: it.Body})
	if err != nil {
		return nil, false, err
	}
	if q.cfg.prepare != nil {
		if err := q.cfg.prepare(req); err != nil {
			return nil, false, fmt.Errorf("WithPrepare: %w", err)
		}
	}
	resp, err := q.cfg.transport.RoundTrip(req)
	if err != nil {
		return nil, reached, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(q.cfg.maxResponse)+1))
	if err != nil {
		return nil, true, fmt.Errorf("reading the answer (%d): %w", resp.StatusCode, err)
	}
	r := &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}
	if len(data) > q.cfg.maxResponse {
		r.Body, r.Truncated = data[:q.cfg.maxResponse], true
	}
	v := resp.Header.Values(q.cfg.replayHeader)
	r.Replayed = len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "true")
	return r, true, nil
}

// noteExpiry keeps the key's expiry that resp advertises, mapped to this
// machine's clock by the response's Date (both are the server's clock).
func (q *Queue) noteExpiry(e *entry, resp *Response) {
	t, err := http.ParseTime(resp.Header.Get(q.cfg.expiresHeader))
	if err != nil {
		return
	}
	if date, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		t = t.Add(q.cfg.now().Sub(date))
	}
	q.mu.Lock()
	e.st.expires = t
	q.mu.Unlock()
}

// failed schedules e's next attempt after a failed one, or stops it when
// that would come too late. After the handler failed (handler), it is
// never stopped here, since stopping tells the handler again: the next
// attempt comes at the latest after the longest backoff, and stops the
// item then if it is too late.
func (q *Queue) failed(ctx context.Context, e *entry, resp *Response, why string, reached, handler bool) {
	now := q.cfg.now()
	var hint time.Duration
	if resp != nil {
		hint, _ = edge.RetryAfter(resp.Header.Get("Retry-After"), now)
	}
	at, late := q.deadline(e)
	q.mu.Lock()
	if e.sched == nil {
		s := q.cfg.backoff.Start()
		e.sched = &s
	}
	wait, ok := e.sched.Next(hint, at)
	if !ok && (handler || at.IsZero()) {
		ok, wait = true, q.cfg.backoff.MaxBackoff
	}
	e.st.lastErr = why
	if ok {
		e.st.next = now.Add(wait)
	}
	ids, states := q.settle(e, reached)
	q.mu.Unlock()
	if !ok {
		q.stopLate(ctx, e, late, at)
		return
	}
	q.saveStates(ids, states)
	q.mu.Lock()
	e.inflight = false
	q.fix(e.order)
	q.mu.Unlock()
}

// settle notes after an attempt of e whether it connected to a server,
// and returns the states to write: e's, and those of the items whose
// marks are cleared. Called with q.mu held.
func (q *Queue) settle(e *entry, reached bool) ([]uint64, []retryState) {
	ids, states := []uint64{e.id}, []retryState{e.st}
	if reached {
		e.speculative = false
		return ids, states
	}
	if !e.speculative {
		return ids, states
	}
	// No attempt of e connected: nothing can have reached the server, so
	// its mark, and the marks made with it ahead of the items behind it,
	// are cleared.
	states[0].sent, e.st.sent, e.speculative = time.Time{}, time.Time{}, false
	for _, x := range e.order.items {
		if x != e && x.speculative && x.st.attempts == 0 {
			x.st.sent, x.speculative = time.Time{}, false
			ids, states = append(ids, x.id), append(states, x.st)
		}
	}
	return ids, states
}

// saveStates writes the retry states of items, without waiting.
func (q *Queue) saveStates(ids []uint64, states []retryState) {
	q.w.async(&op{apply: func(tx *bolt.Tx) error {
		for i, id := range ids {
			if err := saveState(tx, id, &states[i]); err != nil {
				return err
			}
		}
		return nil
	}})
}

// end tells the handler of it's end and then takes e out of the queue:
// removed when done, moved to the dead letters with x when dead. A
// handler's error keeps e, to be sent again.
func (q *Queue) end(ctx context.Context, e *entry, it *Item, x *end) {
	q.mu.Lock()
	it.Attempts, it.Sent, it.Expires, it.LastError = e.st.attempts, e.st.sent, e.st.expires, e.st.lastErr
	q.mu.Unlock()
	if h := q.cfg.onDone; h != nil {
		if err := h(ctx, it); err != nil {
			q.failed(ctx, e, it.Response, "WithOnDone: "+err.Error(), true, true)
			return
		}
	}
	id := e.id
	o := &op{apply: func(tx *bolt.Tx) error { return deletePending(tx, id) }}
	if x != nil {
		h := &head{key: it.Key, order: it.Order, method: it.Method, url: it.URL, enqueued: it.Enqueued}
		st := retryState{sent: it.Sent, expires: it.Expires, attempts: it.Attempts, lastErr: it.LastError}
		st.setHead(h)
		rec := deadRecord(h, &body{header: it.Header, data: it.Body}, x)
		o.apply = func(tx *bolt.Tx) error {
			if err := tx.Bucket(bucketDead).Put(idKey(id), rec); err != nil {
				return err
			}
			return deletePending(tx, id)
		}
		// A dead item's order goes on only once the move is on disk: a
		// crash must not find it pending again behind items sent after it.
		if err := q.w.do(o); err != nil {
			q.failed(ctx, e, it.Response, "could not move the item to the dead letters: "+err.Error(), true, true)
			return
		}
	} else {
		// Not waited for: a crash before the removal is on disk sends the
		// item again, and the server replays the same answer.
		q.w.async(o)
	}
	q.mu.Lock()
	e.inflight = false
	q.remove(e)
	q.mu.Unlock()
}
