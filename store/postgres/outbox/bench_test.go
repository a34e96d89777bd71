package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/store/postgres/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Run with:
//
//	go test -run '^$' -bench Relay -benchtime 40000x ./store/postgres/outbox/
//
// against the server at IDEM_POSTGRES_URL (eval "$(scripts/servers/postgres.sh start .tmp/servers)").

// benchBatch is the batch size of both sides: events per enqueueing
// transaction and per claim.
const benchBatch = 100

// benchPayload is a 200-byte event body.
var benchPayload = make([]byte, 200)

// BenchmarkRelay measures events per second through the outbox with one
// and with four relays, against a raw floor in the same run: plain pgx on
// a minimal table (id, payload, done; an index on the undone ids) doing
// only what any SKIP LOCKED queue must, in batches of the same size:
//
//	enqueue: BEGIN; INSERT ... SELECT FROM unnest (100 rows); COMMIT
//	deliver: BEGIN; SELECT id, payload ... WHERE NOT done ORDER BY id LIMIT 100
//	         FOR UPDATE SKIP LOCKED; UPDATE ... SET done WHERE id = ANY; COMMIT
//
// The floor holds its transaction open while it "sends" (here: a call that
// returns at once), which the relay does not (see the package docs), and
// it has no event IDs, ordering, attempts, retries, dead letters or
// notifications.
//
// Each iteration is one event. The events go in rounds of up to 5,000,
// alternating between the outbox and the floor (and which of them goes
// first) so that both see the same load on the shared machine. A round
// enqueues its events, then starts the relays (or floor workers) and
// times them until every event is delivered. The relays run with
// NoListen: the events are there when they start, and a LISTEN
// connection made per round would be timed too. Sub-benchmarks: delete
// is Options.DeleteDelivered, relays the number of relays and of floor
// workers. Metrics, each per side (outbox-, floor-) and as a ratio
// (outbox/floor, 1.0 = as fast as the floor):
//
//   - deliver-ev/s: delivery alone, the relays' throughput;
//   - enqueue-ev/s: the enqueueing transactions alone (Enqueue notifies,
//     as by default; the floor does not);
//   - ev/s: end to end, events / (enqueue time + delivery time).
func BenchmarkRelay(b *testing.B) {
	for _, del := range []bool{false, true} {
		for _, relays := range []int{1, 4} {
			b.Run(fmt.Sprintf("delete=%v/relays=%d", del, relays), func(b *testing.B) { benchRelay(b, relays, del) })
		}
	}
}

func benchRelay(b *testing.B, relays int, deleteDelivered bool) {
	pool := testPool(b)
	ctx := context.Background()
	tb := newTable(b, pool, &outbox.Options{DeleteDelivered: deleteDelivered})
	floor := newFloor(b, pool)

	var sent atomic.Int64
	sender := outbox.SenderFunc(func(context.Context, outbox.Message) error { sent.Add(1); return nil })
	rs := make([]*outbox.Relay, relays)
	for i := range rs {
		rs[i] = newRelay(b, tb, sender, outbox.RelayOptions{BatchSize: benchBatch, NoCleanup: true, NoListen: true, PollInterval: 10 * time.Millisecond})
	}

	var obEnq, obDel, flEnq, flDel time.Duration
	outboxRound := func(n int) {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = outbox.Event{Topic: "bench", Payload: benchPayload}
		}
		t0 := time.Now()
		enqueue(b, pool, tb, benchBatch, evs)
		t1 := time.Now()
		sent.Store(0)
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Go(func() { _ = r.Run(rctx) })
		}
		for sent.Load() < int64(n) {
			time.Sleep(100 * time.Microsecond)
		}
		t2 := time.Now()
		cancel()
		wg.Wait()
		obEnq += t1.Sub(t0)
		obDel += t2.Sub(t1)
	}
	floorRound := func(n int) {
		t0 := time.Now()
		floor.enqueue(b, n)
		t1 := time.Now()
		floor.deliver(b, relays, n)
		t2 := time.Now()
		flEnq += t1.Sub(t0)
		flDel += t2.Sub(t1)
	}
	b.ResetTimer()
	for round, done := 0, 0; done < b.N; round++ {
		n := min(b.N-done, 5000)
		done += n
		// Which side goes first alternates, so that neither always runs
		// while the other's autovacuum does.
		if round%2 == 0 {
			outboxRound(n)
			floorRound(n)
		} else {
			floorRound(n)
			outboxRound(n)
		}
	}
	b.StopTimer()
	if got := count(b, pool, "SELECT count(*) FROM "+qualified(tb)+" WHERE state <> 'delivered'"); got != 0 {
		b.Fatalf("%d events not delivered", got)
	}
	if got := count(b, pool, "SELECT count(*) FROM "+qualified(tb)); !deleteDelivered && got != b.N {
		b.Fatalf("%d events delivered, want %d", got, b.N)
	}
	if got := count(b, pool, "SELECT count(*) FROM "+floor.table+" WHERE done"); got != b.N {
		b.Fatalf("floor: %d rows done, want %d", got, b.N)
	}
	rate := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
	b.ReportMetric(rate(obDel), "outbox-deliver-ev/s")
	b.ReportMetric(rate(flDel), "floor-deliver-ev/s")
	b.ReportMetric(flDel.Seconds()/obDel.Seconds(), "deliver-outbox/floor")
	b.ReportMetric(rate(obEnq), "outbox-enqueue-ev/s")
	b.ReportMetric(rate(flEnq), "floor-enqueue-ev/s")
	b.ReportMetric(flEnq.Seconds()/obEnq.Seconds(), "enqueue-outbox/floor")
	b.ReportMetric(rate(obEnq+obDel), "outbox-ev/s")
	b.ReportMetric(rate(flEnq+flDel), "floor-ev/s")
	b.ReportMetric((flEnq+flDel).Seconds()/(obEnq+obDel).Seconds(), "outbox/floor")
}

// floorQueue is the raw floor: a minimal SKIP LOCKED queue in plain pgx.
type floorQueue struct {
	pool  *pgxpool.Pool
	table string
}

func newFloor(b *testing.B, pool *pgxpool.Pool) *floorQueue {
	f := &floorQueue{pool: pool, table: testSchema + ".floor_" + randomHex(4)}
	if _, err := pool.Exec(context.Background(), `
		CREATE TABLE `+f.table+` (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, payload bytea NOT NULL, done boolean NOT NULL DEFAULT false);
		CREATE INDEX ON `+f.table+` (id) WHERE NOT done`); err != nil {
		b.Fatal(err)
	}
	return f
}

func (f *floorQueue) enqueue(b *testing.B, n int) {
	ctx := context.Background()
	payloads := make([][]byte, benchBatch)
	for i := range payloads {
		payloads[i] = benchPayload
	}
	for i := 0; i < n; i += benchBatch {
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+f.table+" (payload) SELECT * FROM unnest($1::bytea[])", payloads[:min(benchBatch, n-i)])
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// deliver runs workers until n rows are done.
func (f *floorQueue) deliver(b *testing.B, workers, n int) {
	ctx := context.Background()
	var done atomic.Int64
	var sink atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for done.Load() < int64(n) {
				var k int
				err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					rows, err := tx.Query(ctx, "SELECT id, payload FROM "+f.table+" WHERE NOT done ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED", benchBatch)
					if err != nil {
						return err
					}
					var ids []int64
					var id int64
					var payload []byte
					if _, err := pgx.ForEachRow(rows, []any{&id, &payload}, func() error {
						ids = append(ids, id)
						sink.Add(int64(len(payload))) // the "send"
						return nil
					}); err != nil {
						return err
					}
					if k = len(ids); k == 0 {
						return nil
					}
					_, err = tx.Exec(ctx, "UPDATE "+f.table+" SET done = true WHERE id = ANY($1)", ids)
					return err
				})
				if err != nil {
					b.Error(err)
					return
				}
				done.Add(int64(k))
			}
		})
	}
	wg.Wait()
}
