package queue

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The operator's view: list the items, inspect one by its key, retry it
// now, drop it. These read the file (the operator's call pays for it, not
// the submitter); the command in cmd/queuectl is a shell over them.

// itemOf returns the Item of head h (nil if damaged) of item id.
func itemOf(id uint64, s State, h *head) *Item {
	it := &Item{ID: id, State: s}
	if h != nil {
		it.Key, it.Order, it.Method, it.URL = h.key, h.order, h.method, h.url
		it.Enqueued, it.Sent, it.Expires, it.Next = h.enqueued, h.sent, h.expires, h.next
		it.Attempts, it.LastError = h.attempts, h.lastErr
	}
	return it
}

// decodeDead decodes the record of dead item id. A damaged record gives
// an Item with Damaged set and what could be read.
func decodeDead(id uint64, rec []byte) *Item {
	h, rest, err := splitHead(rec)
	it := itemOf(id, Dead, h)
	if err != nil {
		it.Damaged = damage(id, err)
		return it
	}
	b, x, err := decodeRest(rest)
	if err == nil && x == nil {
		err = errDamaged
	}
	if err != nil {
		it.Damaged = damage(id, err)
	}
	if b != nil {
		it.Header, it.Body = b.header, b.data
	}
	if x != nil {
		it.Reason, it.Response = x.reason, x.resp
	}
	return it
}

// readPending reads pending item id, or returns nil if it is not there.
// A damaged record, or a damaged page on the way to it, gives an Item
// with Damaged set: the other items stay readable.
func readPending(tx *bolt.Tx, id uint64) (it *Item) {
	defer func() {
		if p := recover(); p != nil {
			if it == nil {
				it = &Item{ID: id, State: Pending}
			}
			it.Damaged = damage(id, fmt.Errorf("a page of the file on the way to it is damaged (%v)", p))
		}
	}()
	hrec := tx.Bucket(bucketItems).Get(idKey(id))
	if hrec == nil {
		return nil
	}
	h, rest, err := splitHead(hrec)
	if err == nil && len(rest) != 0 {
		err = errDamaged
	}
	it = itemOf(id, Pending, h)
	if err != nil {
		it.Damaged = damage(id, err)
		return it
	}
	brec := tx.Bucket(bucketBodies).Get(idKey(id))
	if brec == nil {
		it.Damaged = damage(id, errors.New("its body is missing"))
		return it
	}
	b, err := decodeBody(brec)
	if err != nil {
		it.Damaged = damage(id, err)
		return it
	}
	it.Header, it.Body = b.header, b.data
	return it
}

func bucketOf(s State) ([]byte, error) {
	switch s {
	case Pending:
		return bucketItems, nil
	case Dead:
		return bucketDead, nil
	}
	return nil, invalidArg("List: state %v: want Pending or Dead", s)
}

// List returns up to limit items in state (Pending or Dead) with IDs
// greater than after, in the order of their IDs, without their bodies;
// pass the last ID to get the next page. A limit of 0 or less means no
// limit. Damaged items are listed with [Item.Damaged] set.
func (q *Queue) List(state State, after uint64, limit int) ([]Item, error) {
	bk, err := bucketOf(state)
	if err != nil {
		return nil, err
	}
	if err := q.w.flush(); err != nil {
		return nil, err
	}
	var items []Item
	err = guard(q.path, func() error {
		return q.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bk).Cursor()
			for k, v := c.Seek(idKey(after + 1)); k != nil; k, v = c.Next() {
				if limit > 0 && len(items) >= limit {
					break
				}
				id, ok := keyID(k)
				if !ok || id <= after {
					continue
				}
				var it *Item
				if state == Dead {
					it = decodeDead(id, v)
				} else {
					it = readPending(tx, id)
				}
				it.Body = nil
				items = append(items, *it)
			}
			return nil
		})
	})
	q.overlay(items)
	return items, err
}

// overlay sets the pending items' retry state from the index, which is
// newer than the file's while the submitter runs.
func (q *Queue) overlay(items []Item) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range items {
		it := &items[i]
		if it.State != Pending || it.Key == "" {
			continue
		}
		if e := q.byKey[it.Key]; e != nil && e.id == it.ID {
			it.Sent, it.Expires, it.Next = e.st.sent, e.st.expires, e.st.next
			it.Attempts, it.LastError = e.st.attempts, e.st.lastErr
			if e.damaged != nil && it.Damaged == nil {
				it.Damaged = e.damaged
			}
		}
	}
}

// Len returns the numbers of pending and dead items.
func (q *Queue) Len() (pending, dead int, err error) {
	if err := q.w.flush(); err != nil {
		return 0, 0, err
	}
	err = guard(q.path, func() error {
		return q.db.View(func(tx *bolt.Tx) error {
			pending = tx.Bucket(bucketItems).Stats().KeyN
			dead = tx.Bucket(bucketDead).Stats().KeyN
			return nil
		})
	})
	return pending, dead, err
}

// Inspect returns the item with key, pending or dead, with its request
// and, for a dead one, the answer that stopped it. An unknown key gives
// [ErrNotFound].
func (q *Queue) Inspect(key string) (*Item, error) {
	it, _, err := q.find(key)
	return it, err
}

// find returns the item with key and its bucket. Pending items are found
// through the index; dead ones by a scan of the dead letters.
func (q *Queue) find(key string) (*Item, []byte, error) {
	if err := q.w.flush(); err != nil {
		return nil, nil, err
	}
	q.mu.Lock()
	e := q.byKey[key]
	q.mu.Unlock()
	var it *Item
	var bk []byte
	err := guard(q.path, func() error {
		return q.db.View(func(tx *bolt.Tx) error {
			if e != nil {
				if it = readPending(tx, e.id); it != nil {
					bk = bucketItems
					return nil
				}
			}
			c := tx.Bucket(bucketDead).Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				id, ok := keyID(k)
				if !ok {
					continue
				}
				if h, _, err := splitHead(v); err == nil && h.key == key {
					it = decodeDead(id, v)
					bk = bucketDead
					return nil
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, nil, err
	}
	if it == nil {
		return nil, nil, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if it.State == Pending {
		items := []Item{*it}
		q.overlay(items)
		*it = items[0]
	}
	return it, bk, nil
}

// Retry makes the item with key due now. A pending item is sent at once
// if its order lets it (its backoff starts again); a dead one goes back
// to the pending items, at its place in its order (before any later item
// of it still pending), with the same key: the server answers it as it
// would have, so a dead item whose key expired there may run again.
func (q *Queue) Retry(key string) error {
	it, bk, err := q.find(key)
	if err != nil {
		return err
	}
	if it.Damaged != nil {
		return fmt.Errorf("queue: retry %q: %w", key, it.Damaged)
	}
	if string(bk) == string(bucketItems) {
		q.mu.Lock()
		if e := q.byKey[key]; e != nil {
			e.st.next, e.sched = time.Time{}, nil
			if e.order != nil {
				q.fix(e.order)
			}
		}
		q.mu.Unlock()
		q.signal()
		return nil
	}
	id := it.ID
	e := &entry{id: id, key: key, st: retryState{sent: it.Sent, expires: it.Expires, attempts: it.Attempts, lastErr: it.LastError}}
	return q.w.do(&op{
		apply: func(tx *bolt.Tx) error {
			rec := tx.Bucket(bucketDead).Get(idKey(id))
			if rec == nil {
				return fmt.Errorf("%w: %q", ErrNotFound, key)
			}
			h, rest, err := splitHead(rec)
			if err != nil {
				return err
			}
			b, _, err := decodeRest(rest)
			if err != nil {
				return err
			}
			h.next = time.Time{}
			if err := tx.Bucket(bucketItems).Put(idKey(id), headRecord(h)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketBodies).Put(idKey(id), bodyRecord(b)); err != nil {
				return err
			}
			return tx.Bucket(bucketDead).Delete(idKey(id))
		},
		committed: func() {
			q.mu.Lock()
			q.insert(e, it.Order)
			q.mu.Unlock()
			q.signal()
		},
	})
}

// insert puts e back in its order at the place of its ID.
func (q *Queue) insert(e *entry, orderKey string) {
	o := q.orders[orderKey]
	if o == nil || len(o.items) == 0 || o.items[len(o.items)-1].id < e.id {
		q.add(e, orderKey)
		return
	}
	e.order = o
	i := 0
	for i < len(o.items) && (o.items[i].id < e.id || o.items[i].inflight) {
		i++ // never before the head in flight: one item of an order at a time
	}
	o.items = append(o.items, nil)
	copy(o.items[i+1:], o.items[i:])
	o.items[i] = e
	q.byKey[e.key] = e
	q.fix(o)
}

// Drop removes the item with key from the queue, pending or dead, without
// sending it again. A pending item in flight gives [ErrInFlight]. A
// damaged item is dropped by its ID with [Queue.DropID].
func (q *Queue) Drop(key string) error {
	it, bk, err := q.find(key)
	if err != nil {
		return err
	}
	return q.drop(it.ID, bk)
}

// DropID removes the item with ID id, pending or dead: the way to drop a
// damaged item, whose key may not be readable.
func (q *Queue) DropID(id uint64) error {
	if err := q.w.flush(); err != nil {
		return err
	}
	var bk []byte
	err := guard(q.path, func() error {
		return q.db.View(func(tx *bolt.Tx) error {
			for _, b := range [][]byte{bucketItems, bucketDead} {
				if tx.Bucket(b).Get(idKey(id)) != nil {
					bk = b
					return nil
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	if bk == nil {
		return fmt.Errorf("%w: no item %d", ErrNotFound, id)
	}
	return q.drop(id, bk)
}

func (q *Queue) drop(id uint64, bk []byte) error {
	q.mu.Lock()
	e := q.entryByID(id)
	if e != nil && e.inflight {
		q.mu.Unlock()
		return ErrInFlight
	}
	if e != nil {
		// Not sent from now on; removed from the index once the file
		// says so.
		e.inflight = true
		if e.order != nil {
			q.fix(e.order)
		}
	}
	q.mu.Unlock()
	err := q.w.do(&op{apply: func(tx *bolt.Tx) error {
		if string(bk) == string(bucketItems) {
			return deletePending(tx, id)
		}
		return tx.Bucket(bk).Delete(idKey(id))
	}})
	q.mu.Lock()
	if e != nil {
		e.inflight = false
		if err == nil {
			q.remove(e)
		} else if e.order != nil {
			q.fix(e.order)
		}
	}
	q.mu.Unlock()
	q.signal()
	return err
}

// entryByID returns the pending entry with id, or nil.
func (q *Queue) entryByID(id uint64) *entry {
	for _, e := range q.unknown {
		if e.id == id {
			return e
		}
	}
	for _, o := range q.orders {
		for _, e := range o.items {
			if e.id == id {
				return e
			}
		}
	}
	return nil
}
