package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// claimRetries bounds how often Claim runs its statement again when the
// row it conflicted with was committed after the statement's snapshot (see
// claimSQL). A second run sees it; more than a few means the key is being
// created and deleted continuously.
const claimRetries = 8

// Claim decides atomically whether the request may run: see
// [idempotency.Store.Claim]. Each statement it runs decides alone (see
// claimInsertSQL); a fresh key or a replay takes one.
//
// In a transaction bound to ctx ([DoTx], a [TxExecutor]), the claim runs
// in tx inside a savepoint, and holds the key's row lock until tx ends; a
// lock wait longer than [Options.TxLockWait] answers
// [idempotency.OutcomeInProgress].
func (s *Store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := idempotency.ValidateClaim("postgres", r); err != nil {
		return idempotency.ClaimResult{}, err
	}
	if b := s.txOf(ctx); b != nil {
		return s.claimTx(ctx, b.tx, r)
	}
	return s.claim(ctx, s.db, r)
}

func (s *Store) claim(ctx context.Context, db DB, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	// The plain statements first (see claimInsertSQL): they decide fresh
	// keys, replays, mismatches and claims in progress without a lock;
	// takeovers, expired rows and races go on to the locking statement.
	if s.order.readFirst() {
		res, found, decided, err := s.claimRead(ctx, db, r)
		if err == nil {
			s.order.record(found)
		}
		if err != nil || decided {
			return res, err
		}
		if !found {
			if res, inserted, err := s.claimInsert(ctx, db, r); err != nil || inserted {
				return res, err
			}
		}
	} else {
		res, inserted, err := s.claimInsert(ctx, db, r)
		if err == nil {
			s.order.record(!inserted)
		}
		if err != nil || inserted {
			return res, err
		}
		if res, _, decided, err := s.claimRead(ctx, db, r); err != nil || decided {
			return res, err
		}
	}
	for range claimRetries {
		res, ok, err := s.claimOnce(ctx, db, r)
		if err != nil || ok {
			return res, err
		}
	}
	return idempotency.ClaimResult{}, fmt.Errorf("postgres: claim: the row of key %q kept changing under the statement %d times; try again", r.Key, claimRetries)
}

// claimInsert runs claimInsertSQL: inserted reports whether it created
// the record, which res then acquires.
func (s *Store) claimInsert(ctx context.Context, db DB, r idempotency.ClaimRequest) (res idempotency.ClaimResult, inserted bool, err error) {
	var fence int64
	err = db.QueryRow(ctx, s.sql.claimInsert, r.Key, string(r.Fingerprint), string(r.Token), micros(r.Lease), micros(r.Grace)).Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return res, false, nil
	case err != nil:
		return res, false, wrapErr(ctx, "claim", err)
	}
	return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: fence, Attempt: 1}, true, nil
}

// claimRead runs claimReadSQL: found reports whether the key has a row,
// decided whether the row answers the claim (it is live and not the
// caller's to take).
func (s *Store) claimRead(ctx context.Context, db DB, r idempotency.ClaimRequest) (res idempotency.ClaimResult, found, decided bool, err error) {
	var row readRow
	err = db.QueryRow(ctx, s.sql.claimRead, r.Key).Scan(&row.fence, &row.attempt, &row.fingerprint, &row.state, &row.token,
		&row.leaseUntil, &row.expiresAt, &row.result, &row.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, false, false, nil
	}
	if err != nil {
		return res, false, false, wrapErr(ctx, "claim", err)
	}
	res, decided, err = claimResult(row.claimRow(r), r)
	if err == nil && res.Outcome == idempotency.OutcomeReplay && row.expiresAt.InfinityModifier == pgtype.Finite {
		// The read has the row's expiry and the server's clock: say when
		// it expires at no cost.
		res.ExpiresIn = max(row.expiresAt.Time.Sub(row.now.Time), 0)
	}
	return res, true, decided, err
}

// readRow is the row of claimReadSQL.
type readRow struct {
	fence                      int64
	attempt                    int32
	fingerprint, state, token  string
	leaseUntil, expiresAt, now pgtype.Timestamptz
	result                     []byte
}

// claimRow judges the row by the server's clock as claimSQL's last part
// does: stale when expired or the caller's to take, and the time left on
// the lease.
func (rr readRow) claimRow(r idempotency.ClaimRequest) claimRow {
	now := rr.now.Time
	live := after(rr.expiresAt, now)
	leased := after(rr.leaseUntil, now)
	c := claimRow{
		fence: rr.fence, attempt: rr.attempt, fingerprint: &rr.fingerprint, state: &rr.state, result: rr.result,
		stale: !live || rr.state == string(idempotency.StateStarted) && rr.fingerprint == string(r.Fingerprint) &&
			(!leased || rr.token == string(r.Token)),
	}
	switch {
	case rr.leaseUntil.InfinityModifier == pgtype.Infinity:
		c.retryAfterMicros = math.MaxInt64
	case leased:
		c.retryAfterMicros = rr.leaseUntil.Time.Sub(now).Microseconds()
	}
	return c
}

// after reports whether t is after now, infinities included.
func after(t pgtype.Timestamptz, now time.Time) bool {
	switch t.InfinityModifier {
	case pgtype.Infinity:
		return true
	case pgtype.NegativeInfinity:
		return false
	}
	return t.Time.After(now)
}

// claimOrder chooses which of Claim's two plain statements runs first.
// Either order gives the same outcome; they differ in round trips. The
// insertion first answers a fresh key in one statement and a key with a
// row in two; the read first does the opposite. A store mostly sees fresh
// keys (a retry is the exception), so it starts with the insertion; when
// most recent claims found a row (a retry storm, a replay-heavy consumer)
// it reads first. The count is a saturating counter of the last claims,
// moved without locks: a lost update costs a round trip, never an outcome.
type claimOrder struct {
	found atomic.Int32
	pin   int32 // tests: 0 adapts, pinInsert or pinRead fixes the order
}

// claimOrderMax is the counter's ceiling; reads go first above half.
const claimOrderMax = 32

const (
	pinInsert = 1
	pinRead   = 2
)

func (o *claimOrder) readFirst() bool {
	if o.pin != 0 {
		return o.pin == pinRead
	}
	return o.found.Load() > claimOrderMax/2
}

// record counts whether a claim's first statement found a row.
func (o *claimOrder) record(found bool) {
	n := o.found.Load()
	switch {
	case found && n < claimOrderMax:
		o.found.Store(n + 1)
	case !found && n > 0:
		o.found.Store(n - 1)
	}
}

// claimOnce runs the claim statement. ok is false when the statement could
// not see the row it conflicted with and must run again.
func (s *Store) claimOnce(ctx context.Context, db DB, r idempotency.ClaimRequest) (res idempotency.ClaimResult, ok bool, err error) {
	row := db.QueryRow(ctx, s.sql.claim, r.Key, string(r.Fingerprint), string(r.Token), micros(r.Lease), micros(r.Grace))
	return s.scanClaim(ctx, row, r)
}

// scanClaim reads the claim statement's row into a result.
func (s *Store) scanClaim(ctx context.Context, row pgx.Row, r idempotency.ClaimRequest) (res idempotency.ClaimResult, ok bool, err error) {
	var c claimRow
	err = row.Scan(&c.acquired, &c.fence, &c.attempt, &c.checkpoints, &c.fingerprint, &c.state, &c.retryAfterMicros, &c.result, &c.stale)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return res, false, nil
		}
		return res, false, wrapErr(ctx, "claim", err)
	}
	return claimResult(c, r)
}

// claimRow is the row of the claim statement (see claimSQL).
type claimRow struct {
	acquired, stale    bool
	fence              int64
	attempt            int32
	checkpoints        *string // jsonb as text
	fingerprint, state *string
	retryAfterMicros   int64
	result             []byte
}

// claimResult decides the result of a claim from the statement's row. ok is
// false when the row is one the statement must run again for. A row that
// no statement of this version returns (damage, another version's schema)
// gives an error, never a panic or an outcome it does not say.
func claimResult(c claimRow, r idempotency.ClaimRequest) (res idempotency.ClaimResult, ok bool, err error) {
	res.Fence = c.fence
	res.Attempt = int(c.attempt)
	switch {
	case c.acquired:
		res.Outcome = idempotency.OutcomeAcquired
		if res.Checkpoints, err = parseCheckpoints(r.Key, c.checkpoints); err != nil {
			return idempotency.ClaimResult{}, false, fmt.Errorf("postgres: claim: %w", err)
		}
	case c.stale:
		// The row we read is one ON CONFLICT would have taken: it changed
		// between the two parts of the statement. Decide again.
		return idempotency.ClaimResult{}, false, nil
	case c.fingerprint == nil || c.state == nil:
		return idempotency.ClaimResult{}, false, fmt.Errorf("postgres: claim: incomplete row for key %q", r.Key)
	case *c.fingerprint != string(r.Fingerprint):
		res.Outcome = idempotency.OutcomeMismatch
	case *c.state == string(idempotency.StateCompleted):
		res.Outcome = idempotency.OutcomeReplay
		res.Result = c.result
		if res.Result == nil {
			res.Result = []byte{}
		}
	case *c.state == string(idempotency.StateStarted):
		res.Outcome = idempotency.OutcomeInProgress
		res.RetryAfter = fromMicros(c.retryAfterMicros)
	default:
		return idempotency.ClaimResult{}, false, fmt.Errorf("postgres: claim: key %q has unknown state %q: %w", r.Key, *c.state, idempotency.ErrCorrupt)
	}
	return res, true, nil
}

// parseCheckpoints decodes the checkpoints column (jsonb as text, NULL for
// none) of key's row: an object of base64 values, as encoding/json writes
// a map[string][]byte. What is not gives an error matching
// [idempotency.ErrCorrupt].
func parseCheckpoints(key string, text *string) (map[string][]byte, error) {
	if text == nil {
		return nil, nil
	}
	var m map[string][]byte
	err := json.Unmarshal([]byte(*text), &m)
	for name, v := range m {
		if err == nil && v == nil {
			err = fmt.Errorf("checkpoint %q is null", name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("corrupt checkpoints of key %q: %w: %w", key, idempotency.ErrCorrupt, err)
	}
	return m, nil
}

// fromMicros converts microseconds to a duration, saturating instead of
// overflowing; negative counts as zero.
func fromMicros(us int64) time.Duration {
	switch {
	case us <= 0:
		return 0
	case us > math.MaxInt64/int64(time.Microsecond):
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// Renew extends the lease held under token: see [idempotency.Store.Renew].
func (s *Store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: postgres: lease must be positive, got %v", idempotency.ErrInvalidArgument, lease)
	}
	tag, err := s.dbFor(ctx).Exec(ctx, s.sql.renew, key, string(token), micros(lease))
	if err != nil {
		return wrapErr(ctx, "renew", err)
	}
	if tag.RowsAffected() == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Checkpoint stores a recovery point in the record held under token: see
// [idempotency.Store.Checkpoint]. A value larger than the store's
// MaxValueSize gets [idempotency.ErrTooLarge] and nothing is written.
func (s *Store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if len(value) > s.opts.MaxValueSize {
		return s.tooLarge("checkpoint", len(value))
	}
	tag, err := s.dbFor(ctx).Exec(ctx, s.sql.checkpoint, key, string(token), name, nonNil(value))
	if err != nil {
		return wrapErr(ctx, "checkpoint", err)
	}
	if tag.RowsAffected() == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Complete records result in the record held under token: see
// [idempotency.Store.Complete]. A result larger than the store's
// MaxValueSize gets [idempotency.ErrTooLarge] and nothing is written.
// With [Options.Notify], the statement that completes the record also
// notifies its waiters (at commit, when the store's DB is a pgx.Tx).
func (s *Store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if len(result) > s.opts.MaxValueSize {
		return s.tooLarge("complete", len(result))
	}
	if retention <= 0 {
		return fmt.Errorf("%w: postgres: retention must be positive, got %v", idempotency.ErrInvalidArgument, retention)
	}
	if b := s.txOf(ctx); b != nil {
		return s.completeTx(ctx, b, key, token, result, retention)
	}
	args := []any{key, string(token), nonNil(result), micros(retention)}
	if s.notify {
		args = append(args, keyHash(key))
	}
	tag, err := s.db.Exec(ctx, s.sql.complete, args...)
	if err != nil {
		return wrapErr(ctx, "complete", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	// Nothing changed: lost, or completed already by a repeat of this call.
	var done bool
	if err := s.db.QueryRow(ctx, s.sql.completeFallback, key, string(token)).Scan(&done); err != nil {
		return wrapErr(ctx, "complete", err)
	}
	if !done {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Release deletes the STARTED record held under token: see
// [idempotency.Store.Release]. With [Options.Notify], the statement that
// deletes the record also notifies its waiters (at commit, when the
// store's DB is a pgx.Tx).
//
// In a transaction bound to ctx, Release rolls back to the claim's
// savepoint: the claim and the writes made since vanish, and tx stays
// usable.
func (s *Store) Release(ctx context.Context, key string, token idempotency.Token) error {
	if b := s.txOf(ctx); b != nil {
		return undoClaim(ctx, b.tx)
	}
	args := []any{key, string(token)}
	if s.notify {
		args = append(args, keyHash(key))
	}
	var gone bool
	if err := s.db.QueryRow(ctx, s.sql.release, args...).Scan(&gone); err != nil {
		return wrapErr(ctx, "release", err)
	}
	if !gone {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Sweep deletes up to limit expired rows (limit <= 0: all of them), in
// statements of at most SweepBatch rows each, and reports how many it
// deleted. Each batch takes, through the index on sweep_at, the rows
// whose sweep_at has come (a row's expiry as its claim set it), locked
// with FOR UPDATE SKIP LOCKED, so sweepers on several instances share the
// work without blocking each other or a claim; it deletes those that have
// expired and moves the others' sweep_at to their expiry. It never deletes
// a live row: expiry is judged by the server's clock. Run it periodically
// (see the README); correctness never depends on it.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	total := 0
	for limit <= 0 || total < limit {
		n := s.opts.SweepBatch
		if limit > 0 {
			n = min(n, limit-total)
		}
		var locked, deleted int64
		if err := s.db.QueryRow(ctx, s.sql.sweep, int64(n)).Scan(&locked, &deleted); err != nil {
			return total, wrapErr(ctx, "sweep", err)
		}
		total += int(deleted)
		// Fewer than asked: no row is due but rows other sweepers hold
		// (they will deal with them).
		if locked < int64(n) {
			break
		}
	}
	return total, nil
}

func (s *Store) tooLarge(op string, n int) error {
	return fmt.Errorf("%w: postgres: %s: %d bytes, limit %d (Options.MaxValueSize)", idempotency.ErrTooLarge, op, n, s.opts.MaxValueSize)
}

// micros converts d to whole microseconds, rounding up so that a positive
// duration never becomes zero, and capping it where timestamps would
// overflow.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	const maxMicros = math.MaxInt64 / 1000 / 4
	us := (int64(d) + 999) / 1000
	if d > math.MaxInt64-999 {
		us = math.MaxInt64 / 1000
	}
	return min(us, maxMicros)
}

// nonNil keeps an empty value from being sent as SQL NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
