package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5"
)

// errNoNotify is returned by Watch when notifications are off.
var errNoNotify = errors.New("postgres: Watch needs Options.Notify")

// errClosed is returned by Watch after [Store.Close].
var errClosed = errors.New("postgres: Watch after Close")

// Timings of the listener.
const (
	// listenIdle is how long the listener's connection stays open after
	// the last waiter left, so that a burst of waits shares one connection
	// instead of connecting for each.
	listenIdle = 5 * time.Second
	// listenConnectTimeout bounds one attempt to connect and LISTEN.
	listenConnectTimeout = 10 * time.Second
	// listenBackoffMin and listenBackoffMax bound the pause between
	// attempts to connect after a failure.
	listenBackoffMin = 50 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// keyHash is the notification payload for a storage key: 16 hex digits
// (64 bits of SHA-256). Keys can be 1 KiB and payloads are limited to 8000
// bytes; a collision of two keys only wakes a waiter spuriously.
func keyHash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:8])
}

// channelName is the notification channel of the table: its name, then 8
// hex digits of a hash of its qualified name, so that tables of the same
// name in different schemas use different channels. At most 57 bytes, under
// PostgreSQL's 63.
func channelName(o Options) string {
	h := sha256.Sum256([]byte(o.Schema + "." + o.Table))
	return o.Table + "_" + hex.EncodeToString(h[:4])
}

// Watch implements [idempotency.Watcher]: it returns nil when the record
// under key completes, is released, is not a live STARTED record any more,
// or its lease ends; and ctx's error when ctx is done first. It needs
// [Options.Notify]; without it, it returns an error at once and callers
// poll.
//
// Watch subscribes to the store's listener (one connection per store,
// LISTENing on the table's channel, opened on the first Watch and closed
// a few seconds after the last one returns, or by [Store.Close]) and then
// reads the record: a record that is already not STARTED, or whose lease
// has ended, returns at once, so a change between the caller's claim and
// the subscription is not missed. Complete and Release notify from the
// same statement that changes the row. When the listener's connection is
// lost, every waiter is woken (a spurious wake-up: the caller claims again
// and finds out) and the listener reconnects. A connection that dies
// without the client noticing (no TCP reset) is only found by TCP
// keepalive; until then waiters still wake when the lease they wait on
// ends.
//
// Watch reads the record through the store's DB, so waiters running at
// the same time need a DB safe for concurrent use (a *pgxpool.Pool).
func (s *Store) Watch(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.listener == nil {
		return errNoNotify
	}
	l := s.listener
	h := keyHash(key)
	w, a, err := l.subscribe(h)
	if err != nil {
		return err
	}
	defer l.unsubscribe(h, w)

	// Wait until the listener LISTENs: only then is a change after the
	// read below sure to be notified.
	select {
	case <-a.done:
		if errors.Is(a.err, errClosed) {
			return nil // woken by Close before the listener listened
		}
		if a.err != nil {
			return wrapErr(ctx, "watch: listen", a.err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}

	var leftMicros int64
	err = s.db.QueryRow(ctx, s.sql.leaseLeft, key).Scan(&leftMicros)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // absent, expired or COMPLETED
	}
	if err != nil {
		return wrapErr(ctx, "watch", err)
	}
	if leftMicros <= 0 {
		return nil // the lease has ended: the caller may take over
	}
	// A lease's end notifies nobody: wake when it ends.
	timer := time.NewTimer(time.Duration(leftMicros) * time.Microsecond)
	defer timer.Stop()
	select {
	case <-w.wake:
		return nil
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the listener that [Store.Watch] started, closing its
// connection, and wakes the waiters; Watch then returns an error at once
// (and callers poll). It does not close the store's DB, and every other
// method keeps working. Close is safe to call more than once and on a
// store without [Options.Notify], where it does nothing.
func (s *Store) Close() error {
	if s.listener != nil {
		s.listener.close()
	}
	return nil
}

// listener is a store's one LISTEN connection, shared by all its waiters.
// It runs (a session) while someone waits, and listenIdle longer.
type listener struct {
	connect   func(context.Context) (*pgx.Conn, error)
	listen    string        // the LISTEN statement
	idleAfter time.Duration // listenIdle; tests shorten it

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // by key hash
	count   int
	sess    *session    // nil when not running
	idle    *time.Timer // stops the session when nobody waits
	closed  bool
}

// waiter is one Watch call.
type waiter struct {
	wake chan struct{} // buffered: a notification never blocks the listener
}

// session is one run of the listener's goroutine: it connects, LISTENs and
// delivers notifications until it is stopped, reconnecting when the
// connection is lost.
type session struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned
	ready  *attempt      // the current connection attempt
}

// attempt is one connection of a session: done is closed once it LISTENs
// (err nil) or failed (err set).
type attempt struct {
	done chan struct{}
	err  error
}

func newListener(channel string, connect func(context.Context) (*pgx.Conn, error)) *listener {
	return &listener{
		connect:   connect,
		listen:    `LISTEN "` + channel + `"`,
		idleAfter: listenIdle,
		waiters:   map[string]map[*waiter]struct{}{},
	}
}

// subscribe registers a waiter for hash, starting the listener if it is
// not running, and returns the connection attempt to wait for.
func (l *listener) subscribe(hash string) (*waiter, *attempt, error) {
	w := &waiter{wake: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, errClosed
	}
	set := l.waiters[hash]
	if set == nil {
		set = map[*waiter]struct{}{}
		l.waiters[hash] = set
	}
	set[w] = struct{}{}
	l.count++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.sess == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l.sess = &session{cancel: cancel, done: make(chan struct{}), ready: newAttempt()}
		go l.run(ctx, l.sess)
	}
	return w, l.sess.ready, nil
}

func newAttempt() *attempt { return &attempt{done: make(chan struct{})} }

// unsubscribe removes w; the last waiter to leave schedules the
// listener's stop.
func (l *listener) unsubscribe(hash string, w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if set := l.waiters[hash]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(l.waiters, hash)
		}
	}
	l.count--
	if l.count == 0 && l.sess != nil && l.idle == nil {
		l.idle = time.AfterFunc(l.idleAfter, l.stopIdle)
	}
}

// stopIdle stops the session if nobody has come to wait since the idle
// timer was set.
func (l *listener) stopIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idle = nil
	if l.count == 0 && l.sess != nil {
		l.sess.cancel()
		l.sess = nil
	}
}

// close stops the session for good, waits for its goroutine and wakes
// every waiter.
func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	sess := l.sess
	l.sess = nil
	if sess != nil {
		sess.cancel()
	}
	l.wakeAllLocked()
	l.mu.Unlock()
	if sess != nil {
		<-sess.done
	}
}

func (l *listener) wakeAllLocked() {
	for _, set := range l.waiters {
		for w := range set {
			wakeUp(w)
		}
	}
}

func wakeUp(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default: // already woken
	}
}

// deliver wakes the waiters of hash.
func (l *listener) deliver(hash string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters[hash] {
		wakeUp(w)
	}
}

// run connects, LISTENs and delivers notifications until ctx is done. When
// the connection is lost it wakes every waiter (they cannot know what they
// missed) and connects again, with a growing pause after failures.
func (l *listener) run(ctx context.Context, sess *session) {
	defer close(sess.done)
	// A stopped session fails the attempt its waiters may still wait for.
	defer func() {
		l.mu.Lock()
		select {
		case <-sess.ready.done:
		default:
			sess.ready.err = errClosed
			close(sess.ready.done)
		}
		l.mu.Unlock()
	}()
	backoff := listenBackoffMin
	for {
		conn, err := l.dial(ctx)
		if err != nil && ctx.Err() != nil {
			err = errClosed // stopped while connecting
		}
		l.mu.Lock()
		a := sess.ready
		a.err = err
		close(a.done)
		if err != nil {
			sess.ready = newAttempt() // the next waiters wait for the next one
		}
		l.mu.Unlock()
		if err != nil {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, listenBackoffMax)
			continue
		}
		backoff = listenBackoffMin

		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				break
			}
			l.deliver(n.Payload)
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// Lost: notifications may have been missed. Every waiter checks
		// again; new ones wait for the next connection.
		l.mu.Lock()
		sess.ready = newAttempt()
		l.wakeAllLocked()
		l.mu.Unlock()
	}
}

// dial opens a connection and LISTENs on it.
func (l *listener) dial(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, listenConnectTimeout)
	defer cancel()
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, fmt.Errorf("%w: postgres: Options.ListenConnect returned a nil connection", idempotency.ErrInvalidArgument)
	}
	if _, err := conn.Exec(ctx, l.listen); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		ccancel()
		return nil, err
	}
	return conn, nil
}
