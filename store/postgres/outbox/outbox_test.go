package outbox_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/postgres/outbox"
	"github.com/jackc/pgx/v5"
)

// Inside postgres.DoTx the event commits with the idempotency key and the
// effect: a replay enqueues nothing more, and fn's transient error undoes
// the event with fn's other writes. Through a TxExecutor the same holds
// for handlers, which reach the transaction with postgres.TxFromContext.
func TestEnqueueInDoTx(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	tb := newTable(t, pool, nil)
	store, err := postgres.New(pool, &postgres.Options{Schema: testSchema, Table: "keys_" + randomHex(4)})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	effects := testSchema + ".effects_" + randomHex(4)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))

	// fn writes the effect and its event; failWith makes it fail after.
	fn := func(key string, failWith error) func(ctx context.Context, tx pgx.Tx) (string, error) {
		return func(ctx context.Context, tx pgx.Tx) (string, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key) VALUES ($1)", key); err != nil {
				return "", err
			}
			// An event ID derived from the request: the same in every
			// attempt of it.
			id, err := idempotency.DownstreamKey(ctx, "evt")
			if err != nil {
				return "", err
			}
			if err := tb.Enqueue(ctx, tx, outbox.Event{ID: id, Topic: "payments", Key: key, Payload: []byte(key)}); err != nil {
				return "", err
			}
			return id, failWith
		}
	}
	doTx := func(key string, failWith error) (idempotency.Result[string], error) {
		var res idempotency.Result[string]
		err := postgres.RunInTx(ctx, pool, pgx.TxOptions{}, 3, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = postgres.DoTx(ctx, runner, tx, idempotency.Request{Key: key}, fn(key, failWith))
			if errors.Is(err, errTransient) {
				return nil // commit the rest of the transaction: fn's writes are undone already
			}
			return err
		})
		return res, err
	}

	first, err := doTx("pay-1", nil)
	if err != nil || first.Replayed {
		t.Fatal(first, err)
	}
	again, err := doTx("pay-1", nil)
	if err != nil || !again.Replayed || again.Value != first.Value {
		t.Fatalf("retry: %+v, %v", again, err)
	}
	if _, err := doTx("pay-2", errTransient); err != nil {
		t.Fatal(err)
	}

	// Through the executor: a handler that fails transiently rolls back,
	// one that succeeds commits.
	exec, err := postgres.NewTxExecutor(pool, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	handler := func(key string, failWith error) func(ctx context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			tx, ok := postgres.TxFromContext(ctx)
			if !ok {
				return nil, errors.New("no transaction in the handler's context")
			}
			id, err := fn(key, failWith)(ctx, tx)
			return []byte(id), err
		}
	}
	if _, err := exec.Execute(ctx, idempotency.Request{Key: "pay-3"}, handler("pay-3", errTransient)); !errors.Is(err, errTransient) {
		t.Fatalf("failing handler: %v", err)
	}
	res4, err := exec.Execute(ctx, idempotency.Request{Key: "pay-4"}, handler("pay-4", nil))
	if err != nil {
		t.Fatal(err)
	}

	waitFor(t, 10*time.Second, "two deliveries", func() bool { return len(rec.delivered()) == 2 })
	time.Sleep(300 * time.Millisecond) // a few polls more: nothing else comes
	got := map[string]string{}
	for _, m := range rec.delivered() {
		got[m.Key] = m.ID
	}
	if len(got) != 2 || got["pay-1"] != first.Value || got["pay-4"] != string(res4.Value) {
		t.Fatalf("delivered %v, want the events of pay-1 (%s) and pay-4 (%s) only", got, first.Value, res4.Value)
	}
	if n := count(t, pool, "SELECT count(*) FROM "+qualified(tb)); n != 2 {
		t.Fatalf("%d events in the table, want 2", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM "+effects); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
}

var errTransient = errors.New("transient")

// A transaction enqueueing an ordering key waits for another that enqueued
// the same key to end (and one enqueueing another key does not), so the
// relay delivers a key's events in commit order.
func TestEnqueueSerializesKey(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	ctx := context.Background()
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	if err := tb.Enqueue(ctx, tx1, outbox.Event{ID: "first", Key: "K"}); err != nil {
		t.Fatal(err)
	}
	// Another key is not held up.
	enqueue(t, pool, tb, 1, []outbox.Event{{ID: "other", Key: "J"}})

	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tb.Enqueue(ctx, tx, outbox.Event{ID: "second", Key: "K"}) })
	}()
	select {
	case err := <-done:
		t.Fatalf("the second enqueue of K returned (%v) while the first transaction was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	start(t, newRelay(t, tb, rec, outbox.RelayOptions{}))
	waitFor(t, 10*time.Second, "three deliveries", func() bool { return len(rec.delivered()) == 3 })
	var k []string
	for _, m := range rec.delivered() {
		if m.Key == "K" {
			k = append(k, m.ID)
		}
	}
	if strings.Join(k, " ") != "first second" {
		t.Fatalf("K delivered as %v", k)
	}
}

// Invalid events are refused before anything is sent, naming the field,
// and the caller's transaction stays usable.
func TestEnqueueInvalid(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, &outbox.Options{MaxPayloadSize: 10})
	ctx := context.Background()
	cases := []struct {
		ev   outbox.Event
		want string
	}{
		{outbox.Event{ID: strings.Repeat("x", outbox.MaxIDLen+1)}, "Event.ID"},
		{outbox.Event{ID: "a\x00b"}, "Event.ID"},
		{outbox.Event{Topic: "\xff"}, "Event.Topic"},
		{outbox.Event{Key: strings.Repeat("k", outbox.MaxKeyLen+1)}, "Event.Key"},
		{outbox.Event{Payload: make([]byte, 11)}, "MaxPayloadSize"},
		{outbox.Event{Headers: map[string]string{"a": "\x00"}}, "Headers"},
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, c := range cases {
			err := tb.Enqueue(ctx, tx, outbox.Event{ID: "fine"}, c.ev)
			if !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "event 2 of 2") {
				t.Errorf("Enqueue(%+v): %v, want ErrInvalidArgument naming %s", c.ev, err, c.want)
			}
		}
		if err := tb.Enqueue(ctx, nil, outbox.Event{}); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("Enqueue with a nil tx: %v", err)
		}
		return tb.Enqueue(ctx, tx, outbox.Event{ID: "valid"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "SELECT count(*) FROM "+qualified(tb)); n != 1 {
		t.Fatalf("%d rows, want the valid event only", n)
	}
}

// Cleanup deletes delivered events past the retention, and keeps newer
// ones, pending ones and dead ones.
func TestCleanup(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, &outbox.Options{Retention: time.Hour, CleanupBatch: 3})
	ctx := context.Background()
	enqueue(t, pool, tb, 20, events(20, nil))
	q := qualified(tb)
	// 10 delivered two hours ago, 5 a minute ago, 2 dead long ago, 3 pending.
	if _, err := pool.Exec(ctx, `
		UPDATE `+q+` SET state = CASE WHEN id <= (SELECT min(id) FROM `+q+`) + 16 THEN 'delivered' ELSE 'pending' END,
			done_at = clock_timestamp() - CASE WHEN id <= (SELECT min(id) FROM `+q+`) + 9 THEN interval '2 hours' ELSE interval '1 minute' END;
		UPDATE `+q+` SET state = 'dead', done_at = clock_timestamp() - interval '1 day'
		WHERE id IN (SELECT id FROM `+q+` WHERE state = 'delivered' ORDER BY id DESC LIMIT 2)`); err != nil {
		t.Fatal(err)
	}
	n, err := tb.Cleanup(ctx, 0)
	if err != nil || n != 10 {
		t.Fatalf("Cleanup: %d, %v; want 10", n, err)
	}
	for state, want := range map[string]int{"delivered": 5, "dead": 2, "pending": 3} {
		if got := count(t, pool, "SELECT count(*) FROM "+q+" WHERE state = $1", state); got != want {
			t.Errorf("%d %s rows left, want %d", got, state, want)
		}
	}
	if n, err := tb.Cleanup(ctx, 0); err != nil || n != 0 {
		t.Fatalf("second Cleanup: %d, %v", n, err)
	}
}

// The relay cleans up by itself.
func TestRelayCleansUp(t *testing.T) {
	pool := testPool(t)
	tb := newTable(t, pool, nil)
	enqueue(t, pool, tb, 5, events(5, nil))
	if _, err := pool.Exec(context.Background(), "UPDATE "+qualified(tb)+" SET state = 'delivered', done_at = '2000-01-01'"); err != nil {
		t.Fatal(err)
	}
	start(t, newRelay(t, tb, newRecorder(), outbox.RelayOptions{CleanupInterval: 100 * time.Millisecond}))
	waitFor(t, 10*time.Second, "the cleanup", func() bool { return count(t, pool, "SELECT count(*) FROM "+qualified(tb)) == 0 })
}

// Options that cannot work are refused at construction, with an error
// naming the option.
func TestOptionsRefused(t *testing.T) {
	pool := testPool(t)
	for _, c := range []struct {
		opts outbox.Options
		want string
	}{
		{outbox.Options{Table: "bad-name"}, "Options.Table"},
		{outbox.Options{Table: strings.Repeat("t", 49)}, "Options.Table"},
		{outbox.Options{Schema: "a b"}, "Options.Schema"},
		{outbox.Options{MaxPayloadSize: -1}, "Options.MaxPayloadSize"},
		{outbox.Options{Retention: -time.Hour}, "Options.Retention"},
		{outbox.Options{CleanupBatch: -1}, "Options.CleanupBatch"},
		{outbox.Options{Timeout: 5}, "Options.Timeout"},
	} {
		if _, err := outbox.New(pool, &c.opts); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want ErrInvalidArgument naming %s", c.opts, err, c.want)
		}
	}
	if _, err := outbox.New(nil, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("New(nil): %v", err)
	}

	tb := tableOn(t, pool, nil)
	send := outbox.SenderFunc(func(context.Context, outbox.Message) error { return nil })
	for _, c := range []struct {
		opts outbox.RelayOptions
		want string
	}{
		{outbox.RelayOptions{BatchSize: -1}, "RelayOptions.BatchSize"},
		{outbox.RelayOptions{BatchSize: outbox.MaxBatchSize + 1}, "RelayOptions.BatchSize"},
		{outbox.RelayOptions{BatchSize: 10, Parallelism: 11}, "RelayOptions.Parallelism"},
		{outbox.RelayOptions{MaxAttempts: -1}, "RelayOptions.MaxAttempts"},
		{outbox.RelayOptions{SendTimeout: -time.Second}, "RelayOptions.SendTimeout"},
		{outbox.RelayOptions{Lease: 30}, "RelayOptions.Lease"}, // 30ns: the unit was missed
		{outbox.RelayOptions{Lease: 15 * time.Second}, "RelayOptions.Lease"},
		{outbox.RelayOptions{Backoff: time.Minute, MaxBackoff: time.Second}, "RelayOptions.MaxBackoff"},
		{outbox.RelayOptions{Backoff: -1}, "RelayOptions.Backoff"},
		{outbox.RelayOptions{PollInterval: time.Millisecond}, "RelayOptions.PollInterval"},
		{outbox.RelayOptions{CleanupInterval: -1}, "RelayOptions.CleanupInterval"},
	} {
		if _, err := outbox.NewRelay(tb, send, &c.opts); !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRelay(%+v): %v, want ErrInvalidArgument naming %s", c.opts, err, c.want)
		}
	}
	if _, err := outbox.NewRelay(nil, send, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("NewRelay(nil table): %v", err)
	}
	if _, err := outbox.NewRelay(tb, nil, nil); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("NewRelay(nil sender): %v", err)
	}
	r, err := outbox.NewRelay(tb, send, nil)
	if err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	// A relay runs once at a time.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(50 * time.Millisecond)
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrRelayRunning) {
		t.Errorf("second Run: %v", err)
	}
	cancel()
	<-done
}

// Schema is idempotent SQL for the options; Migrate applies it, any number
// of times; a table that was never migrated gives ErrNotMigrated.
func TestSchemaAndMigrate(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	sql, err := outbox.Schema(&outbox.Options{Schema: "billing", Table: "events"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE SCHEMA IF NOT EXISTS "billing"`, `CREATE TABLE IF NOT EXISTS "billing"."events"`, `"events_pending_idx"`} {
		if !strings.Contains(sql, want) {
			t.Errorf("Schema lacks %s:\n%s", want, sql)
		}
	}
	if n := strings.Count(sql, "CREATE"); n != strings.Count(sql, "IF NOT EXISTS") {
		t.Errorf("a CREATE without IF NOT EXISTS:\n%s", sql)
	}
	if _, err := outbox.Schema(&outbox.Options{Table: "x;"}); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("Schema with a bad name: %v", err)
	}

	tb := newTable(t, pool, nil)
	if err := tb.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	// Schema's SQL applies on top of Migrate's.
	own, err := outbox.Schema(&outbox.Options{Schema: testSchema, Table: outbox.TableName(tb)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, own); err != nil {
		t.Fatal(err)
	}

	missing := tableOn(t, pool, nil)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return missing.Enqueue(ctx, tx, outbox.Event{}) })
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Enqueue into a missing table: %v", err)
	}
	if _, err := missing.DeadLetters(ctx, 0); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Errorf("DeadLetters of a missing table: %v", err)
	}
}

// NewEventID makes version 7 UUIDs, unique and in time order.
func TestNewEventID(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	prev := ""
	for i := range 1000 {
		id := outbox.NewEventID()
		if !re.MatchString(id) {
			t.Fatalf("%q is not a version 7 UUID", id)
		}
		if seen[id] {
			t.Fatalf("%q twice", id)
		}
		seen[id] = true
		if i > 0 && id[:13] < prev[:13] {
			t.Fatalf("%q after %q: not in time order", id, prev)
		}
		prev = id
	}
}
