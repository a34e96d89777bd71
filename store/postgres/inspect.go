package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5"
)

var _ idempotency.Inspector = (*Store)(nil)

// Inspect returns the live record under key, as [idempotency.Inspector]
// documents: one SELECT, times left judged by the server's clock.
func (s *Store) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	var result []byte
	info, err := scanInfo(s.db.QueryRow(ctx, s.sql.inspect, key), &result)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idempotency.RecordInfo{}, fmt.Errorf("%w: postgres: %q", idempotency.ErrNotFound, key)
	case err != nil:
		return idempotency.RecordInfo{}, wrapErr(ctx, "inspect", err)
	}
	if info.State == idempotency.StateCompleted {
		info.Result = nonNil(result)
		info.ResultSize = len(info.Result)
	}
	return info, nil
}

// Purge deletes the record under key, as [idempotency.Inspector]
// documents. Like Release, it leaves an expired tombstone for the sweep,
// so that the claim that re-creates the record sees the old fence and
// hands out a greater one; with [Options.Notify] it wakes the record's
// waiters.
func (s *Store) Purge(ctx context.Context, key string) error {
	args := []any{key}
	if s.notify {
		args = append(args, keyHash(key))
	}
	if _, err := s.db.Exec(ctx, s.sql.purge, args...); err != nil {
		return wrapErr(ctx, "purge", err)
	}
	return nil
}

// Stuck lists the STARTED records whose lease has ended, in key order,
// as [idempotency.Inspector] documents: one SELECT on the partial index of
// STARTED rows; the cursor is the last key listed. Results are not read.
func (s *Store) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if limit <= 0 {
		return nil, "", fmt.Errorf("%w: postgres: Stuck: limit %d is not positive", idempotency.ErrInvalidArgument, limit)
	}
	rows, err := s.db.Query(ctx, s.sql.stuck, cursor, int64(limit))
	if err != nil {
		return nil, "", wrapErr(ctx, "stuck", err)
	}
	infos, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idempotency.RecordInfo, error) {
		return scanInfo(row, nil)
	})
	if err != nil {
		return nil, "", wrapErr(ctx, "stuck", err)
	}
	next := ""
	if len(infos) == limit {
		next = infos[len(infos)-1].Key
	}
	return infos, next, nil
}

// scanInfo reads the columns of infoColumns, and the result into result
// when it is not nil.
func scanInfo(row pgx.Row, result *[]byte) (idempotency.RecordInfo, error) {
	var c infoRow
	dest := []any{&c.key, &c.fingerprint, &c.state, &c.fence, &c.attempt, &c.leaseMicros, &c.expMicros, &c.checkpoints}
	if result != nil {
		dest = append(dest, result)
	}
	if err := row.Scan(dest...); err != nil {
		return idempotency.RecordInfo{}, err
	}
	return recordInfo(c)
}

// infoRow is a row of infoColumns, the result aside.
type infoRow struct {
	key, fingerprint, state string
	fence                   int64
	attempt                 int32
	leaseMicros, expMicros  int64
	checkpoints             *string // jsonb as text
}

// recordInfo turns a row of infoColumns into a RecordInfo. A state other
// than STARTED or COMPLETED, and checkpoints that cannot be decoded, give
// an error matching [idempotency.ErrCorrupt], with the rest of the record.
func recordInfo(c infoRow) (idempotency.RecordInfo, error) {
	info := idempotency.RecordInfo{
		Key:         c.key,
		Fingerprint: idempotency.Fingerprint(c.fingerprint),
		State:       idempotency.State(c.state),
		Fence:       c.fence,
		Attempt:     int(c.attempt),
		ExpiresIn:   fromMicros(c.expMicros),
	}
	switch info.State {
	case idempotency.StateCompleted:
		return info, nil
	case idempotency.StateStarted:
	default:
		return info, fmt.Errorf("postgres: key %q has unknown state %q: %w", c.key, c.state, idempotency.ErrCorrupt)
	}
	info.LeaseLeft = fromMicros(c.leaseMicros)
	var err error
	if info.Checkpoints, err = parseCheckpoints(c.key, c.checkpoints); err != nil {
		return info, fmt.Errorf("postgres: %w", err)
	}
	return info, nil
}
