package redis

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	goredis "github.com/redis/go-redis/v9"
)

// Two things in go-redis would let a store call outlive the deadline the
// caller gave it:
//
//   - By default (Options.ContextTimeoutEnabled false) go-redis ignores the
//     context's deadline in socket reads and writes: a server that accepts
//     connections but never answers holds a call for ReadTimeout (5s) per
//     attempt, and go-redis makes up to MaxRetries+1 (4) attempts.
//   - New connections are dialed on a goroutine of the pool, under a
//     context of its own, DialerRetries (5) times 100ms apart, for each of
//     those attempts: a closed port costs 1.6s before the store hears of
//     it, where the core wants to decide itself whether to try again. The
//     call waiting for the connection does give up when its context ends.
//
// So every store call hands go-redis a context of its own (a call), which
// ends with the caller's, and which the dial hook of the client that
// serves the call ends as soon as one of that client's dials fails. When
// the client does not honour deadlines, the call also runs on a goroutine
// of its own and the store returns when the caller's context is done,
// leaving go-redis to notice on its own.

// A call is the context one store operation hands go-redis: a child of the
// caller's context, which a [dialWatch] cancels, with the dial's error as
// cause, when a dial of the client serving the operation fails.
type call struct {
	context.Context // canceled at the end of the operation
	cancel          context.CancelCauseFunc
}

// dialFailed is the cause of a call canceled because a dial failed.
type dialFailed struct{ err error }

func (e *dialFailed) Error() string { return e.err.Error() }
func (e *dialFailed) Unwrap() error { return e.err }

// result is what a call of go-redis returns through its goroutine.
type result[T any] struct {
	v   T
	err error
}

// do runs f, the go-redis part of the operation on key, so that it ends
// when ctx does or when the server cannot be dialed:
//
//   - f gets a call, a child of ctx registered with the dial watch of the
//     client that serves key, which cancels it when one of that client's
//     dials fails (other than by a timeout, which ctx's deadline handles):
//     go-redis then stops waiting for a connection, and do returns the
//     dial's error.
//   - When ctx can end and the client might not notice (it ignores
//     deadlines in socket I/O, or ctx has no deadline but can be
//     canceled), f runs on another goroutine (see [spawn]), and do returns
//     ctx's error as soon as ctx is done. The abandoned goroutine ends when go-redis's own
//     timeouts end the socket operation it is in (ReadTimeout, 5s by
//     default); it sends nothing more, as go-redis checks the context
//     before every retry. Until then it holds one of the pool's
//     connections, so there are never more of them than the pool's size:
//     other calls wait for a connection under their own context and give
//     up with it.
//   - Otherwise (ctx never ends, or the client honours its deadline) f
//     runs on the caller's goroutine.
func do[T any](s *Store, ctx context.Context, key string, f func(ctx context.Context) (T, error)) (T, error) {
	c := new(call)
	c.Context, c.cancel = context.WithCancelCause(ctx)
	defer c.cancel(nil)
	run := func() (T, error) {
		w, err := s.dialWatch(c, key)
		if err != nil {
			var zero T
			return zero, err
		}
		if w != nil {
			w.add(c)
			defer w.remove(c)
		}
		return f(c)
	}
	if ctx.Done() == nil || s.honoursDeadlines && hasDeadline(ctx) {
		v, err := run()
		return v, callErr(ctx, c, err)
	}
	ch := make(chan result[T], 1)
	spawn(func() {
		v, err := run()
		ch <- result[T]{v, err}
	})
	select {
	case r := <-ch:
		return r.v, callErr(ctx, c, r.err)
	case <-c.Done():
		select {
		case r := <-ch: // finished meanwhile: keep its answer
			return r.v, callErr(ctx, c, r.err)
		default:
		}
		var zero T
		return zero, callErr(ctx, c, context.Cause(c))
	}
}

// spawn runs task on a goroutine: an idle worker when there is one,
// else a new goroutine, which becomes a worker when task returns. A worker
// waits workerIdle for its next task, then ends.
//
// A new goroutine per call costs more than the hand-off itself: it starts
// on a small stack that go-redis's deep call path makes grow, copying it,
// on every call. Measured on a loaded two-core machine, serially, a
// one-command script took 35-45µs longer on a new goroutine than on the
// caller's, and 5-12µs longer on a worker.
func spawn(task func()) {
	select {
	case idleWorkers <- task:
	default:
		workersStarted.Add(1)
		go worker(task)
	}
}

// workersStarted counts the goroutines spawn started (for tests).
var workersStarted atomic.Int64

// idleWorkers hands a task to an idle worker: a send succeeds only when
// one is waiting.
var idleWorkers = make(chan func())

// workerIdle is how long a worker waits for its next task before it ends,
// so that a store that is no longer used leaves no goroutine behind.
const workerIdle = 500 * time.Millisecond

func worker(task func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		task()
		task = nil // not kept alive while idle
		idle.Reset(workerIdle)
		select {
		case task = <-idleWorkers:
		case <-idle.C:
			return
		}
	}
}

// callErr is the error of an operation that got err from go-redis: the
// caller's context error when ctx is done, the dial's error when a failed
// dial ended the call (go-redis then reports the cancellation), else err.
func callErr(ctx context.Context, c *call, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	var d *dialFailed
	if errors.As(context.Cause(c), &d) {
		return d.err
	}
	return err
}

func hasDeadline(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok
}

// honoursDeadlines reports whether client bounds its socket I/O by the
// context's deadline (Options.ContextTimeoutEnabled, with socket
// deadlines not disabled: go-redis sets none at all for a timeout of -2,
// which its options hold as -1). Clients of unknown types are taken not
// to.
func honoursDeadlines(client Client) bool {
	switch c := client.(type) {
	case *goredis.Client: // also a failover (Sentinel) client
		o := c.Options()
		return boundsIO(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case *goredis.ClusterClient: // also a failover cluster client
		o := c.Options()
		return boundsIO(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case *goredis.Ring:
		o := c.Options()
		return boundsIO(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	}
	return false
}

// boundsIO reports whether go-redis bounds socket I/O by the context's
// deadline with these options.
func boundsIO(contextTimeout bool, read, write time.Duration) bool {
	return contextTimeout && read >= 0 && write >= 0
}

// boundedClone returns, for a client c that does not bound its socket I/O
// by the context's deadline, a clone of c that does: c.WithTimeout with
// c's own read timeout (the same connection pools and connections, and
// the hooks c has now, among them the store's dial watch), with
// ContextTimeoutEnabled set on the clone's own options. The store's calls
// then run on the caller's goroutine, without the hand-off to a worker
// that [do] needs otherwise, which cost 40-75 µs per call on the 2-core
// test machine (store/redis/README.md, "Bounded calls"). It returns nil
// when a clone cannot keep c's timeouts: WithTimeout sets the read and
// write timeouts to one value, and a negative one disables socket
// deadlines altogether. The caller checks first that c does not honour
// deadlines already.
func boundedClone(c *goredis.Client) *goredis.Client {
	o := c.Options()
	if o.ReadTimeout < 0 || o.WriteTimeout != o.ReadTimeout {
		return nil
	}
	b := c.WithTimeout(o.ReadTimeout)
	b.Options().ContextTimeoutEnabled = true
	return b
}

// dialWatch returns the dial watch of the client that serves key, adding
// it to that client on first use: the client itself (a single or failover
// client), the ring's shard of key, or the master of key's slot in a
// cluster (which it may load from the cluster; its error is the
// operation's). Other clients have none.
func (s *Store) dialWatch(ctx context.Context, key string) (*dialWatch, error) {
	switch c := s.client.(type) {
	case *goredis.Client:
		return s.watch, nil
	case *goredis.ClusterClient:
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return watchOf(n), nil
	case *goredis.Ring:
		if n, err := c.GetShardClientForKey(key); err == nil {
			return watchOf(n), nil
		}
	}
	return nil, nil
}

// A dialWatch is a go-redis hook on one client that cancels every store
// call in flight on that client when one of its dials fails, other than by
// a timeout: the server refuses connections (or cannot be reached, or its
// name does not resolve), and the store reports it at once, leaving
// retrying to its caller, instead of letting go-redis try again for 1.6s.
// A call in flight on a connection that still works is canceled too; its
// error leaves the outcome unknown, which a repeat with the same token
// resolves. It changes nothing for the client's other users, and adds
// nothing to commands and pipelines.
type dialWatch struct {
	mu    sync.Mutex
	calls map[*call]struct{}
}

func (w *dialWatch) add(c *call) {
	w.mu.Lock()
	w.calls[c] = struct{}{}
	w.mu.Unlock()
}

func (w *dialWatch) remove(c *call) {
	w.mu.Lock()
	delete(w.calls, c)
	w.mu.Unlock()
}

// DialHook implements goredis.Hook.
func (w *dialWatch) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && !isTimeout(err) {
			w.mu.Lock()
			for c := range w.calls {
				c.cancel(&dialFailed{err})
			}
			w.mu.Unlock()
		}
		return conn, err
	}
}

// ProcessHook implements goredis.Hook: it adds nothing.
func (w *dialWatch) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

// ProcessPipelineHook implements goredis.Hook: it adds nothing.
func (w *dialWatch) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// watches holds the dial watch of every client that has one, so that the
// stores on one client share one. Its keys are weak: a client that is no
// longer used is collected, and its entry deleted.
var watches sync.Map // weak.Pointer[goredis.Client] -> *dialWatch

// watchOf returns c's dial watch, adding it to c on first use.
func watchOf(c *goredis.Client) *dialWatch {
	p := weak.Make(c)
	if w, ok := watches.Load(p); ok {
		return w.(*dialWatch)
	}
	w, loaded := watches.LoadOrStore(p, &dialWatch{calls: make(map[*call]struct{})})
	if !loaded {
		c.AddHook(w.(*dialWatch))
		runtime.AddCleanup(c, func(p weak.Pointer[goredis.Client]) { watches.Delete(p) }, p)
	}
	return w.(*dialWatch)
}
