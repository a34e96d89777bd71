package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// The file is a bbolt database with three buckets keyed by the item's ID
// (8 bytes, big endian: bbolt keeps keys sorted, so a cursor walks the
// queue in order): the pending items' heads, their bodies, and the dead
// letters. The values are records (record.go). A fourth bucket holds the
// format's name.
var (
	bucketItems  = []byte("items")
	bucketBodies = []byte("bodies")
	bucketDead   = []byte("dead")
	bucketMeta   = []byte("meta")
	metaFormat   = []byte("format")
	formatName   = []byte("exactlyonce-queue/1")
)

func idKey(id uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], id)
	return k[:]
}

func keyID(k []byte) (uint64, bool) {
	if len(k) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}

// guard runs fn, turning a panic or a memory fault of the database
// library, which is what a damaged page of the file gives (bbolt trusts
// its pages: it has no checksum but on its two meta pages), into an error
// wrapping ErrCorrupt.
func guard(path string, fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s: the file's structure is damaged (%v)", ErrCorrupt, path, p)
		}
	}()
	return fn()
}

// An op is one write to the file; one without apply is a flush. apply must fail only for reasons that
// fail its transaction (the disk, the file): everything that can be
// checked is checked before. committed, if set, runs after the commit, in
// the order of the ops, on the writer's goroutine.
type op struct {
	apply     func(tx *bolt.Tx) error
	committed func()
	done      chan error // nil: nobody waits
}

// writer is the file's one writer. It commits every op waiting when it
// starts a transaction in that one transaction (group commit: one fsync
// for all of them), so concurrent Enqueues, and the submitter's removals
// and marks, share the disk's flushes.
type writer struct {
	db   *bolt.DB
	path string
	ops  chan *op
	quit chan struct{}
	wg   sync.WaitGroup
	// mu orders the sends on ops before close: close takes it to set
	// closed, so no op is sent after the loop's last drain.
	mu     sync.RWMutex
	closed bool
	// retry holds ops that nobody waits for whose transaction failed;
	// they are applied again with the next batch.
	retry []*op
}

// maxBatch bounds the ops of one transaction.
const maxBatch = 1024

func newWriter(db *bolt.DB, path string) *writer {
	w := &writer{db: db, path: path, ops: make(chan *op, maxBatch), quit: make(chan struct{})}
	w.wg.Add(1)
	go w.loop()
	return w
}

// do commits o and waits for it.
func (w *writer) do(o *op) error {
	o.done = make(chan error, 1)
	if !w.send(o) {
		return ErrClosed
	}
	return <-o.done
}

// flush waits until every op sent before it is committed (or, for one
// nobody waits for that failed, set to be applied again).
func (w *writer) flush() error { return w.do(&op{}) }

// async commits o without waiting.
func (w *writer) async(o *op) { w.send(o) }

func (w *writer) send(o *op) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return false
	}
	w.ops <- o
	return true
}

// close commits what is waiting and stops the writer.
func (w *writer) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	close(w.quit)
	w.wg.Wait()
}

func (w *writer) loop() {
	defer w.wg.Done()
	for {
		var first *op
		select {
		case first = <-w.ops:
		case <-w.quit:
			// Commit what was sent before close.
			for {
				select {
				case o := <-w.ops:
					w.commit(append(w.retry, o))
				default:
					if len(w.retry) > 0 {
						w.commit(w.retry)
					}
					return
				}
			}
		}
		batch := append(w.retry, first)
		w.retry = nil
	drain:
		for len(batch) < maxBatch {
			select {
			case o := <-w.ops:
				batch = append(batch, o)
			default:
				break drain
			}
		}
		batch = w.linger(batch)
		w.commit(batch)
	}
}

// asyncLinger is how long a batch that nobody waits for (removals and
// retry states) waits for more ops before it is committed. Flushes are
// costly beyond their own time (on a shared virtual disk they slow every
// other process's I/O and network too), and such ops lose nothing by
// waiting: a crash before they are on disk sends the removed items again,
// and the server replays their answers.
const asyncLinger = 100 * time.Millisecond

// linger returns batch, grown by the ops that come within asyncLinger if
// none in it is waited for; an op that is waited for ends the wait.
func (w *writer) linger(batch []*op) []*op {
	for _, o := range batch {
		if o.done != nil {
			return batch
		}
	}
	t := time.NewTimer(asyncLinger)
	defer t.Stop()
	for len(batch) < maxBatch {
		select {
		case o := <-w.ops:
			batch = append(batch, o)
			if o.done != nil {
				return batch
			}
		case <-t.C:
			return batch
		case <-w.quit:
			return batch
		}
	}
	return batch
}

func (w *writer) commit(batch []*op) {
	w.retry = nil
	writes := false
	for _, o := range batch {
		writes = writes || o.apply != nil
	}
	if !writes {
		w.finish(batch, nil) // only flushes
		return
	}
	err := w.tx(batch)
	if err != nil && len(batch) > 1 && !errors.Is(err, ErrCorrupt) {
		// One op may be the cause: commit each alone, so that the others
		// are not failed for it.
		for _, o := range batch {
			w.finish([]*op{o}, w.tx([]*op{o}))
		}
		return
	}
	w.finish(batch, err)
}

func (w *writer) tx(batch []*op) error {
	return guard(w.path, func() error {
		return w.db.Update(func(tx *bolt.Tx) error {
			for _, o := range batch {
				if o.apply == nil {
					continue
				}
				if err := o.apply(tx); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

func (w *writer) finish(batch []*op, err error) {
	for _, o := range batch {
		if err == nil && o.committed != nil {
			o.committed()
		}
		if o.done != nil {
			o.done <- err
		} else if err != nil && !errors.Is(err, ErrCorrupt) {
			w.retry = append(w.retry, o)
		}
	}
}

// brokenFiles are the files whose opening panicked in this process, and
// the errors they gave.
var brokenFiles struct {
	sync.Mutex
	files []brokenFile
}

type brokenFile struct {
	fi  os.FileInfo
	err error
}

// openFile opens the database in path. bbolt panics, or faults, on some
// damaged files while it opens them (a freelist page that is not one, a
// file cut short); that is an error here. bbolt has mapped the file by
// then, and the mapping, which cannot be reached to be unmapped, keeps
// the file's lock until the process exits: a second Open of the same file
// in this process gives the first one's error again, not ErrLocked.
func openFile(path string, lockTimeout time.Duration) (*bolt.DB, error) {
	fi, statErr := os.Stat(path)
	if statErr == nil {
		brokenFiles.Lock()
		for _, b := range brokenFiles.files {
			if os.SameFile(b.fi, fi) {
				brokenFiles.Unlock()
				return nil, b.err
			}
		}
		brokenFiles.Unlock()
	}
	var f *os.File
	opts := &bolt.Options{
		Timeout: lockTimeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			var err error
			f, err = os.OpenFile(name, flag, perm)
			return f, err
		},
	}
	var db *bolt.DB
	err := guard(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, opts)
		return err
	})
	switch {
	case err == nil && errors.Is(statErr, os.ErrNotExist):
		// A new file: its name must be on disk too, or a power cut could
		// lose the whole queue with the items it acknowledged.
		if err := syncDir(filepath.Dir(path)); err != nil {
			db.Close()
			return nil, fmt.Errorf("queue: open %s: flushing its directory: %w", path, err)
		}
		return db, nil
	case err == nil:
		return db, nil
	case errors.Is(err, ErrCorrupt):
		if f != nil {
			if fi, serr := f.Stat(); serr == nil {
				brokenFiles.Lock()
				brokenFiles.files = append(brokenFiles.files, brokenFile{fi, err})
				brokenFiles.Unlock()
			}
			f.Close()
		}
		return nil, err
	}
	return nil, openError(path, err)
}

// syncDir flushes the directory dir, so that a new file's name in it is
// on disk.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// openError explains an error of bolt.Open.
func openError(path string, err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %s: another process has the queue open (its file is locked)", ErrLocked, path)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return fmt.Errorf("%w: %s: not a readable queue file: %w", ErrCorrupt, path, err)
	}
	return fmt.Errorf("queue: open %s: %w", path, err)
}
