// Package outbox is a transactional outbox on PostgreSQL, through pgx v5:
// events are written with [Table.Enqueue] in the caller's own transaction,
// together with the business change they describe (also inside
// [postgres.DoTx] and a [postgres.TxExecutor]'s handlers, so that request,
// idempotency key, effect and event commit or roll back together), and
// relays ([Relay]) deliver them at least once to a [Sender].
//
// Relays in several processes share the work: each takes a batch with
// SELECT ... FOR UPDATE SKIP LOCKED and claims it with a lease (one
// statement, committed at once), sends it without holding a transaction
// open, and records the outcome. A relay that dies leaves its batch
// leased; when the lease ends another relay claims it. Every event has a
// stable, unique ID ([Event.ID]) for receivers to de-duplicate on. Failed
// sends are retried with capped exponential backoff and full jitter; after
// [RelayOptions.MaxAttempts] attempts an event is dead-lettered with its
// last error, for an operator to inspect ([Table.DeadLetters]) and redrive
// ([Table.Redrive], [Table.RedriveAll]); [Table.Backlog] counts what waits,
// what is being sent and what is dead. Events with an ordering key ([Event.Key]) are
// delivered in order per key, and a failing event holds back only its
// key. Relays wake up on LISTEN/NOTIFY and poll as the fallback, and
// delete delivered events after a retention ([Options.Retention]).
//
// The schema is embedded and applied by [Table.Migrate], or copied from
// [Schema] into golang-migrate, goose or Atlas migrations.
package outbox

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults and limits of [Options].
const (
	DefaultTable          = "outbox_events"
	DefaultMaxPayloadSize = 1 << 20
	DefaultRetention      = 24 * time.Hour
	DefaultTimeout        = 5 * time.Second
	DefaultCleanupBatch   = 1000

	// MinTimeout is the shortest [Options.Timeout] accepted.
	MinTimeout = 10 * time.Millisecond

	// MaxIDLen is the longest event ID, in bytes.
	MaxIDLen = 255
	// MaxKeyLen is the longest topic or ordering key, in bytes.
	MaxKeyLen = 1024
)

// maxPayloadLimit keeps payloads well under PostgreSQL's 1 GB field limit.
const maxPayloadLimit = 256 << 20

// Options configure a [Table]. The zero value (or nil) means defaults.
type Options struct {
	// Schema is the PostgreSQL schema of the table. Default: none, so the
	// table is found through the search_path.
	Schema string
	// Table is the table's name; its indexes (Table+"_pending_idx",
	// "_key_idx", "_done_idx", "_dead_idx") and its notification channel
	// are named after it. It must be an identifier: a letter or
	// underscore, then letters, digits or underscores, at most 48 bytes
	// (63 for the schema). Default: [DefaultTable].
	Table string
	// MaxPayloadSize is the largest payload, in bytes, that Enqueue
	// accepts; a larger one is refused before anything is written. At most
	// 256 MiB. Default: [DefaultMaxPayloadSize] (1 MiB).
	MaxPayloadSize int
	// Retention is how long delivered events are kept before the cleanup
	// ([Table.Cleanup], which relays run) deletes them, so that one can
	// see what was sent and when. Dead events are kept until redriven or
	// deleted. Default: [DefaultRetention] (24h).
	Retention time.Duration
	// DeleteDelivered makes relays delete each event as soon as it is
	// delivered, instead of marking it delivered and keeping it for
	// Retention: a delete instead of an update (a new row version and
	// its index entries), and no cleanup later, so the relays deliver
	// more events per second (see the README's figures). Nothing is left
	// to look at afterwards. Default: keep delivered events.
	DeleteDelivered bool
	// CleanupBatch is how many events one statement of the cleanup
	// deletes, or of [Table.RedriveAll] redrives. Default:
	// [DefaultCleanupBatch].
	CleanupBatch int
	// Timeout bounds every statement the table runs on its own DB: a
	// relay's claims and updates, Cleanup, DeadLetters and Redrive (not
	// Enqueue, which runs in the caller's transaction under the caller's
	// context). At least [MinTimeout]. Default: [DefaultTimeout] (5s).
	Timeout time.Duration
	// NoNotify stops Enqueue from notifying relays (pg_notify, sent when
	// the caller's transaction commits), so that relays find new events by
	// polling only ([RelayOptions.PollInterval]). A notifying transaction
	// takes a server-wide lock while it commits, which serializes the
	// commits of all notifying transactions; set NoNotify when enqueueing
	// transactions commit at rates where that matters more than the
	// relays' latency. Default: notify.
	NoNotify bool
}

// Table is an outbox: a PostgreSQL table of events, and the statements to
// enqueue, relay, clean up and inspect them. It is safe for concurrent use
// if its DB is.
type Table struct {
	db      postgres.DB
	opts    Options
	names   objectNames
	sql     statements
	channel string // notification channel
}

// Errors of the package. Match them with errors.Is.
var (
	// ErrNotMigrated matches errors of statements that did not find the
	// outbox table or its schema (SQLSTATE 42P01, 3F000): run
	// [Table.Migrate], or the SQL of [Schema], with the same Options
	// first. The error still wraps the *pgconn.PgError.
	ErrNotMigrated = errors.New("outbox: the outbox table or its schema does not exist")

	// ErrRelayRunning is returned by [Relay.Run] while the same Relay is
	// already running.
	ErrRelayRunning = errors.New("outbox: relay already running")
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// New returns the outbox table on db, a *pgxpool.Pool (relays run
// statements on it and, by default, make their LISTEN connections with its
// configuration) or anything else with Exec, Query and QueryRow; db is
// never closed. New checks opts but does not touch the database; run
// [Table.Migrate] (or the SQL of [Schema]) once before use. It returns an
// error wrapping [idempotency.ErrInvalidArgument] for a nil db or invalid
// options, naming the option.
func New(db postgres.DB, opts *Options) (*Table, error) {
	if db == nil {
		return nil, invalid("nil db")
	}
	o, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	n := names(o)
	ch := channelName(o)
	return &Table{db: db, opts: o, names: n, sql: buildStatements(n, ch, lockClass(o), o.DeleteDelivered), channel: ch}, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: outbox: "+format, append([]any{idempotency.ErrInvalidArgument}, args...)...)
}

func withDefaults(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.MaxPayloadSize == 0 {
		o.MaxPayloadSize = DefaultMaxPayloadSize
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.CleanupBatch == 0 {
		o.CleanupBatch = DefaultCleanupBatch
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	switch {
	case !identRE.MatchString(o.Table) || len(o.Table) > 48:
		return o, invalid("Options.Table %q is not an identifier of at most 48 bytes", o.Table)
	case o.Schema != "" && (!identRE.MatchString(o.Schema) || len(o.Schema) > 63):
		return o, invalid("Options.Schema %q is not an identifier of at most 63 bytes", o.Schema)
	case o.MaxPayloadSize < 0 || o.MaxPayloadSize > maxPayloadLimit:
		return o, invalid("Options.MaxPayloadSize must be in 1..%d, got %d", maxPayloadLimit, o.MaxPayloadSize)
	case o.Retention < 0:
		return o, invalid("Options.Retention must be positive, got %v", o.Retention)
	case o.CleanupBatch < 0:
		return o, invalid("Options.CleanupBatch must be positive, got %d", o.CleanupBatch)
	case o.Timeout < MinTimeout:
		return o, invalid("Options.Timeout (%v) is shorter than %v: statements this short time out under ordinary load, and relays deliver nothing (if the unit was missed, write it: 5*time.Second)", o.Timeout, MinTimeout)
	}
	return o, nil
}

// objectNames are the SQL names of the table.
type objectNames struct {
	Table string // quoted, qualified table
	Lock  string // plain qualified name, keys the migration's advisory lock
}

func names(o Options) objectNames {
	n := objectNames{Table: `"` + o.Table + `"`, Lock: o.Table}
	if o.Schema != "" {
		n.Table = `"` + o.Schema + `".` + n.Table
		n.Lock = o.Schema + "." + o.Table
	}
	return n
}

// channelName is the notification channel of the table: its name, then
// 8 hex digits of a hash of its qualified name, so that tables of the
// same name in different schemas use different channels. At most 57
// bytes, under PostgreSQL's 63.
func channelName(o Options) string {
	h := sha256.Sum256([]byte("outbox:" + o.Schema + "." + o.Table))
	return o.Table + "_" + hex.EncodeToString(h[:4])
}

// lockClass is the first key of the advisory locks that order the enqueues
// of one ordering key (the second is hashtext of the key): a hash of the
// qualified table name, so that outbox tables do not wait for each other.
func lockClass(o Options) int32 {
	h := sha256.Sum256([]byte("outbox-lock:" + o.Schema + "." + o.Table))
	return int32(binary.BigEndian.Uint32(h[:4]))
}

//go:embed schema.sql
var schemaTemplate string

// Schema returns the SQL that creates the outbox table and its indexes for
// opts (nil means defaults), for teams that apply migrations with
// golang-migrate, goose or Atlas instead of [Table.Migrate]. Every
// statement is idempotent (IF NOT EXISTS). It returns an error wrapping
// [idempotency.ErrInvalidArgument] for invalid options.
func Schema(opts *Options) (string, error) {
	o, err := withDefaults(opts)
	if err != nil {
		return "", err
	}
	return renderSchema(o), nil
}

// renderSchema fills in schema.sql's names; they are validated
// identifiers, so quoting them is enough.
func renderSchema(o Options) string {
	create := ""
	if o.Schema != "" {
		create = `CREATE SCHEMA IF NOT EXISTS "` + o.Schema + `";` + "\n"
	}
	return strings.NewReplacer("{CREATE_SCHEMA}", create, "{T}", names(o).Table, "{NAME}", o.Table).Replace(schemaTemplate)
}

// DefaultMigrateTimeout bounds [Table.Migrate] when its context has no
// deadline, as [postgres.DefaultMigrateTimeout] does for the store.
const DefaultMigrateTimeout = time.Minute

// migrateLockClass is the first key of the migration's advisory lock; the
// second is a hash of the table's name. (The store's is 0x1de7.)
const migrateLockClass = 0x1de8

// Migrate creates the outbox table and its indexes if they do not exist.
// It is safe to run repeatedly and from several instances at once: the
// statements run in one implicit transaction that first takes an
// advisory lock keyed by the table's name. When ctx has no deadline,
// Migrate gives up after [DefaultMigrateTimeout].
func (t *Table) Migrate(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultMigrateTimeout)
		defer cancel()
	}
	sql := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, hashtext('%s'));\n", migrateLockClass, t.names.Lock) + renderSchema(t.opts)
	// Without arguments pgx sends this as one simple-protocol query, which
	// PostgreSQL runs as a single (implicit) transaction.
	if _, err := t.db.Exec(ctx, sql); err != nil {
		return wrapErr(ctx, "migrate", err)
	}
	return nil
}

// Event is what [Table.Enqueue] writes.
type Event struct {
	// ID identifies the event for good: the relay hands it to the sender
	// with every attempt, and receivers de-duplicate on it (delivery is at
	// least once). At most [MaxIDLen] bytes of UTF-8 without NUL. Default:
	// a new random, time-ordered UUID ([NewEventID]). An ID of your own
	// (one derived from the request, say with [idempotency.DownstreamKey])
	// must be unique too: the table does not check it, and a receiver
	// would drop the second event as a duplicate of the first.
	ID string
	// Topic is for the sender to route on (a broker topic, a webhook
	// endpoint). Optional; at most [MaxKeyLen] bytes.
	Topic string
	// Key is the ordering key: events with the same Key are delivered in
	// the order they were enqueued (across transactions: in commit order),
	// each only after the one before it was delivered, so a failing event
	// holds back the events of its key and no others. Empty: no ordering.
	// At most [MaxKeyLen] bytes.
	Key string
	// Payload is the event's body, at most [Options.MaxPayloadSize] bytes.
	Payload []byte
	// Headers are optional metadata (a trace context, a content type).
	Headers map[string]string
}

// Message is an event as a relay hands it to the [Sender].
type Message struct {
	Event
	// Attempt is 1 on the first delivery attempt, and one more on each
	// retry. A relay that stopped mid-send counts an attempt too.
	Attempt int
	// EnqueuedAt is when the event was written (the server's clock).
	EnqueuedAt time.Time
}

// Enqueue writes events in tx, the caller's transaction: they become
// visible to relays when tx commits, and vanish if it rolls back. Use the
// same tx as the business change they describe (in [postgres.DoTx], the
// tx fn gets; in a [postgres.TxExecutor] handler, [postgres.TxFromContext])
// so that both commit or neither does.
//
// Events are added in the order given. For events with an ordering key,
// Enqueue takes a transaction-scoped advisory lock per key, so that
// transactions enqueueing the same key commit one after the other and the
// relay delivers their events in commit order; enqueue such events after
// the writes they describe, and run the transaction again on a deadlock
// (SQLSTATE 40P01, as [postgres.RunInTx] does). Unless
// [Options.NoNotify] is set, the relays are notified when tx commits.
//
// Invalid events (see [Event]) give an error wrapping
// [idempotency.ErrInvalidArgument] before anything is sent, so tx stays
// usable. Enqueue is one statement, bounded by ctx.
func (t *Table) Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if tx == nil {
		return invalid("Enqueue: nil transaction")
	}
	if len(events) == 0 {
		return nil
	}
	n := len(events)
	ids, topics, keys, headers := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads := make([][]byte, n)
	keyed, headed := false, false
	for i, e := range events {
		if err := t.checkEvent(e); err != nil {
			return fmt.Errorf("%w (event %d of %d; nothing was written)", err, i+1, n)
		}
		ids[i] = e.ID
		if ids[i] == "" {
			ids[i] = NewEventID()
		}
		topics[i], keys[i] = e.Topic, e.Key
		keyed = keyed || e.Key != ""
		payloads[i] = e.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		if len(e.Headers) > 0 {
			b, err := json.Marshal(e.Headers)
			if err != nil {
				return invalid("Enqueue: event %d: headers: %v", i+1, err)
			}
			headers[i] = string(b)
			headed = true
		}
	}
	// A column no event uses goes as NULL, which unnest pads with NULLs:
	// less to encode and to decode.
	if !keyed {
		keys = nil
	}
	if !headed {
		headers = nil
	}
	sql := t.sql.enqueue
	switch {
	case keyed && !t.opts.NoNotify:
		sql = t.sql.enqueueKeyedNotify
	case keyed:
		sql = t.sql.enqueueKeyed
	case !t.opts.NoNotify:
		sql = t.sql.enqueueNotify
	}
	if _, err := tx.Exec(ctx, sql, ids, topics, keys, payloads, headers); err != nil {
		return wrapErr(ctx, "enqueue", err)
	}
	return nil
}

func (t *Table) checkEvent(e Event) error {
	text := func(what, s string, max int) error {
		switch {
		case len(s) > max:
			return invalid("Enqueue: Event.%s is %d bytes, more than %d", what, len(s), max)
		case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
			return invalid("Enqueue: Event.%s is not UTF-8 without NUL", what)
		}
		return nil
	}
	if err := text("ID", e.ID, MaxIDLen); err != nil {
		return err
	}
	if err := text("Topic", e.Topic, MaxKeyLen); err != nil {
		return err
	}
	if err := text("Key", e.Key, MaxKeyLen); err != nil {
		return err
	}
	if len(e.Payload) > t.opts.MaxPayloadSize {
		return invalid("Enqueue: Event.Payload is %d bytes, more than Options.MaxPayloadSize (%d)", len(e.Payload), t.opts.MaxPayloadSize)
	}
	for k, v := range e.Headers {
		// jsonb refuses \u0000.
		if err := text("Headers key", k, MaxKeyLen); err != nil {
			return err
		}
		if err := text("Headers value", v, maxPayloadLimit); err != nil {
			return err
		}
	}
	return nil
}

// wrapErr wraps a database error from op. It matches ErrNotMigrated for
// a missing table or schema, and keeps the native error (and a context
// error, when ctx is done) reachable with errors.Is and errors.As.
func wrapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if op != "migrate" && errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		return fmt.Errorf("outbox: %s: %w (%w: run Table.Migrate, or apply the SQL of outbox.Schema, with the same Options first)", op, err, ErrNotMigrated)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("outbox: %s: %w (%w)", op, err, cerr)
	}
	return fmt.Errorf("outbox: %s: %w", op, err)
}
