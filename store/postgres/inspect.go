package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

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

// stuckScan is how many blocks of the table (8 kB each, by default) one
// call of Stuck reads at most: a bound on the work of one call (tens of
// milliseconds), whatever the size of the table.
const stuckScan = 1000

// Stuck lists the STARTED records whose lease has ended, as
// [idempotency.Inspector] documents, in the table's physical order: one
// SELECT, which reads the rows stored in the next stuckScan blocks of the
// table after the cursor (a TID range scan: PostgreSQL 14 or later; older
// versions read the whole table for every page) and lists the stuck ones
// among them, at most limit. The cursor is a tuple ID, of the last record
// listed or of the end of the blocks read; a page may list none and still
// have a next one. No index lists STARTED rows, as that would cost every
// claim and completion: a full pass reads the whole table, paid by the
// caller. Results are not read.
func (s *Store) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if limit <= 0 {
		return nil, "", fmt.Errorf("%w: postgres: Stuck: limit %d is not positive", idempotency.ErrInvalidArgument, limit)
	}
	block, offset, ok := parseTID(cursor)
	if !ok {
		return nil, "", fmt.Errorf("%w: postgres: Stuck: cursor %q is not one that Stuck returned", idempotency.ErrInvalidArgument, cursor)
	}
	end := min(block+uint64(s.stuckScan), math.MaxUint32)
	rows, err := s.db.Query(ctx, s.sql.stuck, formatTID(block, offset), int64(limit), formatTID(end, 0))
	if err != nil {
		return nil, "", wrapErr(ctx, "stuck", err)
	}
	var (
		infos               []idempotency.RecordInfo
		lastTID, blocks     string
		summary, summarized bool
		corrupt             error
	)
	for rows.Next() {
		var c infoRow
		var tid string
		if err := rows.Scan(append([]any{&summary, &tid}, c.dest()...)...); err != nil {
			rows.Close()
			return nil, "", wrapErr(ctx, "stuck", err)
		}
		if summary {
			blocks, summarized = tid, true
			continue
		}
		info, err := recordInfo(c)
		if err != nil {
			corrupt = err
		}
		infos, lastTID = append(infos, info), tid
	}
	if err := rows.Err(); err != nil {
		return nil, "", wrapErr(ctx, "stuck", err)
	}
	size, err := strconv.ParseUint(blocks, 10, 64)
	if !summarized || err != nil {
		return nil, "", fmt.Errorf("postgres: stuck: no size of the table in the statement's last row (%q)", blocks)
	}
	if corrupt != nil {
		return nil, "", wrapErr(ctx, "stuck", corrupt)
	}
	next := ""
	switch {
	case len(infos) == limit:
		next = lastTID
	case end < size:
		next = formatTID(end, 0)
	}
	return infos, next, nil
}

// parseTID parses a tuple ID as PostgreSQL writes one, "(block,offset)";
// "" is the one before the first tuple, (0,0).
func parseTID(s string) (block, offset uint64, ok bool) {
	if s == "" {
		return 0, 0, true
	}
	b, o, found := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(s, "("), ")"), ",")
	block, err1 := strconv.ParseUint(b, 10, 32)
	offset, err2 := strconv.ParseUint(o, 10, 16)
	return block, offset, found && err1 == nil && err2 == nil && s == formatTID(block, offset)
}

func formatTID(block, offset uint64) string {
	return "(" + strconv.FormatUint(block, 10) + "," + strconv.FormatUint(offset, 10) + ")"
}

// scanInfo reads the columns of infoColumns, and the result into result
// when it is not nil.
func scanInfo(row pgx.Row, result *[]byte) (idempotency.RecordInfo, error) {
	var c infoRow
	dest := c.dest()
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

// dest returns where to scan the columns of infoColumns.
func (c *infoRow) dest() []any {
	return []any{&c.key, &c.fingerprint, &c.state, &c.fence, &c.attempt, &c.leaseMicros, &c.expMicros, &c.checkpoints}
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
