// Package postgres is an [idempotency.Store] on PostgreSQL, through pgx v5,
// with a transactional mode ([DoTx]) in which the idempotency key commits in
// the caller's own transaction, together with the effect.
//
// As a plain store behind [idempotency.Do], every decision is one SQL
// statement judged by the server's clock_timestamp(): a claim first reads
// the row without locking it and inserts a fresh record only when there is
// none (so a replay takes no lock and writes nothing); a takeover, an
// expired row or a race goes on to a single INSERT ... ON CONFLICT ... DO
// UPDATE ... WHERE takeover condition. Renew, Checkpoint, Complete and
// Release are UPDATE statements conditional on the holder's token. Fences come from a sequence. Expired
// rows are treated as absent and removed by [Store.Sweep]. With
// [Options.Notify], Complete and Release also pg_notify, and [Store.Watch]
// wakes waiting duplicates through one LISTEN connection per store instead
// of polling. It is an [idempotency.Batcher]: [idempotency.DoBatch] claims
// a batch in one statement over arrays and records it in one more, each
// item decided by the clauses of its single call.
//
// The store accepts a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx through the
// narrow [DB] interface, and never closes it. The schema is embedded and
// applied by [Store.Migrate], or copied from [Schema] into golang-migrate,
// goose or Atlas migrations.
package postgres

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"text/template"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the store needs from a database handle. A *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it. The store never closes it.
//
// Given a pgx.Tx, every store operation runs inside that transaction and
// takes effect when the caller commits it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults of [Options].
const (
	DefaultTable        = "idempotency_keys"
	DefaultMaxValueSize = 1 << 20
	DefaultSweepBatch   = 1000
	// DefaultTxLockWait is the default of [Options.TxLockWait]: long
	// enough for the locks another call holds for a statement (a replay,
	// a concurrent claim, a sweep's batch), far shorter than a
	// transaction that runs fn, so a duplicate of one answers in progress
	// after holding its connection for 50 ms, not for the length of the
	// other transaction.
	DefaultTxLockWait = 50 * time.Millisecond
)

// maxValueSizeLimit keeps values well under PostgreSQL's 1 GB field limit,
// and jsonb's base64 encoding of checkpoints under it too.
const maxValueSizeLimit = 256 << 20

// Options configure a [Store]. The zero value (or nil) means defaults.
type Options struct {
	// Schema is the PostgreSQL schema of the table. Default: none, so the
	// table is found through the search_path.
	Schema string
	// Table is the table's name; its fence sequence is Table+"_fence_seq"
	// and its sweep index Table+"_sweep_at_idx". All names are used
	// exactly as given (quoted), and must be identifiers: a letter or
	// underscore, then letters, digits or underscores, at most 48 bytes
	// for the table and 63 for the schema. Default: [DefaultTable].
	Table string
	// MaxValueSize is the largest result or checkpoint value, in bytes,
	// that the store keeps; a larger one gets [idempotency.ErrTooLarge]
	// before anything is written. At most 256 MiB.
	// Default: [DefaultMaxValueSize] (1 MiB).
	MaxValueSize int
	// SweepBatch is how many expired rows one statement of [Store.Sweep]
	// deletes, so that no sweep holds many row locks for long.
	// Default: [DefaultSweepBatch].
	SweepBatch int
	// TxLockWait is how long a claim in a transaction ([DoTx], a
	// [TxExecutor], [InboxTx]) waits on the row lock of a concurrent
	// transaction holding the same key before giving up with an
	// [*idempotency.InProgressError] (HTTP 409). If the other transaction
	// ends within it, the claim replays its result or, if it rolled back,
	// runs fn.
	//
	// A waiting claim holds its transaction, and so a connection and a
	// server backend, for the whole wait: each duplicate of a running
	// transaction costs a connection for TxLockWait. Keep it short; a
	// [TxExecutor] on a runner with [idempotency.WithWait] waits longer
	// between transactions, holding no connection (see the README,
	// "What a wait costs"). It is rounded up to a millisecond, and must
	// be shorter than the runner's store timeout
	// ([idempotency.WithStoreTimeout], which bounds the claim), which
	// DoTx and NewTxExecutor check. Default: [DefaultTxLockWait].
	TxLockWait time.Duration
	// Notify makes Complete and Release send a notification (pg_notify,
	// in the same statement) on the table's channel, and enables
	// [Store.Watch], so that a waiting [idempotency.Do] wakes as soon as
	// the record it waits for completes instead of polling. Off by
	// default: a transaction that notifies takes a server-wide lock at
	// commit, which serializes the commits of all notifying transactions
	// (see the README). With it off, Watch reports that it cannot watch
	// and callers poll.
	Notify bool
	// ListenConnect opens the connection the store LISTENs on when Notify
	// is set: one connection per store, opened by the first Watch, closed
	// a few seconds after the last one returns or by [Store.Close]. It
	// must be a direct connection to the primary (not through PgBouncer's
	// transaction pooling, which does not deliver notifications). Default:
	// when the store's DB is a *pgxpool.Pool, a connection made with the
	// pool's connection configuration, outside the pool (it does not count
	// against MaxConns). With another DB and Notify set, it is required.
	ListenConnect func(ctx context.Context) (*pgx.Conn, error)
}

// Store is an [idempotency.Store] and [idempotency.Sweeper] on a PostgreSQL
// table. It is safe for concurrent use if its DB is.
//
// It implements [idempotency.Watcher], effective with [Options.Notify],
// and [idempotency.Batcher] (see [Store.ClaimBatch]).
type Store struct {
	db       DB
	opts     Options
	sql      statements
	notify   bool
	listener *listener // nil without Notify
	order    claimOrder
	// stuckScan bounds the blocks one Stuck call reads: [stuckScan], or
	// fewer in tests.
	stuckScan int
}

var (
	_ idempotency.Store         = (*Store)(nil)
	_ idempotency.Sweeper       = (*Store)(nil)
	_ idempotency.Watcher       = (*Store)(nil)
	_ idempotency.Inspector     = (*Store)(nil)
	_ idempotency.Transactional = (*Store)(nil)
	_ idempotency.Batcher       = (*Store)(nil)
)

// Capabilities reports what the store does beyond the [idempotency.Store]
// contract: it sweeps, inspects, claims and finishes batches in one
// statement each, and runs in a caller's transaction ([DoTx]); it watches
// with [Options.Notify]; it keeps values up to [Options.MaxValueSize].
func (s *Store) Capabilities() idempotency.Capabilities {
	c := idempotency.Capabilities{Inspector: s, Sweeper: s, Transactional: s, Batcher: s,
		Limits: idempotency.Limits{MaxValueSize: s.opts.MaxValueSize}}
	if s.notify {
		c.Watcher = s
	}
	return c
}

// Key returns the value of the table's key column for storageKey's
// record, as every adapter's Key returns the backend's key of a record,
// for tests and operators: the storage key itself (the primary key is
// text COLLATE "C").
func (s *Store) Key(storageKey string) string { return storageKey }

// ErrRetryable matches errors caused by a serialization failure (SQLSTATE
// 40001) or a deadlock (40P01): the transaction they happened in is lost,
// and running it again from the start may succeed. The error still wraps
// the *pgconn.PgError. See [RunInTx].
var ErrRetryable = errors.New("postgres: serialization failure or deadlock; run the transaction again")

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// New returns a store on db. It checks opts but does not touch the
// database; run [Store.Migrate] (or the SQL of [Schema]) once before use.
// It returns an error wrapping [idempotency.ErrInvalidArgument] for a nil
// db or invalid options.
func New(db DB, opts *Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: postgres: nil db", idempotency.ErrInvalidArgument)
	}
	o, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, opts: o, stuckScan: stuckScan}
	if o.Notify {
		connect := o.ListenConnect
		if connect == nil {
			pool, ok := db.(*pgxpool.Pool)
			if !ok {
				return nil, fmt.Errorf("%w: postgres: Notify needs Options.ListenConnect when the DB is a %T, not a *pgxpool.Pool", idempotency.ErrInvalidArgument, db)
			}
			cfg := pool.Config().ConnConfig
			connect = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }
		}
		s.notify = true
		s.listener = newListener(channelName(o), connect)
	}
	s.sql = buildStatements(names(o), channelName(o), s.notify)
	return s, nil
}

func withDefaults(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.MaxValueSize == 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.SweepBatch == 0 {
		o.SweepBatch = DefaultSweepBatch
	}
	if o.TxLockWait == 0 {
		o.TxLockWait = DefaultTxLockWait
	}
	invalid := func(format string, args ...any) (Options, error) {
		return o, fmt.Errorf("%w: postgres: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
	}
	switch {
	case !identRE.MatchString(o.Table) || len(o.Table) > 48:
		return invalid("table name %q is not an identifier of at most 48 bytes", o.Table)
	case o.Schema != "" && (!identRE.MatchString(o.Schema) || len(o.Schema) > 63):
		return invalid("schema name %q is not an identifier of at most 63 bytes", o.Schema)
	case o.MaxValueSize < 0 || o.MaxValueSize > maxValueSizeLimit:
		return invalid("MaxValueSize must be in 1..%d, got %d", maxValueSizeLimit, o.MaxValueSize)
	case o.SweepBatch < 0:
		return invalid("SweepBatch must be positive, got %d", o.SweepBatch)
	case o.TxLockWait < 0:
		return invalid("Options.TxLockWait must not be negative, got %v", o.TxLockWait)
	}
	return o, nil
}

// objectNames are the quoted SQL names of the store's objects.
type objectNames struct {
	Schema string // quoted schema, or ""
	Table  string // quoted, qualified table
	Seq    string // quoted, qualified sequence
	Index  string // quoted name of the sweep index (indexes live in their table's schema)
	Lock   string // plain qualified name, keys the migration's advisory lock
	// OldIndexes are the quoted, qualified names of the indexes of tables
	// made before sweep_at, which Migrate drops from such a table.
	OldIndexes string
}

func names(o Options) objectNames {
	q := func(s string) string { return `"` + s + `"` }
	n := objectNames{
		Table: q(o.Table),
		Seq:   q(o.Table + "_fence_seq"),
		Index: q(o.Table + "_sweep_at_idx"),
		Lock:  o.Table,
	}
	old := []string{q(o.Table + "_expires_at_idx"), q(o.Table + "_started_idx")}
	if o.Schema != "" {
		n.Schema = q(o.Schema)
		n.Table = n.Schema + "." + n.Table
		n.Seq = n.Schema + "." + n.Seq
		n.Lock = o.Schema + "." + o.Table
		for i := range old {
			old[i] = n.Schema + "." + old[i]
		}
	}
	n.OldIndexes = strings.Join(old, ", ")
	return n
}

//go:embed schema.sql
var schemaTemplate string

var schemaTmpl = template.Must(template.New("schema").Parse(schemaTemplate))

// Schema returns the SQL that creates the store's table, sequence and indexes
// for opts (nil means defaults), for teams that apply migrations with
// golang-migrate, goose or Atlas instead of [Store.Migrate]. Every statement
// is idempotent (IF NOT EXISTS). It returns an error wrapping
// [idempotency.ErrInvalidArgument] for invalid options.
func Schema(opts *Options) (string, error) {
	o, err := withDefaults(opts)
	if err != nil {
		return "", err
	}
	return renderSchema(names(o)), nil
}

func renderSchema(n objectNames) string {
	var b bytes.Buffer
	if err := schemaTmpl.Execute(&b, n); err != nil {
		panic(err) // the template is fixed and its names validated
	}
	return b.String()
}

// Migrate creates the store's table, sequence and indexes if they do not
// exist. It is safe to run repeatedly and from several instances at once:
// the statements run in one implicit transaction that first takes an
// advisory lock keyed by the table's name. Given a pgx.Tx, it runs inside
// it and holds the lock until the caller commits.
//
// When ctx has no deadline, Migrate gives up after [DefaultMigrateTimeout],
// so that a database that accepts connections but never answers fails a
// deployment step instead of hanging it; pass a context with a deadline of
// its own to wait longer or shorter.
func (s *Store) Migrate(ctx context.Context) error {
	bounded := false
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, migrateTimeout)
		defer cancel()
		bounded = true
	}
	n := names(s.opts)
	sql := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, hashtext('%s'));\n", migrateLockClass, n.Lock) + renderSchema(n)
	// Without arguments pgx sends this as one simple-protocol query, which
	// PostgreSQL runs as a single (implicit) transaction.
	if _, err := s.db.Exec(ctx, sql); err != nil {
		if bounded && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%w (no answer within %v, the bound of a context without a deadline: give Migrate a context with a deadline to wait longer)", wrapErr(ctx, "migrate", err), migrateTimeout)
		}
		return wrapErr(ctx, "migrate", err)
	}
	return nil
}

// DefaultMigrateTimeout bounds [Store.Migrate] when its context has no
// deadline. A minute is far more than the statements take, even when
// instances that start together wait for each other's migration, and
// short enough that a database that does not answer fails the deployment.
const DefaultMigrateTimeout = time.Minute

// migrateTimeout is DefaultMigrateTimeout, shortened by tests.
var migrateTimeout = DefaultMigrateTimeout

// migrateLockClass is the first key of the migration's advisory lock; the
// second is a hash of the table's name.
const migrateLockClass = 0x1de7

// ErrNotMigrated matches errors of store statements that did not find the
// store's table, fence sequence or schema (SQLSTATE 42P01 undefined_table,
// 3F000 invalid_schema_name): run [Store.Migrate], or the SQL of [Schema],
// before using the store, with the same Options. The error still wraps the
// *pgconn.PgError.
var ErrNotMigrated = errors.New("postgres: the store's table, sequence or schema does not exist")

// storeError wraps a database error from op. It matches ErrRetryable for
// serialization failures and deadlocks, ErrNotMigrated for a missing table,
// sequence or schema, and keeps the native error (and a context error, when
// ctx is done) reachable with errors.Is and errors.As.
type storeError struct {
	op          string
	err         error
	retryable   bool
	notMigrated bool
	ctxErr      error
}

func (e *storeError) Error() string {
	s := "postgres: " + e.op + ": " + e.err.Error()
	if e.retryable {
		s += " (retryable: run the transaction again)"
	}
	if e.notMigrated {
		s += " (the store's table, fence sequence or schema is missing: run Store.Migrate, or apply the SQL of postgres.Schema, with the store's Options first)"
	}
	return s
}

func (e *storeError) Unwrap() []error {
	if e.ctxErr != nil {
		return []error{e.err, e.ctxErr}
	}
	return []error{e.err}
}

func (e *storeError) Is(target error) bool {
	return target == ErrRetryable && e.retryable || target == ErrNotMigrated && e.notMigrated
}

func wrapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	e := &storeError{op: op, err: err, retryable: isRetryableCode(err)}
	var pe *pgconn.PgError
	if op != "migrate" && errors.As(err, &pe) {
		e.notMigrated = pe.Code == "42P01" || pe.Code == "3F000"
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		e.ctxErr = cerr
	}
	return e
}

func isRetryableCode(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	return false
}

// IsRetryable reports whether err comes from a serialization failure
// (40001) or a deadlock (40P01), whether or not this package wrapped it:
// the transaction it happened in should be run again from the start.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrRetryable) || isRetryableCode(err)
}
