package queue

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// Errors of the queue, matched with errors.Is.
var (
	// ErrNotStored wraps the cause of an Enqueue that stored nothing
	// because the file could not be written (a full disk, a file size
	// limit, an I/O error): nothing of the request is in the queue.
	ErrNotStored = errors.New("queue: the request was not stored")
	// ErrCorrupt is wrapped by the errors that report damage to the file:
	// a record whose checksum is wrong, or a damaged page of the
	// database. The damaged items are named; the rest stay readable.
	ErrCorrupt = errors.New("queue: the file is damaged")
	// ErrLocked is returned by Open when another process has the queue
	// open.
	ErrLocked = errors.New("queue: the file is in use")
	// ErrClosed is returned by the methods of a closed queue.
	ErrClosed = errors.New("queue: closed")
	// ErrNotFound is returned for a key that is not in the queue.
	ErrNotFound = errors.New("queue: no item with this key")
	// ErrInFlight is returned by Drop for an item that is being sent; try
	// again once its attempt is over.
	ErrInFlight = errors.New("queue: the item is being sent")
	// ErrRunning is returned by Run when another Run of the queue runs.
	ErrRunning = errors.New("queue: already running")

	errNotQueue = errors.New("a bbolt database, but not a queue")
)

// State is where an item is.
type State uint8

// The states of an item. Never renumbered: they are shown to operators
// and written in their scripts' output.
const (
	// Pending items wait in the queue, to be sent or sent again.
	Pending State = 1
	// Done items got a definitive answer (2xx or a stored 4xx); the
	// handler is told, and the item is removed.
	Done State = 2
	// Dead items stopped without a definitive answer (422, 410, the key
	// about to expire); they stay in the dead letters, with the answer
	// that stopped them, until an operator retries or drops them.
	Dead State = 3
)

// String returns the state's name: "pending", "done" or "dead"
// ("unknown" for another value).
func (s State) String() string {
	switch s {
	case Pending:
		return "pending"
	case Done:
		return "done"
	case Dead:
		return "dead"
	}
	return "unknown"
}

// An Item is a request in the queue, with its key and what its attempts
// found so far.
type Item struct {
	// ID is the item's place in the queue: IDs increase in the order of
	// Enqueue, and are never reused.
	ID uint64
	// Key is the idempotency key sent with every attempt; it never
	// changes.
	Key string
	// Order is the ordering key: the items of one are sent one after the
	// other, in the order of their IDs. "" is the default order.
	Order string
	// State is where the item is.
	State State
	// Method, URL, Header and Body are the request as stored. Header has
	// no key header; Body is nil in listings.
	Method, URL string
	Header      http.Header
	Body        []byte
	// Enqueued is when Enqueue stored the item.
	Enqueued time.Time
	// Sent is when a request of the item may first have reached the
	// server (the start of the key's lifetime there), or zero.
	Sent time.Time
	// Expires is when the server forgets the key, as it advertised it
	// (mapped to this machine's clock), or zero.
	Expires time.Time
	// Next is when the next attempt is due, or zero for at once.
	Next time.Time
	// Attempts counts the attempts made (as last stored: the count of a
	// crashed process may be short).
	Attempts int
	// LastError is what the last failed attempt met, or "".
	LastError string
	// Reason says why a dead item stopped.
	Reason string
	// Response is the answer that ended the item: given to the handler,
	// and kept with a dead item (nil when none stopped it).
	Response *Response
	// Damaged is not nil when the item's record fails its checksum: the
	// fields it could not read are empty. A damaged item is never sent,
	// and the items of its order after it wait (those of every order
	// when its order cannot be read) until an operator drops it.
	Damaged error
}

// A Response is a server's answer to an item's request.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header is the response's header.
	Header http.Header
	// Body is the response's body, up to the queue's limit
	// ([WithMaxResponseSize]).
	Body []byte
	// Truncated reports that the body was longer than Body.
	Truncated bool
	// Replayed reports that the server replayed its stored answer to an
	// earlier request with the key (the replay header was "true").
	Replayed bool
}

// A Queue is a durable, ordered queue of HTTP requests in one file, each
// sent with an idempotency key made when it was enqueued (see the package
// documentation). Its methods may be called from many goroutines.
type Queue struct {
	cfg  config
	path string
	db   *bolt.DB
	w    *writer

	mu      sync.Mutex
	orders  map[string]*order
	byKey   map[string]*entry
	unknown []*entry // damaged items whose order cannot be read
	ready   readyHeap
	wake    chan struct{}
	running bool
	closed  bool
	stop    context.CancelFunc // of the running Run
}

// Open opens the queue in the file at path, creating it if it does not
// exist. Only one process may have a queue open: Open waits up to the
// lock timeout ([WithLockTimeout]) for another to close it, then returns
// an error wrapping [ErrLocked]. A file that is not a queue, or whose
// structure is damaged, gives an error wrapping [ErrCorrupt]; a damaged
// item does not: it is listed with its damage (see [Item.Damaged]).
// Invalid options give an error wrapping idempotency.ErrInvalidArgument,
// naming the option.
//
// Opening reads the index of every pending item (its key, order and
// retry state), not their requests: a queue of 10⁵ pending items of 1 KiB
// opens in well under a second.
func Open(path string, opts ...Option) (*Queue, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalidArg("nil option")
		}
		o.apply(&cfg)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalidArg("no file name")
	}
	db, err := openFile(path, cfg.lockTimeout)
	if err != nil {
		return nil, err
	}
	q := &Queue{
		cfg: cfg, path: path, db: db,
		orders: map[string]*order{}, byKey: map[string]*entry{},
		wake: make(chan struct{}, 1),
	}
	if err := q.load(); err != nil {
		db.Close()
		return nil, err
	}
	q.w = newWriter(db, path)
	return q, nil
}

// Path returns the queue's file name.
func (q *Queue) Path() string { return q.path }

// Close stops a running Run (waiting for its attempts), commits what is
// waiting to be written and closes the file.
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	stop := q.stop
	q.mu.Unlock()
	if stop != nil {
		stop()
	}
	// Wait for Run to notice.
	for {
		q.mu.Lock()
		running := q.running
		q.mu.Unlock()
		if !running {
			break
		}
		time.Sleep(time.Millisecond)
	}
	q.w.close()
	return q.db.Close()
}

// appendBucket returns the bucket name of tx, set to fill its pages: new
// IDs only ever go at its end, where bbolt's default (half full, for
// inserts in the middle) would leave half of every page empty.
func appendBucket(tx *bolt.Tx, name []byte) *bolt.Bucket {
	b := tx.Bucket(name)
	b.FillPercent = 1
	return b
}

// load builds the index of the pending items from the file.
func (q *Queue) load() error {
	err := guard(q.path, func() error {
		// Most opens find the file made: no write, no flush.
		ready := false
		q.db.View(func(tx *bolt.Tx) error {
			m := tx.Bucket(bucketMeta)
			ready = m != nil && string(m.Get(metaFormat)) == string(formatName) &&
				tx.Bucket(bucketItems) != nil && tx.Bucket(bucketBodies) != nil && tx.Bucket(bucketDead) != nil
			return nil
		})
		if ready {
			return nil
		}
		return q.db.Update(func(tx *bolt.Tx) error {
			m, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			switch f := m.Get(metaFormat); {
			case f == nil:
				if tx.Bucket(bucketItems) != nil {
					return fmt.Errorf("%w: no format name", errNotQueue)
				}
				if err := m.Put(metaFormat, formatName); err != nil {
					return err
				}
			case string(f) != string(formatName):
				return fmt.Errorf("%w: format %q, not %q", errNotQueue, f, formatName)
			}
			for _, b := range [][]byte{bucketItems, bucketBodies, bucketDead} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			return nil
		})
	})
	switch {
	case errors.Is(err, errNotQueue):
		return fmt.Errorf("%w: %s: not a queue file: %w", ErrCorrupt, q.path, err)
	case err != nil && !errors.Is(err, ErrCorrupt):
		return fmt.Errorf("queue: open %s: %w", q.path, err)
	case err != nil:
		return err
	}
	return guard(q.path, func() error {
		return q.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketItems).Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				id, ok := keyID(k)
				if !ok {
					continue
				}
				q.index(id, v)
			}
			return nil
		})
	})
}

// index adds the pending item of head record rec to the index. A damaged
// body is found when the item is read (sent, listed).
func (q *Queue) index(id uint64, rec []byte) {
	key, order, st, err := indexHead(rec)
	if err != nil {
		e := &entry{id: id, damaged: damage(id, err)}
		q.unknown = append(q.unknown, e)
		return
	}
	e := &entry{id: id, key: key, st: st}
	if o := q.orders[string(order)]; o != nil && len(o.items) > 0 {
		e.order = o
		o.items = append(o.items, e)
		q.byKey[key] = e
		return
	}
	q.add(e, string(order))
}

// add appends e to its order and to the index; e.id is the greatest ID
// of its order so far.
func (q *Queue) add(e *entry, orderKey string) {
	o := q.orders[orderKey]
	if o == nil {
		o = &order{key: orderKey, heap: -1}
		q.orders[orderKey] = o
	}
	e.order = o
	o.items = append(o.items, e)
	if e.key != "" {
		q.byKey[e.key] = e
	}
	if len(o.items) == 1 {
		q.push(o)
	}
}

// EnqueueOption configures one Enqueue.
type EnqueueOption interface{ applyEnqueue(*head) }

type enqueueFunc func(*head)

func (f enqueueFunc) applyEnqueue(h *head) { f(h) }

// InOrder puts the item in the order of key: it is sent after every
// earlier item of that order has ended, and items of other orders do not
// wait for it. Without it the item is in the default order "", so a queue
// whose items all lack it sends them one after the other.
func InOrder(key string) EnqueueOption {
	return enqueueFunc(func(h *head) { h.order = key })
}

// Enqueue stores req in the queue with a new idempotency key, and returns
// the key once the item is on disk (fsync'd): a crash after Enqueue
// returns loses nothing, and an error means nothing was stored. The key
// never changes: every attempt sends it, after restarts too, so the
// server runs the request at most once.
//
// The queue stores the request's method, URL, header (but the hop-by-hop
// ones, which belong to one connection, and Content-Length) and body.
// Mind that the header is stored as it is, credentials included: give
// those that must not be written to disk, or expire before a retry, in
// [WithPrepare].
//
// Enqueue refuses, with an error wrapping idempotency.ErrInvalidArgument
// and storing nothing: a request whose method needs no key (GET, or
// any method but those of [WithMethods]); a URL that is not absolute
// http or https with a host; a body that cannot be read again (a stream:
// set GetBody, as http.NewRequest does for a *bytes.Reader,
// *bytes.Buffer or *strings.Reader), or larger than [WithMaxBodySize];
// a request that already has a key header (the queue makes the key) or
// trailers.
func (q *Queue) Enqueue(req *http.Request, opts ...EnqueueOption) (string, error) {
	h, b, err := q.prepareRequest(req)
	if err != nil {
		return "", err
	}
	for _, o := range opts {
		if o == nil {
			return "", invalidArg("nil EnqueueOption")
		}
		o.applyEnqueue(h)
	}
	h.key = edge.NewKey()
	h.enqueued = q.cfg.now()
	hrec, brec := headRecord(h), bodyRecord(b)
	e := &entry{key: h.key}
	err = q.w.do(&op{
		apply: func(tx *bolt.Tx) error {
			bk, bodies := appendBucket(tx, bucketItems), appendBucket(tx, bucketBodies)
			id, err := bk.NextSequence()
			if err != nil {
				return err
			}
			e.id = id
			if err := bk.Put(idKey(id), hrec); err != nil {
				return err
			}
			return bodies.Put(idKey(id), brec)
		},
		committed: func() {
			q.mu.Lock()
			q.add(e, h.order)
			q.mu.Unlock()
			q.signal()
		},
	})
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrNotStored, q.path, err)
	}
	return h.key, nil
}

// signal wakes a waiting Run.
func (q *Queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
