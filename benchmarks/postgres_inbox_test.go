package benchmarks_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
	"github.com/exactlyonce/idempotency/inbox"
)

// BenchmarkPostgresInbox measures one consumer's inbox throughput on the
// PostgreSQL store, whose table (like the floor's) holds 10⁵ completed
// records first: each op is a batch of size fresh messages (200-byte
// payloads, fingerprinted) through inbox.HandleBatch, whose claims take one
// statement over arrays and whose completions one more. Interleaved in the
// same run, on the same pool, with the same messages' count:
//
//   - handle: the same messages through inbox.Handle, one message per call
//     (two statements each);
//
//   - raw: the floor, the same batched statements a hand-written consumer
//     needs at least on a primary-key table (key text primary key, st
//     text, resp bytea, lease timestamptz):
//
//     INSERT INTO t (key, st, lease) SELECT k, 'started', clock_timestamp() + interval '30s'
//     FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING RETURNING key
//     UPDATE t SET st = 'completed', resp = $2 FROM unnest($1::text[]) AS k WHERE key = k
//
// ns/op is a batch's time, ns/msg its time per message; raw-ns/op and
// handle-ns/op the others' for the same messages; ratio is raw-ns/op ÷
// ns/op (the target is at least 1/1.5 = 0.67: a batch's per-message cost
// within 1.5× the floor's), handle-ratio handle-ns/op ÷ ns/op (how many
// times the per-message rate a batch gives: the target is 10 at a batch of
// 100); roundtrips/op counts the batch's statements.
//
//	go test -run '^$' -bench PostgresInbox -benchtime 20x ./benchmarks/
func BenchmarkPostgresInbox(b *testing.B) {
	for _, size := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) { postgresInbox(b, size) })
	}
}

// inboxPreload is how many completed records each table of
// BenchmarkPostgresInbox holds before it starts.
const inboxPreload = 100_000

func postgresInbox(b *testing.B, size int) {
	p := newPGPlace(b)
	r, err := idempotency.New(p.store, idempotency.WithRetention(bench.Retention))
	if err != nil {
		b.Fatal(err)
	}
	in, err := inbox.New(r, "bench")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// Both tables hold as many completed records first, as a consumer's
	// store does, analyzed: the planner then sees tables of their real
	// size, not the empty ones of a new run.
	for _, q := range []string{
		"INSERT INTO " + p.table + " SELECT 'old-' || g, 'fp', 'completed', 'tok', g, 1, now(), interval '1 hour', now() + interval '1 hour', NULL, '{}', now(), now() + interval '1 hour' FROM generate_series(1, $1::int) AS g",
		"INSERT INTO " + p.floor + " SELECT 'old-' || g, 'completed', '{}', now() FROM generate_series(1, $1::int) AS g",
		"ANALYZE " + p.table + ", " + p.floor,
	} {
		args := []any{inboxPreload}
		if strings.HasPrefix(q, "ANALYZE") {
			args = nil
		}
		if _, err := p.pool.Exec(ctx, q, args...); err != nil {
			b.Fatal(err)
		}
	}
	payload := bytes.Repeat([]byte("p"), 200)
	run := bench.RandomHex(4)
	id := func(kind string, op, j int) string { return fmt.Sprintf("%s-%s-%d-%d", run, kind, op, j) }
	msgs := func(kind string, op int) []inbox.Message {
		m := make([]inbox.Message, size)
		for j := range m {
			m[j] = inbox.Message{Source: "orders", ID: id(kind, op, j), Payload: payload}
		}
		return m
	}
	handled := func(int) error { return nil }
	batch := func(_, op int) error {
		for j, d := range in.HandleBatch(ctx, msgs("b", op), func(_ context.Context, j int) error { return handled(j) }) {
			if d.Err != nil || d.Outcome != idempotency.OutcomeCompleted {
				return fmt.Errorf("batch %d, message %d: %v %v", op, j, d.Outcome, d.Err)
			}
		}
		return nil
	}
	single := func(_, op int) error {
		for j, m := range msgs("h", op) {
			d, err := in.Handle(ctx, m, func(context.Context) error { return handled(j) })
			if err != nil || d.Outcome != idempotency.OutcomeCompleted {
				return fmt.Errorf("message %s: %v %v", m.ID, d.Outcome, err)
			}
		}
		return nil
	}
	insert := "INSERT INTO " + p.floor + " (key, st, lease) SELECT k, 'started', clock_timestamp() + interval '30s' FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING RETURNING key"
	update := "UPDATE " + p.floor + " SET st = 'completed', resp = $2 FROM unnest($1::text[]) AS k WHERE key = k"
	resp := []byte("{}") // what the inbox stores for a message handled
	raw := func(_, op int) error {
		keys := make([]string, size)
		for j := range keys {
			keys[j] = "inbox/bench/orders/" + id("r", op, j)
		}
		rows, err := p.pool.Query(ctx, insert, keys)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			n++
		}
		if rows.Close(); rows.Err() != nil || n != size {
			return fmt.Errorf("raw claims of batch %d: %d of %d inserted, %v", op, n, size, rows.Err())
		}
		tag, err := p.pool.Exec(ctx, update, keys, resp)
		if err == nil && tag.RowsAffected() != int64(size) {
			err = fmt.Errorf("raw completions of batch %d changed %d rows of %d", op, tag.RowsAffected(), size)
		}
		return err
	}
	// Warm-up: the connection dialled, every statement prepared.
	for _, f := range []func(int, int) error{batch, single, raw} {
		if err := f(0, -1); err != nil {
			b.Fatal(err)
		}
	}
	total := bench.CompareAll(b, 1, &p.trips, batch, bench.Baseline{Name: "raw", F: raw}, bench.Baseline{Name: "handle", F: single})
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*size), "ns/msg")
}
