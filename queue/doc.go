// Package queue is a durable, ordered queue of HTTP requests for clients
// that retry hours later: a point-of-sale agent, a command that submits
// when the network is back, a service that must deliver calls to a
// partner API without running a database server. It is the client side
// of the library's server (package httpidem): an offline queue is
// idempotency in slow motion.
//
//	q, err := queue.Open("/var/lib/till/sales.queue", queue.WithOnDone(func(ctx context.Context, it *queue.Item) error {
//		return recordReceipt(it.Key, it.Response) // told at least once per item
//	}))
//	key, err := q.Enqueue(req) // on disk (fsync'd) with its key when it returns
//	go q.Run(ctx)              // sends, in order, until ctx is done
//
// # What it guarantees
//
//   - The key is made when the request is enqueued (a random UUID), stored
//     with it, and sent with every attempt, across restarts: it never
//     changes, so the server de-duplicates every retry and runs the request
//     once. Nothing is ever retried with a new key.
//   - Enqueue returns only once the item is on disk (the file is flushed,
//     fsync); an error means nothing was stored (a full disk, a file size
//     limit: [ErrNotStored]). A crash loses no acknowledged item.
//   - Items of one order (the default order "", or [InOrder]) are sent
//     one at a time, in the order of Enqueue: an item is sent only once
//     every earlier item of its order has ended, so none overtakes an
//     unfinished one. Items of different orders do not wait for each other
//     ([WithConcurrency] sends several at once).
//   - An item leaves the queue only after a definitive answer (2xx, 3xx, a
//     stored 4xx, any replayed answer) has been handed to the handler
//     ([WithOnDone]), or it stopped and went to the dead letters (422: the
//     key was used for another request; 410: the effect happened, its
//     answer was lost; the key would expire before the next attempt). The
//     handler is told at least once: a crash between the handler and the
//     removal sends the item again after the restart, and the server
//     replays the same answer (Response.Replayed).
//   - 409 (in progress), 5xx, 408, 429 and network errors are retried with
//     a capped, jittered, doubling backoff, waiting at least Retry-After.
//     A retry that would come after the key's expiry is not made: the
//     expiry the server advertises ([WithExpiresHeader], an HTTP-date
//     mapped to this machine's clock by the response's Date), or else
//     [WithKeyLifetime] after the request may first have reached the
//     server. An attempt that could not connect cannot have reached it, so
//     a client that is offline for days keeps its items.
//   - A damaged file is found, not trusted: every record carries a CRC-32C
//     checksum; a damaged item is named ([Item.Damaged]), never sent, and
//     the items of its order after it wait until an operator drops it; the
//     others go on. A file whose index (the items' heads) cannot be read
//     gives an error wrapping [ErrCorrupt] at Open, never a crash.
//
// # The file
//
// The queue is a bbolt database (go.etcd.io/bbolt, the B+tree file store
// of etcd): pure Go, one file, nothing to run, and one small dependency.
// Each transaction is copy-on-write and committed by flushing the file
// (fdatasync) before its meta page, of which there are two, each with a
// checksum, so a crash leaves the last committed state. Its keys are
// ordered, which is the queue's order. SQLite through a pure-Go driver
// (modernc.org/sqlite) was the other choice: it checks its pages, which
// bbolt does not (the queue checksums its records instead), but it is a
// C library translated to Go, about ten modules, and minutes to build
// under the race detector on a small machine.
//
// A pending item is two records: its head (key, order, method, URL and
// retry state, about 150 bytes) and its body (header and request body).
// Open reads the heads only; a retry rewrites its head only. Concurrent
// writes share flushes: Enqueues from many goroutines, and the
// submitter's removals, which also wait a little for company. Before an
// item's first attempt the submitter records that it may reach the
// server from then on, for the next items of its order in the same write.
//
// # Limits
//
//   - One process has the queue open at a time (the file is locked): the
//     operator's command (cmd/queuectl) works on a stopped client's file;
//     a running client offers the same view through [Queue.List],
//     [Queue.Inspect], [Queue.Retry] and [Queue.Drop].
//   - The request is stored as it is, its header included: give
//     credentials that must not be written to disk, or that expire before a
//     retry, in [WithPrepare].
//   - A restart starts an item's backoff again from its minimum; its
//     attempts, last error, advertised expiry and next attempt time are
//     kept.
//   - bbolt never shrinks its file: the space of removed items is reused,
//     not returned.
//   - Without an advertised expiry, the queue assumes the server keeps a
//     key for [DefaultKeyLifetime] (the library's default retention): set
//     [WithKeyLifetime] to the server's retention if it is shorter.
package queue
