package queue

import (
	"net/http"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// WithClock sets the queue's clock (of backoffs, marks and deadlines).
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}

// WithMargin replaces ExpiryMargin.
func WithMargin(d time.Duration) Option {
	return optionFunc(func(c *config) { c.margin = d })
}

// BulkLoad appends n copies of req to the queue in file, spread over
// orders ordering keys, in a few large transactions: the fixture of the
// benchmarks, which would otherwise wait for n flushes.
func BulkLoad(file string, n, orders int, req *http.Request) error {
	q, err := Open(file)
	if err != nil {
		return err
	}
	defer q.Close()
	h, b, err := q.prepareRequest(req)
	if err != nil {
		return err
	}
	for done := 0; done < n; {
		batch := min(n-done, 10000)
		err := q.db.Update(func(tx *bolt.Tx) error {
			bk, bodies := appendBucket(tx, bucketItems), appendBucket(tx, bucketBodies)
			for i := range batch {
				id, err := bk.NextSequence()
				if err != nil {
					return err
				}
				h.key = edge.NewKey()
				h.order = strconv.Itoa((done + i) % orders)
				h.enqueued = time.Now()
				if err := bk.Put(idKey(id), headRecord(h)); err != nil {
					return err
				}
				if err := bodies.Put(idKey(id), bodyRecord(b)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		done += batch
	}
	return nil
}
