package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// An event reaches the sender with what was enqueued, its first attempt
// and the enqueue time, and is marked delivered.
func TestDeliverFields(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	rec := newRecorder()
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
	before := time.Now()
	ev := outbox.Event{ID: "order-1-created", Topic: "orders", Key: "order-1", Payload: []byte(`{"total":1000}`),
		Headers: map[string]string{"traceparent": "00-abc-def-01", "content-type": "application/json"}}
	enqueue(t, pool, tb, 1, []outbox.Event{ev})
	waitFor(t, 10*time.Second, "the delivery", func() bool { return len(rec.delivered()) == 1 })
	m := rec.delivered()[0]
	if m.ID != ev.ID || m.Topic != ev.Topic || m.Key != ev.Key || string(m.Payload) != string(ev.Payload) ||
		len(m.Headers) != 2 || m.Headers["traceparent"] != "00-abc-def-01" || m.Attempt != 1 {
		t.Fatalf("delivered %+v, want %+v at attempt 1", m, ev)
	}
	if d := m.EnqueuedAt.Sub(before); d < -time.Minute || d > time.Minute {
		t.Errorf("EnqueuedAt %v, enqueued at about %v", m.EnqueuedAt, before)
	}
	waitFor(t, 5*time.Second, "the row marked delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM "+qualified(tb)+" WHERE state = 'delivered' AND done_at IS NOT NULL AND attempts = 1") == 1
	})
}

// countingSender counts its relay's deliveries and passes them on.
type countingSender struct {
	next outbox.Sender
	n    atomic.Int64
}

func (s *countingSender) Send(ctx context.Context, m outbox.Message) error {
	err := s.next.Send(ctx, m)
	if err == nil {
		s.n.Add(1)
	}
	return err
}

// listeners counts the connections LISTENing on tb's channel.
func listeners(t testing.TB, pool *pgxpool.Pool, tb *outbox.Table) int {
	return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`, `LISTEN "`+outbox.Channel(tb)+`"`)
}

// Four relays, started before two producers enqueue 10,000 events, deliver
// every one at least once and lose none, each with one LISTEN connection,
// and they share the work.
func TestFourRelaysDeliverTenThousand(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	rec := newRecorder()
	senders := make([]*countingSender, 4)
	for i := range senders {
		senders[i] = &countingSender{next: rec}
		start(t, newRelay(t, tb, senders[i], outbox.RelayOptions{}))
	}
	waitFor(t, 10*time.Second, "four LISTEN connections", func() bool { return listeners(t, pool, tb) == 4 })

	const n = 10_000
	evs := events(n, nil)
	t0 := time.Now()
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() { enqueue(t, pool, tb, 100, evs[p*n/2:(p+1)*n/2]) })
	}
	wg.Wait()
	enqueued := time.Since(t0)
	waitFor(t, 60*time.Second, "10,000 distinct deliveries", func() bool { return rec.distinct() == n })
	took := time.Since(t0)

	want := map[string]bool{}
	for _, e := range evs {
		want[e.ID] = true
	}
	got := rec.delivered()
	for _, m := range got {
		if !want[m.ID] {
			t.Fatalf("delivered an event never enqueued: %q", m.ID)
		}
	}
	// A send is recorded after it returns.
	waitFor(t, 10*time.Second, "10,000 rows marked delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM "+qualified(tb)+" WHERE state = 'delivered'") == n
	})
	shares := make([]int64, len(senders))
	for i, s := range senders {
		shares[i] = s.n.Load()
		if shares[i] == 0 {
			t.Errorf("relay %d delivered nothing: the relays do not share the work (%v)", i, shares)
		}
	}
	t.Logf("10,000 events: enqueued in %v, all delivered after %v; %d sends (%d duplicates); per relay %v",
		enqueued.Round(time.Millisecond), took.Round(time.Millisecond), len(got), len(got)-n, shares)
}

// An event enqueued in a transaction that rolls back is never delivered,
// while one committed after it is.
func TestRolledBackEventNeverDelivered(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	rec := newRecorder()
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Enqueue(ctx, tx, outbox.Event{ID: "rolled-back", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the relay polls meanwhile: the row is not visible
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, tb, 1, []outbox.Event{{ID: "committed", Key: "k"}})
	waitFor(t, 10*time.Second, "the committed event", func() bool { return len(rec.delivered()) == 1 })
	time.Sleep(300 * time.Millisecond) // a few more polls
	for _, m := range rec.delivered() {
		if m.ID != "committed" {
			t.Fatalf("delivered %q", m.ID)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM "+qualified(tb)+" WHERE event_id = 'rolled-back'"); n != 0 {
		t.Fatalf("%d rows of the rolled-back event", n)
	}
}

// terminate kills the backends of pg_stat_activity that match where (and
// only those: the pids are selected first, then terminated one by one, so
// that no plan can run pg_terminate_backend on a row the filter would
// have dropped), and returns how many it killed.
func terminate(t testing.TB, pool *pgxpool.Pool, where string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND "+where, args...)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pid := range pids {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			n++
		}
	}
	return n
}

// killableDB is a relay's database handle that can be made to fail every
// call from one moment on, as a relay process that died would.
type killableDB struct {
	pool   *pgxpool.Pool
	killed atomic.Bool
}

var errKilled = errors.New("killed")

func (k *killableDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if k.killed.Load() {
		return pgconn.CommandTag{}, errKilled
	}
	return k.pool.Exec(ctx, sql, args...)
}

func (k *killableDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if k.killed.Load() {
		return nil, errKilled
	}
	return k.pool.Query(ctx, sql, args...)
}

func (k *killableDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if k.killed.Load() {
		return errRow{}
	}
	return k.pool.QueryRow(ctx, sql, args...)
}

type errRow struct{}

func (errRow) Scan(...any) error { return errKilled }

// blockingSender signals on first when it gets its first event, and then
// blocks every send until its context is done.
type blockingSender struct {
	once  sync.Once
	first chan outbox.Message
}

func newBlockingSender() *blockingSender { return &blockingSender{first: make(chan outbox.Message, 1)} }

func (s *blockingSender) Send(ctx context.Context, m outbox.Message) error {
	s.once.Do(func() { s.first <- m })
	<-ctx.Done()
	return ctx.Err()
}

// A relay stopped in the middle of a batch leaves nothing undelivered:
// another relay delivers its batch.
//
//   - canceled: its context is canceled while it sends. It counts the
//     interrupted send as an attempt and releases the rest, so the other
//     relay takes the whole batch at once, long before the lease ends.
//   - terminated: its database connections are killed with
//     pg_terminate_backend and it can reach the database no more (a
//     crashed process). Its batch stays leased until the lease ends, then
//     the other relay claims it, as a second attempt.
//   - terminated on the last attempt: with MaxAttempts 1 the claim after
//     the lease dead-letters the events instead, saying why.
func TestRelayKilledMidBatch(t *testing.T) {
	const n = 50
	t.Run("canceled", func(t *testing.T) {
		pool := testPool(t)
		tb := newTable(t, pool, nil)
		evs := events(n, nil)
		enqueue(t, pool, tb, n, evs)
		bs := newBlockingSender()
		stopA := start(t, newRelay(t, tb, bs, outbox.RelayOptions{BatchSize: n}))
		first := <-bs.first

		rec := newRecorder()
		start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
		time.Sleep(300 * time.Millisecond)
		if got := len(rec.delivered()); got != 0 {
			t.Fatalf("relay B delivered %d events of relay A's leased batch", got)
		}
		t0 := time.Now()
		if err := stopA(); err != nil {
			t.Fatalf("relay A's Run returned %v, want nil (stopped)", err)
		}
		waitFor(t, 10*time.Second, "relay B to deliver relay A's batch", func() bool { return rec.distinct() == n })
		if d := time.Since(t0); d > outbox.DefaultLease/2 {
			t.Errorf("took %v: the batch was not released", d)
		}
		for _, m := range rec.delivered() {
			want := 1
			if m.ID == first.ID {
				want = 2 // relay A's interrupted send counted
			}
			if m.Attempt != want {
				t.Errorf("event %s delivered at attempt %d, want %d", m.ID, m.Attempt, want)
			}
		}
	})

	for _, lastAttempt := range []bool{false, true} {
		name := "terminated"
		if lastAttempt {
			name = "terminated on the last attempt"
		}
		t.Run(name, func(t *testing.T) {
			pool := testPool(t)
			tb := newTable(t, pool, nil)
			evs := events(n, nil)
			enqueue(t, pool, tb, n, evs)
			maxAttempts := 5
			if lastAttempt {
				maxAttempts = 1
			}
			const lease = 3 * time.Second
			app := "outbox-relay-" + randomHex(4)
			poolA := ownPool(t, pgx.QueryExecModeCacheStatement, 2, app)
			dbA := &killableDB{pool: poolA}
			fast := &outbox.Options{Table: outbox.TableName(tb), Timeout: time.Second}
			tbA := tableOn(t, dbA, fast)
			bs := newBlockingSender()
			stopA := start(t, newRelay(t, tbA, bs, outbox.RelayOptions{
				BatchSize: n, Lease: lease, SendTimeout: 500 * time.Millisecond, MaxAttempts: maxAttempts,
				ListenConnect: func(ctx context.Context) (*pgx.Conn, error) {
					return pgx.ConnectConfig(ctx, poolA.Config().ConnConfig)
				},
			}))
			<-bs.first
			claimedBy := time.Now()

			// The crash: no more statements, connections killed, gone.
			dbA.killed.Store(true)
			if k := terminate(t, pool, "application_name = $1", app); k == 0 {
				t.Fatalf("no connection of relay A (application_name %s) to terminate", app)
			}
			_ = stopA()
			if k := count(t, pool, "SELECT count(*) FROM "+qualified(tb)+" WHERE state = 'pending' AND available_at > clock_timestamp()"); k != n {
				t.Fatalf("%d events leased after relay A died, want its whole batch, %d", k, n)
			}

			rec := newRecorder()
			tbB := tableOn(t, pool, fast)
			start(t, newRelay(t, tbB, rec, outbox.RelayOptions{MaxAttempts: maxAttempts, Lease: lease, SendTimeout: 500 * time.Millisecond}))
			if lastAttempt {
				dead := waitDead(t, tbB, n)
				if len(rec.delivered()) != 0 {
					t.Errorf("delivered %d events whose attempts were used up", len(rec.delivered()))
				}
				if d := dead[0]; d.Attempt != 1 || !strings.Contains(d.LastError, "attempt 1 ended without an outcome") {
					t.Errorf("dead letter: attempt %d, last error %q", d.Attempt, d.LastError)
				}
				return
			}
			waitFor(t, 15*time.Second, "relay B to deliver relay A's batch", func() bool { return rec.distinct() == n })
			if d := time.Since(claimedBy); d < lease/2 {
				t.Errorf("relay B delivered the batch %v after relay A claimed it, before its lease (%v) ended", d, lease)
			}
			for _, m := range rec.delivered() {
				if m.Attempt != 2 {
					t.Errorf("event %s delivered at attempt %d, want 2 (relay A's claim counts)", m.ID, m.Attempt)
				}
			}
		})
	}
}

// Events of one ordering key are delivered in order, one at a time,
// under four relays sending in parallel, while the sender fails a fifth of
// the attempts (so heads back off and hold their keys).
func TestOrderingPerKeyFourRelays(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	const keys, perKey = 20, 50
	var (
		mu       sync.Mutex
		next     = map[string]int{} // next sequence number expected per key
		inflight = map[string]int{}
		bad      []string
		failures atomic.Int64
	)
	sender := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		mu.Lock()
		inflight[m.Key]++
		if inflight[m.Key] > 1 {
			bad = append(bad, fmt.Sprintf("two events of key %s in flight at once", m.Key))
		}
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		fail := rand.IntN(5) == 0
		mu.Lock()
		defer mu.Unlock()
		inflight[m.Key]--
		if fail {
			failures.Add(1)
			return errors.New("transient")
		}
		seq, _ := strconv.Atoi(string(m.Payload))
		if seq != next[m.Key] {
			bad = append(bad, fmt.Sprintf("key %s: delivered %d, expected %d", m.Key, seq, next[m.Key]))
		}
		next[m.Key] = seq + 1
		return nil
	})
	for range 4 {
		start(t, newRelay(t, tb, sender, outbox.RelayOptions{BatchSize: 10, Parallelism: 4, MaxAttempts: 1000}))
	}
	evs := make([]outbox.Event, 0, keys*perKey)
	for i := range perKey {
		for k := range keys {
			evs = append(evs, outbox.Event{Key: fmt.Sprintf("key-%02d", k), Payload: []byte(strconv.Itoa(i))})
		}
	}
	enqueue(t, pool, tb, 60, evs)
	waitFor(t, 45*time.Second, "every key delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			if next[fmt.Sprintf("key-%02d", k)] != perKey {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %v", len(bad), bad[:min(5, len(bad))])
	}
	t.Logf("%d events on %d keys in order, through %d failed attempts", keys*perKey, keys, failures.Load())
}

// waitDead waits until tb has n dead letters, and returns them.
func waitDead(t *testing.T, tb *outbox.Table, n int) []outbox.DeadLetter {
	t.Helper()
	var dead []outbox.DeadLetter
	waitFor(t, 15*time.Second, fmt.Sprintf("%d dead letters", n), func() bool {
		var err error
		dead, err = tb.DeadLetters(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == n
	})
	return dead
}

// A failing event holds back the later events of its key and no others;
// dead-lettered, it still holds them back, until it is redriven.
func TestFailureHoldsOnlyItsKey(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	rec := newRecorder()
	var failA atomic.Bool
	failA.Store(true)
	rec.setFail(func(m outbox.Message) error {
		if m.Key == "A" && failA.Load() {
			return fmt.Errorf("receiver of A is down (attempt %d)", m.Attempt)
		}
		return nil
	})
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{MaxAttempts: 3}))
	var evs []outbox.Event
	for i := range 5 {
		evs = append(evs, outbox.Event{ID: fmt.Sprintf("A%d", i), Key: "A"}, outbox.Event{ID: fmt.Sprintf("B%d", i), Key: "B"})
	}
	enqueue(t, pool, tb, len(evs), evs)

	waitFor(t, 10*time.Second, "B's events", func() bool { return len(rec.delivered()) == 5 })
	dead := waitDead(t, tb, 1)
	if d := dead[0]; d.ID != "A0" || d.Attempt != 3 || d.LastError != "receiver of A is down (attempt 3)" {
		t.Fatalf("dead letter %s: attempt %d, last error %q", d.ID, d.Attempt, d.LastError)
	}
	time.Sleep(200 * time.Millisecond) // a few polls: A1..A4 stay held back
	for i := 1; i < 5; i++ {
		if n := rec.triesOf(fmt.Sprintf("A%d", i)); n != 0 {
			t.Fatalf("A%d was sent %d times while A0 failed", i, n)
		}
	}
	for i, m := range rec.delivered() {
		if m.ID != fmt.Sprintf("B%d", i) {
			t.Fatalf("delivery %d is %s, want B%d", i, m.ID, i)
		}
	}

	failA.Store(false)
	if n, err := tb.Redrive(context.Background(), "A0", "B0", "no-such-event"); err != nil || n != 1 {
		t.Fatalf("Redrive: %d, %v; want 1 (only A0 is dead)", n, err)
	}
	waitFor(t, 10*time.Second, "A's events", func() bool { return len(rec.delivered()) == 10 })
	var order []string
	for _, m := range rec.delivered()[5:] {
		order = append(order, m.ID)
	}
	if got := strings.Join(order, " "); got != "A0 A1 A2 A3 A4" {
		t.Fatalf("A delivered as %s", got)
	}
	if m := rec.delivered()[5]; m.Attempt != 1 {
		t.Errorf("redriven A0 delivered at attempt %d, want 1 (attempts reset)", m.Attempt)
	}
}

// A sender that always fails ends in dead-letter after MaxAttempts
// attempts, with the last error kept; a permanent error dead-letters at
// once. Redriven, they are delivered.
func TestDeadLetterAfterMaxAttempts(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	rec := newRecorder()
	var broken atomic.Bool
	broken.Store(true)
	rec.setFail(func(m outbox.Message) error {
		switch {
		case !broken.Load():
			return nil
		case m.ID == "permanent":
			return idempotency.Permanent(errors.New("410 gone"))
		}
		return fmt.Errorf("503 on attempt %d", m.Attempt)
	})
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{MaxAttempts: 4}))
	enqueue(t, pool, tb, 2, []outbox.Event{{ID: "transient"}, {ID: "permanent"}})

	dead := waitDead(t, tb, 2)
	byID := map[string]outbox.DeadLetter{}
	for _, d := range dead {
		byID[d.ID] = d
	}
	if d := byID["transient"]; d.Attempt != 4 || d.LastError != "503 on attempt 4" || d.DeadAt.IsZero() {
		t.Errorf("transient: attempt %d, last error %q, dead at %v", d.Attempt, d.LastError, d.DeadAt)
	}
	if d := byID["permanent"]; d.Attempt != 1 || d.LastError != "410 gone" {
		t.Errorf("permanent: attempt %d, last error %q", d.Attempt, d.LastError)
	}
	time.Sleep(200 * time.Millisecond)
	if n, m := rec.triesOf("transient"), rec.triesOf("permanent"); n != 4 || m != 1 {
		t.Fatalf("sent %d and %d times, want 4 and 1", n, m)
	}
	if n := count(t, pool, "SELECT count(*) FROM "+qualified(tb)+" WHERE state = 'dead' AND done_at IS NOT NULL"); n != 2 {
		t.Fatalf("%d dead rows, want 2", n)
	}

	broken.Store(false)
	if n, err := tb.Redrive(context.Background(), "transient", "permanent"); err != nil || n != 2 {
		t.Fatalf("Redrive: %d, %v", n, err)
	}
	waitFor(t, 10*time.Second, "the redriven events", func() bool { return len(rec.delivered()) == 2 })
	if dead, err := tb.DeadLetters(context.Background(), 0); err != nil || len(dead) != 0 {
		t.Fatalf("DeadLetters after the redrive: %v, %v", dead, err)
	}
}

// Relays find events by polling where notifications do not arrive: a
// table that does not notify (as behind PgBouncer's transaction pooling),
// and a relay that does not listen.
func TestPollingWithoutNotifications(t *testing.T) {
	for _, c := range []struct {
		name     string
		noNotify bool
		noListen bool
	}{{"NoNotify", true, false}, {"NoListen", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			pool := testPool(t)
			tb := newTable(t, pool, &outbox.Options{NoNotify: c.noNotify})
			rec := newRecorder()
			start(t, newRelay(t, tb, rec, outbox.RelayOptions{PollInterval: 200 * time.Millisecond, NoListen: c.noListen}))
			time.Sleep(100 * time.Millisecond)
			enqueue(t, pool, tb, 3, events(3, nil))
			waitFor(t, 10*time.Second, "delivery by polling", func() bool { return len(rec.delivered()) == 3 })
		})
	}
}

// With a poll interval of a minute, a relay still delivers at once: its
// LISTEN connection is woken by the enqueue's notification. When that
// connection is killed, the relay listens again.
func TestNotificationWakesRelay(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	rec := newRecorder()
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{PollInterval: time.Minute}))
	waitFor(t, 10*time.Second, "the LISTEN connection", func() bool { return listeners(t, pool, tb) == 1 })
	time.Sleep(50 * time.Millisecond) // the relay's first, empty claim
	enqueue(t, pool, tb, 1, events(1, nil))
	waitFor(t, 10*time.Second, "a delivery woken by NOTIFY", func() bool { return len(rec.delivered()) == 1 })

	if k := terminate(t, pool, "query = $1", `LISTEN "`+outbox.Channel(tb)+`"`); k != 1 {
		t.Fatalf("terminated %d LISTEN connections, want 1", k)
	}
	waitFor(t, 10*time.Second, "the LISTEN connection again", func() bool { return listeners(t, pool, tb) == 1 })
	time.Sleep(50 * time.Millisecond)
	enqueue(t, pool, tb, 1, events(1, nil))
	waitFor(t, 10*time.Second, "a delivery woken by NOTIFY after the reconnection", func() bool { return len(rec.delivered()) == 2 })
}

// A relay starts no send it could not finish within its lease: the events
// it had no time for are released unsent (no attempt counted) and claimed
// again, and none is sent twice.
func TestLeaseBoundsBatch(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, &outbox.Options{Timeout: time.Second})
	rec := newRecorder()
	rec.setFail(func(outbox.Message) error { time.Sleep(250 * time.Millisecond); return nil })
	// Sends may start until 3s - 1s (recording) - 75ms (grace) - 300ms
	// (a send): about 7 of the batch of 20 per claim.
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{BatchSize: 20, Lease: 3 * time.Second, SendTimeout: 300 * time.Millisecond}))
	enqueue(t, pool, tb, 20, events(20, nil))
	waitFor(t, 20*time.Second, "all 20 delivered", func() bool { return len(rec.delivered()) == 20 })
	if d := rec.distinct(); d != 20 {
		t.Fatalf("%d distinct events in 20 deliveries: some were sent twice", d)
	}
	for _, m := range rec.delivered() {
		if m.Attempt != 1 {
			t.Errorf("event %s delivered at attempt %d, want 1: released events do not count an attempt", m.ID, m.Attempt)
		}
	}
}

// A sender that ignores its context is abandoned after SendTimeout and its
// grace; the attempt counts as failed, and the next one is made.
func TestSenderIgnoringContextIsAbandoned(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, &outbox.Options{Timeout: time.Second})
	stuck := make(chan struct{})
	defer close(stuck)
	rec := newRecorder()
	rec.setFail(func(m outbox.Message) error {
		if m.Attempt == 1 {
			<-stuck // ignores ctx
		}
		return nil
	})
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{Lease: 3 * time.Second, SendTimeout: 100 * time.Millisecond}))
	enqueue(t, pool, tb, 1, []outbox.Event{{ID: "e"}})
	waitFor(t, 10*time.Second, "the second attempt", func() bool { return len(rec.delivered()) == 1 })
	if m := rec.delivered()[0]; m.Attempt != 2 {
		t.Fatalf("delivered at attempt %d, want 2", m.Attempt)
	}
}

// The relay and Enqueue work in pgx's exec and simple-protocol modes (the
// modes for PgBouncer's transaction pooling), through retries, ordering
// keys and headers.
func TestQueryModes(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := ownPool(t, mode, 3, "")
			tb := newTable(t, pool, nil)
			rec := newRecorder()
			rec.setFail(func(m outbox.Message) error {
				if m.Attempt == 1 {
					return errors.New("first attempt fails")
				}
				return nil
			})
			start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
			evs := events(20, func(i int) string { return "k" + strconv.Itoa(i%3) })
			evs[0].Headers = map[string]string{"h": "v"}
			evs[1].Payload = []byte{0, 1, 2, 255}
			enqueue(t, pool, tb, 10, evs)
			waitFor(t, 20*time.Second, "20 deliveries", func() bool { return len(rec.delivered()) == 20 })
			byID := map[string]outbox.Message{}
			for _, m := range rec.delivered() {
				byID[m.ID] = m
			}
			if m := byID[evs[0].ID]; m.Headers["h"] != "v" {
				t.Errorf("headers %v", m.Headers)
			}
			if m := byID[evs[1].ID]; string(m.Payload) != "\x00\x01\x02\xff" {
				t.Errorf("payload %q", m.Payload)
			}
		})
	}
}

// With DeleteDelivered, a delivered event's row is gone at once, also when
// its batch had failures (the statement that records them deletes the
// delivered ones), and a dead event is kept.
func TestDeleteDelivered(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, &outbox.Options{DeleteDelivered: true})
	rec := newRecorder()
	rec.setFail(func(m outbox.Message) error {
		switch {
		case m.ID == "dead":
			return idempotency.Permanent(errors.New("no such endpoint"))
		case m.Attempt == 1 && strings.HasSuffix(m.ID, "odd"):
			return errors.New("first attempt fails")
		}
		return nil
	})
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
	evs := []outbox.Event{{ID: "dead"}}
	for i := range 10 {
		evs = append(evs, outbox.Event{ID: fmt.Sprintf("e%d-%s", i, map[bool]string{true: "odd", false: "even"}[i%2 == 1])})
	}
	enqueue(t, pool, tb, len(evs), evs)
	waitFor(t, 10*time.Second, "10 deliveries", func() bool { return len(rec.delivered()) == 10 })
	waitFor(t, 5*time.Second, "only the dead event left", func() bool {
		return count(t, pool, "SELECT count(*) FROM "+qualified(tb)) == 1
	})
	if d := waitDead(t, tb, 1); d[0].ID != "dead" {
		t.Fatalf("dead letter %s", d[0].ID)
	}
}

// Headers written by hand: values that are not strings reach the sender
// as their JSON text; headers that are not an object fail their event for
// good, and the rest of its batch is delivered.
func TestHandWrittenHeaders(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	evs := events(5, nil)
	enqueue(t, pool, tb, 5, evs)
	if _, err := pool.Exec(context.Background(), "UPDATE "+qualified(tb)+` SET headers = CASE WHEN event_id = $1 THEN '[1]'::jsonb ELSE '{"n": 1, "s": "x"}' END`, evs[2].ID); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
	waitFor(t, 10*time.Second, "4 deliveries", func() bool { return len(rec.delivered()) == 4 })
	d := waitDead(t, tb, 1)
	if d[0].ID != evs[2].ID || !strings.Contains(d[0].LastError, "headers") || rec.triesOf(evs[2].ID) != 0 {
		t.Fatalf("dead letter %s (%q), sent %d times", d[0].ID, d[0].LastError, rec.triesOf(evs[2].ID))
	}
	if h := rec.delivered()[0].Headers; h["n"] != "1" || h["s"] != "x" {
		t.Fatalf("headers %v", h)
	}
}
