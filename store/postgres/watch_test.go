package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// watchTimeout bounds how long a Watch may take to notice a change.
const watchTimeout = 5 * time.Second

// pidRecorder is an Options.ListenConnect that records the backend PID of
// every listener connection it opens.
type pidRecorder struct {
	url  string
	mu   sync.Mutex
	pids []uint32
}

func (r *pidRecorder) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.pids = append(r.pids, c.PgConn().PID())
	r.mu.Unlock()
	return c, nil
}

func (r *pidRecorder) list() []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint32(nil), r.pids...)
}

// waitFor polls cond every 10ms for up to watchTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(watchTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", watchTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// backendAlive reports whether the server has a backend with pid.
func backendAlive(t *testing.T, pool *pgxpool.Pool, pid uint32) bool {
	t.Helper()
	var alive bool
	if err := pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	return alive
}

// listening reports whether the backend pid LISTENs on channel: its last
// statement was the LISTEN (pg_listening_channels only shows one's own).
func listening(t *testing.T, pool *pgxpool.Pool, pid uint32, channel string) bool {
	t.Helper()
	var ok bool
	err := pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND query = $2)`,
		int32(pid), `LISTEN "`+channel+`"`).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func claimKey(t *testing.T, s *postgres.Store, key string, lease time.Duration) idempotency.Token {
	t.Helper()
	tok := idempotency.Token("tok-" + randomHex(8))
	res, err := s.Claim(t.Context(), idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: tok, Lease: lease, Grace: lease})
	if err != nil || res.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("claim %q: %+v, %v", key, res, err)
	}
	return tok
}

// watchAsync starts Watch(ctx, key) and returns the channel of its error.
func watchAsync(ctx context.Context, s *postgres.Store, key string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, key) }()
	return done
}

func TestWatchNeedsNotify(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	s := newStore(t, pool, nil)
	key := "k-" + randomHex(4)
	claimKey(t, s, key, time.Minute)
	err := s.Watch(t.Context(), key)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Watch without Notify: %v, want an error saying it cannot watch", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close without Notify: %v", err)
	}

	// A DB that is not a pool needs ListenConnect.
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	_, err = postgres.New(conn.Conn(), &postgres.Options{Notify: true})
	if !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Fatalf("New(*pgx.Conn, Notify) without ListenConnect: %v, want ErrInvalidArgument", err)
	}
	rec := &pidRecorder{url: testURL(t)}
	s2, err := postgres.New(conn.Conn(), &postgres.Options{Notify: true, ListenConnect: rec.connect})
	if err != nil {
		t.Fatalf("New(*pgx.Conn, Notify, ListenConnect): %v", err)
	}
	_ = s2.Close()
}

// TestWaitWithNotifyDoesNotPoll: a duplicate Do with WithWait on a Notify
// store claims once, sleeps in Watch until the first call completes, and
// claims once more to replay the result. The same scenario on a store
// without Notify polls, which the claim count shows.
func TestWaitWithNotifyDoesNotPoll(t *testing.T) {
	testPool(t, pgx.QueryExecModeCacheStatement) // the test schema
	for _, notify := range []bool{true, false} {
		t.Run(fmt.Sprintf("notify=%v", notify), func(t *testing.T) {
			var claims atomic.Int64
			cfg, err := pgxpool.ParseConfig(testURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.Tracer = claimCounter{&claims}
			cfg.MaxConns = 4
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s := newStore(t, pool, &postgres.Options{Notify: notify})
			defer s.Close()
			runner, err := idempotency.New(s, idempotency.WithLease(time.Minute), idempotency.WithWait(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			req := idempotency.Request{Key: "order-" + randomHex(4), Fingerprint: idempotency.FingerprintBytes([]byte("body"))}

			started, finish := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				_, err := idempotency.Do(t.Context(), runner, req, func(context.Context) (string, error) {
					close(started)
					<-finish
					return "first", nil
				})
				first <- err
			}()
			<-started
			if n := claims.Load(); n != 1 {
				t.Fatalf("%d claims before the duplicate, want 1", n)
			}

			type result struct {
				res idempotency.Result[string]
				err error
			}
			second := make(chan result, 1)
			go func() {
				res, err := idempotency.Do(t.Context(), runner, req, func(context.Context) (string, error) {
					return "second ran", nil
				})
				second <- result{res, err}
			}()
			waitFor(t, "the duplicate's claim", func() bool { return claims.Load() >= 2 })
			// Long enough for a polling waiter (10ms, doubling) to claim
			// several more times.
			time.Sleep(500 * time.Millisecond)
			close(finish)
			if err := <-first; err != nil {
				t.Fatalf("first Do: %v", err)
			}
			var got result
			select {
			case got = <-second:
			case <-time.After(watchTimeout):
				t.Fatalf("the waiting duplicate did not return within %v of the first's completion", watchTimeout)
			}
			if got.err != nil || got.res.Value != "first" || !got.res.Replayed {
				t.Fatalf("waiting duplicate: %+v, %v; want the first's result, replayed", got.res, got.err)
			}
			n := claims.Load()
			if notify && n != 3 {
				t.Errorf("%d claims in all, want 3: the first's, and the duplicate's before and after its wake-up (no polling)", n)
			}
			if !notify && n <= 3 {
				t.Errorf("%d claims in all without Notify; a polling waiter should have claimed more than twice (is the test still measuring?)", n)
			}
			t.Logf("claims: %d", n)
		})
	}
}

// claimCounter is a pgx tracer counting the claim statements sent: the
// plain read and insertion every claim starts with (ON CONFLICT (key) DO
// NOTHING), and the locking statement of the few that need it (DO UPDATE).
type claimCounter struct{ n *atomic.Int64 }

func (c claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "ON CONFLICT (key) DO ") {
		c.n.Add(1)
	}
	return ctx
}

func (claimCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestWatchListenerKilled: when the listener's backend is terminated,
// every waiter wakes (a spurious wake-up: nothing changed), and the store
// listens again on a new connection, through which a completion wakes the
// next waiter.
func TestWatchListenerKilled(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	rec := &pidRecorder{url: testURL(t)}
	s := newStore(t, pool, &postgres.Options{Notify: true, ListenConnect: rec.connect})
	defer s.Close()

	const keys, perKey = 5, 4
	var done []<-chan error
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i := range keys {
		key := fmt.Sprintf("killed-%d", i)
		claimKey(t, s, key, time.Minute)
		for range perKey {
			done = append(done, watchAsync(ctx, s, key))
		}
	}
	waitFor(t, "the listener", func() bool { return len(rec.list()) == 1 })
	pid := rec.list()[0]
	waitFor(t, "the LISTEN", func() bool { return listening(t, pool, pid, postgres.ChannelName(s)) })
	time.Sleep(200 * time.Millisecond) // let the waiters read the records
	for i, d := range done {
		select {
		case err := <-d:
			t.Fatalf("waiter %d returned (%v) before anything happened", i, err)
		default:
		}
	}

	var ok bool
	if err := pool.QueryRow(t.Context(), `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
	for i, d := range done {
		select {
		case err := <-d:
			if err != nil {
				t.Errorf("waiter %d after the listener was killed: %v, want a (spurious) wake-up", i, err)
			}
		case <-time.After(watchTimeout):
			t.Fatalf("waiter %d still waits %v after the listener's backend was killed", i, watchTimeout)
		}
	}

	// Recovery: a new waiter is woken by a completion through a new
	// connection.
	key := "after-kill"
	tok := claimKey(t, s, key, time.Minute)
	w := watchAsync(ctx, s, key)
	waitFor(t, "a new listener", func() bool { return len(rec.list()) == 2 })
	pid2 := rec.list()[1]
	if pid2 == pid {
		t.Fatalf("the new listener has the killed backend's pid %d", pid)
	}
	waitFor(t, "the new LISTEN", func() bool { return listening(t, pool, pid2, postgres.ChannelName(s)) })
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-w:
		t.Fatalf("Watch of an unchanged record returned: %v", err)
	default:
	}
	if err := s.Complete(t.Context(), key, tok, []byte("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w:
		if err != nil {
			t.Fatalf("Watch after completion on the new listener: %v", err)
		}
	case <-time.After(watchTimeout):
		t.Fatalf("Watch did not wake within %v of a completion after the listener reconnected", watchTimeout)
	}
}

// TestWatchManyWaiters: many goroutines watch many keys while others
// complete or release them; every waiter wakes, through one listener
// connection.
func TestWatchManyWaiters(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	rec := &pidRecorder{url: testURL(t)}
	s := newStore(t, pool, &postgres.Options{Notify: true, ListenConnect: rec.connect})
	defer s.Close()

	const keys, perKey = 30, 4
	toks := make([]idempotency.Token, keys)
	for i := range keys {
		toks[i] = claimKey(t, s, fmt.Sprintf("many-%d", i), time.Minute)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var changed [keys]atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, keys*perKey)
	for i := range keys {
		for range perKey {
			wg.Go(func() {
				// Spurious wake-ups are allowed: watch until the change.
				for {
					if err := s.Watch(ctx, fmt.Sprintf("many-%d", i)); err != nil {
						errs <- fmt.Errorf("key %d: %w", i, err)
						return
					}
					if changed[i].Load() {
						return
					}
				}
			})
		}
	}
	waitFor(t, "the listener", func() bool { return len(rec.list()) >= 1 })
	time.Sleep(200 * time.Millisecond)
	var changers sync.WaitGroup
	for i := range keys {
		changers.Go(func() {
			key := fmt.Sprintf("many-%d", i)
			changed[i].Store(true)
			var err error
			if i%2 == 0 {
				err = s.Complete(t.Context(), key, toks[i], []byte("r"), time.Minute)
			} else {
				err = s.Release(t.Context(), key, toks[i])
			}
			if err != nil {
				errs <- err
			}
		})
	}
	changers.Wait()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(2 * watchTimeout):
		t.Fatalf("waiters still wait %v after every key changed", 2*watchTimeout)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(rec.list()); n != 1 {
		t.Errorf("%d listener connections for %d waiters, want 1", n, keys*perKey)
	}
}

// TestWatchListenerStops: the listener's connection closes after the last
// waiter left (here after 50ms) and is opened again by the next Watch;
// Close closes it, wakes waiters, and later Watch calls fail.
func TestWatchListenerStops(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	rec := &pidRecorder{url: testURL(t)}
	s := newStore(t, pool, &postgres.Options{Notify: true, ListenConnect: rec.connect})
	postgres.SetListenIdle(s, 50*time.Millisecond)

	if err := s.Watch(t.Context(), "absent"); err != nil {
		t.Fatalf("Watch of an absent key: %v", err)
	}
	if n := len(rec.list()); n != 1 {
		t.Fatalf("%d listener connections after one Watch, want 1", n)
	}
	pid := rec.list()[0]
	waitFor(t, "the idle listener to disconnect", func() bool { return !backendAlive(t, pool, pid) })

	key := "closing"
	tok := claimKey(t, s, key, time.Minute)
	w := watchAsync(t.Context(), s, key)
	waitFor(t, "a new listener", func() bool { return len(rec.list()) == 2 })
	pid2 := rec.list()[1]
	waitFor(t, "the new LISTEN", func() bool { return listening(t, pool, pid2, postgres.ChannelName(s)) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w:
		if err != nil {
			t.Fatalf("Watch woken by Close: %v", err)
		}
	case <-time.After(watchTimeout):
		t.Fatalf("Watch still waits %v after Close", watchTimeout)
	}
	waitFor(t, "the closed listener to disconnect", func() bool { return !backendAlive(t, pool, pid2) })
	if err := s.Watch(t.Context(), key); err == nil {
		t.Fatal("Watch after Close returned nil, want an error")
	}
	// The store itself keeps working, and its DB is not closed.
	if err := s.Complete(t.Context(), key, tok, []byte("r"), time.Minute); err != nil {
		t.Fatalf("Complete after Close: %v", err)
	}
	_ = s.Close() // again: no-op
}

// TestWatchLeaseEnd: a record whose holder stops (no completion, no
// release, so no notification) wakes its waiter when the lease ends.
func TestWatchLeaseEnd(t *testing.T) {
	pool := testPool(t, pgx.QueryExecModeCacheStatement)
	s := newStore(t, pool, &postgres.Options{Notify: true})
	defer s.Close()
	key := "lease-end"
	claimKey(t, s, key, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), watchTimeout)
	defer cancel()
	if err := s.Watch(ctx, key); err != nil {
		t.Fatalf("Watch until the lease ends: %v", err)
	}
	// The lease has ended: a takeover succeeds.
	res, err := s.Claim(t.Context(), idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: "other", Lease: time.Minute, Grace: time.Minute})
	if err != nil || res.Outcome != idempotency.OutcomeAcquired || res.Attempt != 2 {
		t.Fatalf("takeover after Watch returned: %+v, %v", res, err)
	}
	// And the taker-over's completion, after its own claim, wakes the
	// next waiter... which returns at once since it is COMPLETED.
	if err := s.Complete(t.Context(), key, "other", []byte("r"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Watch(ctx, key); err != nil {
		t.Fatalf("Watch of a COMPLETED record: %v", err)
	}
}
