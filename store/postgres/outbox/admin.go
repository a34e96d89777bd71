package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cleanup deletes delivered events older than [Options.Retention], oldest
// first, in statements of [Options.CleanupBatch] events each bounded by
// [Options.Timeout], until none is left or limit events were deleted
// (limit ≤ 0: no limit). Rows another cleanup holds are skipped, so
// several may run at once and divide the work. Relays run it every
// [RelayOptions.CleanupInterval]; it returns how many it deleted.
func (t *Table) Cleanup(ctx context.Context, limit int) (int, error) {
	total := 0
	for limit <= 0 || total < limit {
		batch := t.opts.CleanupBatch
		if limit > 0 {
			batch = min(batch, limit-total)
		}
		sctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
		tag, err := t.db.Exec(sctx, t.sql.cleanup, t.opts.Retention.Microseconds(), batch)
		cancel()
		if err != nil {
			return total, wrapErr(sctx, "cleanup", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < batch {
			break
		}
	}
	return total, nil
}

// DeadLetter is an event that was given up on.
type DeadLetter struct {
	// Message is the event; its Attempt is the number of attempts made.
	Message
	// LastError is the error of the last attempt.
	LastError string
	// DeadAt is when the event was dead-lettered.
	DeadAt time.Time
}

// DeadLetters returns up to limit dead events, oldest first (limit ≤ 0:
// 100). Redrive them with [Table.Redrive] once the receiver is fixed, or
// delete their rows (DELETE FROM the table WHERE event_id = ...). A dead
// event with an ordering key holds back the later events of its key
// until it is redriven and delivered, or deleted.
func (t *Table) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	rows, err := t.db.Query(ctx, t.sql.deadLetters, limit)
	if err != nil {
		return nil, wrapErr(ctx, "dead letters", err)
	}
	var out []DeadLetter
	var headers *string
	var d DeadLetter
	_, err = pgx.ForEachRow(rows, []any{&d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Attempt, &d.EnqueuedAt, &d.LastError, &d.DeadAt}, func() error {
		m := d
		m.Headers = nil
		if headers != nil {
			m.Headers, _ = decodeHeaders(*headers) // listing a dead event matters more than its headers
		}
		m.Payload = append([]byte(nil), d.Payload...)
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, wrapErr(ctx, "dead letters", err)
	}
	return out, nil
}

// Redrive puts the dead events with the given IDs back to pending, with
// their attempts reset to zero (the last error is kept until the next
// attempt), so that relays deliver them again; it returns how many it
// changed. IDs of events that are not dead are ignored.
func (t *Table) Redrive(ctx context.Context, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	tag, err := t.db.Exec(ctx, t.sql.redrive, ids)
	if err != nil {
		return 0, wrapErr(ctx, "redrive", err)
	}
	return int(tag.RowsAffected()), nil
}

// RedriveAll puts every event that is dead when it is called back to
// pending, as [Table.Redrive] does, oldest first, and returns how many it
// changed: after a receiver's outage, one call redrives what it
// dead-lettered. It works in statements of [Options.CleanupBatch] events,
// each bounded by [Options.Timeout], and an event that dies again while
// it runs (the receiver still fails) is not redriven twice. On an error
// it returns how many it had redriven; calling it again goes on.
func (t *Table) RedriveAll(ctx context.Context) (int, error) {
	var last int64
	qctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	err := t.db.QueryRow(qctx, t.sql.lastDead).Scan(&last)
	cancel()
	if err != nil {
		return 0, wrapErr(qctx, "redrive all", err)
	}
	total := 0
	for after := int64(0); after < last; {
		var n int
		bctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
		err := t.db.QueryRow(bctx, t.sql.redriveBatch, after, last, t.opts.CleanupBatch).Scan(&n, &after)
		cancel()
		if err != nil {
			return total, wrapErr(bctx, "redrive all", err)
		}
		total += n
		if n < t.opts.CleanupBatch {
			break
		}
	}
	return total, nil
}

// Backlog is what an outbox holds undelivered, by the server's clock: the
// figures to watch (and alert on) for a relay that falls behind, a
// receiver that fails, or dead letters nobody handles.
type Backlog struct {
	// Pending is how many events wait for a relay: new, released, or back
	// after a failed attempt (waiting out its backoff, or ready).
	Pending int64
	// Retrying is how many of the Pending events failed or lost at least
	// one attempt (its send failed, or its relay stopped or died).
	Retrying int64
	// InFlight is how many events a relay has claimed and not yet
	// recorded: being sent now (or held by a relay that died, until its
	// lease ends).
	InFlight int64
	// Dead is how many events were given up on ([Table.DeadLetters]).
	Dead int64
	// OldestPending is the age of the oldest undelivered event that is
	// not dead (pending or in flight), 0 if there is none: how far
	// delivery lags behind.
	OldestPending time.Duration
}

// Backlog returns the outbox's backlog, in one statement bounded by
// [Options.Timeout]. It counts the pending and dead events through their
// partial indexes, so it costs in proportion to the backlog (not to the
// delivered events kept): call it from a metrics collection every few
// seconds or more, not per request. Relays do not call it; they pay
// nothing for it.
func (t *Table) Backlog(ctx context.Context) (Backlog, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	var b Backlog
	var oldest int64
	if err := t.db.QueryRow(ctx, t.sql.backlog).Scan(&b.Pending, &b.Retrying, &b.InFlight, &b.Dead, &oldest); err != nil {
		return Backlog{}, wrapErr(ctx, "backlog", err)
	}
	b.OldestPending = time.Duration(oldest) * time.Microsecond
	return b, nil
}

// decodeHeaders decodes the headers column: a JSON object whose string
// values are taken as they are and other values (written by hand) as their
// JSON text.
func decodeHeaders(s string) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("outbox: the event's headers are not a JSON object: %w", err)
	}
	h := make(map[string]string, len(raw))
	for k, v := range raw {
		var str string
		if json.Unmarshal(v, &str) != nil {
			str = string(v)
		}
		h[k] = str
	}
	return h, nil
}
