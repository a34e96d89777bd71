// Package redis is an [idempotency.Store] on Redis, through go-redis v9. It
// works with a single server, Redis Cluster, Sentinel (failover clients) and
// Ring clients.
//
// Each record is one hash; every operation is one Lua script on that key
// (and on its shard's fence mark, for the operations that hand out a
// fence or make a record live longer), run with EVALSHA (falling back to
// EVAL after SCRIPT FLUSH or a restart). [Store.Stuck], the operator's
// call, walks the keyspace with SCAN instead: the hot path keeps no index. Leases and
// retention are judged by the server's clock (TIME inside the script) and
// enforced by PEXPIRE, so expired records disappear on their own. The key
// carries a hash tag naming one of 1024 shards, derived from the whole
// storage key, so a cluster spreads records over its nodes while each
// script stays on one slot (see [Store.Key]).
//
// Redis replicates asynchronously: a failover can lose an acknowledged claim
// or completion. [Options.Replicas] makes claims and completions wait for
// replicas (WAIT); the package README spells out what each setting can lose.
//
// Every operation ends when its context does, whatever the client's
// options: by default go-redis ignores a context's deadline in socket I/O
// (Options.ContextTimeoutEnabled is false) and retries a read that timed
// out, so on such a client the store runs the call on a goroutine of its
// own and returns the context's error when the context ends (go-redis's
// own ReadTimeout ends the abandoned call later). And a server that
// refuses connections fails the operation at the first failed dial,
// instead of after go-redis's dial retries: the store adds a dial hook to
// the client (see [New]). So idempotency.WithStoreTimeout, and the core's
// default store timeout, hold with go-redis's default options. The
// goroutine is a worker kept for the next call (a new goroutine per call
// cost 35 to 45µs on a loaded two-core machine, its stack growing through
// go-redis's calls); the hand-off to it still costs 5 to 12µs per call. A
// client made with ContextTimeoutEnabled: true needs none, and is the
// faster choice.
package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	goredis "github.com/redis/go-redis/v9"
)

// Client is what the store needs from a go-redis client: running scripts.
// *redis.Client (also as built by redis.NewFailoverClient),
// *redis.ClusterClient, *redis.Ring, *redis.Conn and redis.UniversalClient
// all satisfy it.
type Client = goredis.Scripter

// Defaults of [Options].
const (
	// DefaultPrefix starts every key the store writes.
	DefaultPrefix = "idem:"
	// DefaultMaxValueSize is the largest result or checkpoint value stored:
	// 1 MiB. Redis accepts up to 512 MB, but a large value blocks the
	// server while it is copied and replicated.
	DefaultMaxValueSize = 1 << 20
	// DefaultReplicaTimeout bounds the WAIT for replicas.
	DefaultReplicaTimeout = time.Second
	// DefaultFenceMemory is how long a storage key's highest fence is
	// kept after its record is gone: an hour.
	DefaultFenceMemory = time.Hour
)

// ErrNotReplicated is returned by Claim and Complete when fewer replicas
// than [Options.Replicas] acknowledged the write within
// [Options.ReplicaTimeout]. The write was applied on the primary and may or
// may not survive a failover; repeating the operation with the same token is
// safe (and waits again).
var ErrNotReplicated = errors.New("redis: write not acknowledged by enough replicas")

// errNoNotify is returned by Watch when notifications are off.
var errNoNotify = errors.New("redis: Watch needs Options.Notify")

// Options configure a [Store]. The zero value (and nil) means the defaults.
type Options struct {
	// Prefix starts every key, to keep the records apart from other data
	// in the same database. It must not contain '{' or '}', which would
	// change the key's hash tag. Default [DefaultPrefix].
	Prefix string

	// MaxValueSize is the largest result (Complete) or checkpoint value
	// (Checkpoint) accepted, in bytes; a larger one gets
	// idempotency.ErrTooLarge before anything is written. Default
	// [DefaultMaxValueSize].
	MaxValueSize int

	// Replicas, when positive, makes Claim (when it acquires) and Complete
	// wait until that many replicas acknowledged the write, with WAIT on
	// the connection that made it (pipelined: no extra round trip), and
	// fail with [ErrNotReplicated] otherwise. Default 0: do not wait.
	// The client must be a *redis.Client (plain or failover), a
	// *redis.ClusterClient, a *redis.Ring or a *redis.Conn.
	Replicas int

	// ReplicaTimeout bounds the WAIT. Keep it below the client's
	// ReadTimeout (5s by default in go-redis v9.23), which bounds the
	// whole pipeline, and below the runner's store timeout
	// (idempotency.WithStoreTimeout), which bounds the whole call.
	// Default [DefaultReplicaTimeout].
	ReplicaTimeout time.Duration

	// Notify makes Complete, Release and Purge publish a message on the
	// record's shard channel (SPUBLISH, Redis 7.0 or later), which wakes
	// [Store.Watch] without polling. Off by default: with it off, Watch
	// reports that it cannot watch and callers poll.
	Notify bool

	// FenceMemory is how long the highest fence handed out for a storage
	// key is remembered after its record is gone (released, purged or
	// expired), in a small key next to the record. A claim that re-creates
	// the record within that time takes a fence above it even if the
	// server's clock stepped back (an NTP step, a failover to a server
	// whose clock is behind); after it, the fence comes from the clock
	// alone, which is greater than the old one unless the clock stepped back
	// by more than the time since. See the README's fence section for the
	// bound and the cost (about 100 bytes per record). Default
	// [DefaultFenceMemory]; it must be at least a millisecond.
	FenceMemory time.Duration
}

// Store is an [idempotency.Store] on Redis. It is safe for concurrent use.
// It implements [idempotency.Watcher] (effective with [Options.Notify]),
// [idempotency.Inspector] and [idempotency.Batcher].
type Store struct {
	client         Client
	prefix         string
	maxValue       int
	replicas       int
	replicaTimeout time.Duration
	notify         string // "1" or "0", passed to the scripts
	fenceMemory    string // ms, passed to the scripts
	markKeys       string // the Shards fence marks' keys, one after another (see markKey)
	match          string // the SCAN pattern of the store's record keys (see Stuck)

	// retention is the retention of the latest Complete, in ms (0 before
	// the first): claims make the fence's high-water mark cover it, so
	// that completions with the same retention need not set the mark
	// again (see scripts.go).
	retention atomic.Int64

	// clockSkew moves the scripts' clock for claims, in µs: tests step it
	// back to check that fences still grow. Always 0 outside tests, where
	// claims do not send it.
	clockSkew int64

	// honoursDeadlines: the client bounds socket I/O by the context's
	// deadline (Options.ContextTimeoutEnabled), so calls under a deadline
	// need no goroutine of their own (see [do]).
	honoursDeadlines bool
	// watch is the dial watch of a single or failover client (see
	// [Store.dialWatch]).
	watch *dialWatch
}

var (
	_ idempotency.Store     = (*Store)(nil)
	_ idempotency.Watcher   = (*Store)(nil)
	_ idempotency.Inspector = (*Store)(nil)
)

// Capabilities reports what the store does beyond the [idempotency.Store]
// contract: it watches (pub/sub), inspects, batches (pipelines, see
// [Store.ClaimBatch]; only on the client types whose nodes it can reach:
// *redis.Client, *redis.ClusterClient, *redis.Ring, *redis.Conn), and
// keeps values up to [Options.MaxValueSize]. Redis expires records
// itself: there is no Sweeper.
func (s *Store) Capabilities() idempotency.Capabilities {
	c := idempotency.Capabilities{Watcher: s, Inspector: s,
		Limits: idempotency.Limits{MaxValueSize: s.maxValue}}
	if canWait(s.client) {
		c.Batcher = s
	}
	return c
}

// New returns a store on client, which it never closes. opts may be nil.
// It returns an error wrapping idempotency.ErrInvalidArgument for a nil
// client or unusable options.
//
// On a *redis.Client (plain or failover) without ContextTimeoutEnabled,
// the store sends its commands through a clone of client made by
// [goredis.Client.WithTimeout] with client's own timeouts: the same
// connection pool and connections, the hooks client has when New is
// called, and ContextTimeoutEnabled, so that go-redis bounds each call by
// the caller's deadline itself (see call.go). Hooks added to client after
// New do not see the store's commands: add them first. A client whose
// read and write timeouts differ, or that disables socket deadlines
// (ReadTimeout or WriteTimeout -2), is used as it is.
//
// New adds a hook to a *redis.Client (plain or failover), and the store
// adds one to each node client of a *redis.ClusterClient or *redis.Ring
// it uses, once per client however many stores share it: when a dial of
// that client fails other than by a timeout, the store's operations in
// flight on it end at once with the dial's error, rather than wait out
// go-redis's dial retries (1.6s with the default options); the core then
// decides whether to try again. The hook adds nothing to commands and
// changes nothing for the client's other users.
func New(client Client, opts *Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redis: nil client", idempotency.ErrInvalidArgument)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	s := &Store{
		client:         client,
		prefix:         o.Prefix,
		maxValue:       o.MaxValueSize,
		replicas:       o.Replicas,
		replicaTimeout: o.ReplicaTimeout,
		notify:         "0",
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if strings.ContainsAny(s.prefix, "{}") {
		return nil, fmt.Errorf("%w: redis: prefix %q contains '{' or '}'", idempotency.ErrInvalidArgument, s.prefix)
	}
	switch {
	case s.maxValue == 0:
		s.maxValue = DefaultMaxValueSize
	case s.maxValue < 0:
		return nil, fmt.Errorf("%w: redis: negative MaxValueSize", idempotency.ErrInvalidArgument)
	}
	switch {
	case o.FenceMemory == 0:
		s.fenceMemory = strconv.FormatInt(DefaultFenceMemory.Milliseconds(), 10)
	case o.FenceMemory < time.Millisecond:
		return nil, fmt.Errorf("%w: redis: FenceMemory below 1ms", idempotency.ErrInvalidArgument)
	default:
		s.fenceMemory = strconv.FormatInt(millis(o.FenceMemory), 10)
	}
	if s.replicas < 0 {
		return nil, fmt.Errorf("%w: redis: negative Replicas", idempotency.ErrInvalidArgument)
	}
	switch {
	case s.replicaTimeout == 0:
		s.replicaTimeout = DefaultReplicaTimeout
	case s.replicaTimeout < time.Millisecond:
		return nil, fmt.Errorf("%w: redis: ReplicaTimeout below 1ms", idempotency.ErrInvalidArgument)
	}
	if s.replicas > 0 {
		if !canWait(client) {
			return nil, fmt.Errorf("%w: redis: Replicas needs a *redis.Client, *redis.ClusterClient, *redis.Ring or *redis.Conn, not %T", idempotency.ErrInvalidArgument, client)
		}
	}
	if o.Notify {
		if _, ok := client.(subscriber); !ok {
			return nil, fmt.Errorf("%w: redis: Notify needs a client with SSubscribe, not %T", idempotency.ErrInvalidArgument, client)
		}
		s.notify = "1"
	}
	// The fence marks' keys of all shards, in one string.
	b := make([]byte, 0, Shards*(len(s.prefix)+tagLen+len(markSuffix)))
	for shard := range Shards {
		b = append(b, s.prefix...)
		b = appendTag(b, shard)
		b = append(b, markSuffix...)
	}
	s.markKeys = string(b)
	s.match = globEscape(s.prefix) + "{???}*"
	s.honoursDeadlines = honoursDeadlines(client)
	if c, ok := client.(*goredis.Client); ok {
		s.watch = watchOf(c)
		if !s.honoursDeadlines {
			if b := boundedClone(c); b != nil {
				s.client, s.honoursDeadlines = b, true
			}
		}
	}
	return s, nil
}

// Client returns the client the store sends its commands through: the
// client given to [New], or the clone of it that New made (a
// *redis.Client without ContextTimeoutEnabled; see New). Add hooks that
// must see the store's commands, such as instrumentation, to it.
func (s *Store) Client() Client { return s.client }

// Shards is the number of hash tags the store's keys use (see
// [Store.Key]). Each shard has a fence mark: the highest fence handed out
// for its records (see the package README).
const Shards = 1024

// Key returns the Redis key of the record under storageKey: the prefix, a
// hash tag of 3 hex digits naming the key's shard (000 to 3ff: the top 10
// bits of the storage key's 64-bit FNV-1a hash, mixed by MurmurHash3's
// finalizer), then the storage key itself, e.g. "idem:{1a2}6:tenant3:abc".
// Only the tag decides the Cluster slot (and the Ring shard), so all
// operations on one storage key land on one node, and different keys
// spread evenly over [Shards] tags, which Cluster spreads over its slots;
// the storage key after the tag keeps keys distinct and readable.
//
// Next to the records, each shard has one more key, its fence mark: the
// prefix, the shard's tag, then a NUL and "fence", e.g.
// "idem:{1a2}\x00fence". A storage key never contains a NUL (the store
// refuses one), so the mark can never be taken for a record.
func (s *Store) Key(storageKey string) string {
	return s.recordKey(storageKey, shardOf(storageKey))
}

// shardOf returns the shard of a storage key: the top 10 bits of its
// 64-bit FNV-1a hash passed through MurmurHash3's finalizer. FNV-1a alone
// will not do: its last multiplication carries the last bytes of the key
// into the low bits only, so keys that differ at the end ("order-1",
// "order-2") would share their top bits and crowd into a few shards.
func shardOf(storageKey string) int {
	h := uint64(14695981039346656037)
	for i := 0; i < len(storageKey); i++ {
		h ^= uint64(storageKey[i])
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return int(h >> 54)
}

// globEscape escapes the characters that SCAN's MATCH gives a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// tagLen is the length of a hash tag with its braces: "{3ff}".
const tagLen = 5

// markSuffix follows the tag in a shard's fence mark's key.
const markSuffix = "\x00fence"

func appendTag(b []byte, shard int) []byte {
	const hexdigits = "0123456789abcdef"
	return append(b, '{', hexdigits[shard>>8&0xf], hexdigits[shard>>4&0xf], hexdigits[shard&0xf], '}')
}

func (s *Store) recordKey(storageKey string, shard int) string {
	b := make([]byte, 0, len(s.prefix)+tagLen+len(storageKey))
	b = append(b, s.prefix...)
	b = appendTag(b, shard)
	b = append(b, storageKey...)
	return string(b)
}

// markKey returns the key of a shard's fence mark, from the store's table.
func (s *Store) markKey(shard int) string {
	n := len(s.prefix) + tagLen + len(markSuffix)
	return s.markKeys[shard*n : (shard+1)*n]
}

// keys returns the record key and its shard's fence mark's key of
// storageKey, refusing a storage key with a NUL, which could name a mark.
func (s *Store) keys(storageKey string) ([]string, error) {
	if strings.IndexByte(storageKey, 0) >= 0 {
		return nil, fmt.Errorf("%w: redis: storage key %q contains a NUL", idempotency.ErrInvalidArgument, storageKey)
	}
	shard := shardOf(storageKey)
	return []string{s.recordKey(storageKey, shard), s.markKey(shard)}, nil
}

// Claim implements [idempotency.Store.Claim] with one script.
func (s *Store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, err
	}
	c, err := s.claimCall(r)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	return s.claimDone(s.call(ctx, c))
}

// claimCall is the script call that decides claim r, or r's error.
func (s *Store) claimCall(r idempotency.ClaimRequest) (scriptCall, error) {
	if err := idempotency.ValidateClaim("redis", r); err != nil {
		return scriptCall{}, err
	}
	keys, err := s.keys(r.Key)
	if err != nil {
		return scriptCall{}, err
	}
	args := []any{encodeFingerprint(r.Fingerprint), string(r.Token), millis(r.Lease), millis(r.Grace), s.retention.Load(), s.fenceMemory}
	if s.clockSkew != 0 {
		args = append(args, s.clockSkew)
	}
	return scriptCall{sc: claimScript, keys: keys, args: args, write: true}, nil
}

// claimDone reads the reply of a claim's script; an acquisition also
// needs the replicas' acknowledgment when they are required.
func (s *Store) claimDone(r ran, err error) (idempotency.ClaimResult, error) {
	if err != nil {
		return idempotency.ClaimResult{}, s.wrap("claim", err)
	}
	res, err := decodeClaim(r.v)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	if res.Outcome == idempotency.OutcomeAcquired {
		if err := s.checkWait(r.wait); err != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("redis: claim: %w", err)
		}
	}
	return res, nil
}

// Renew implements [idempotency.Store.Renew] with one script.
func (s *Store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("%w: redis: lease %v", idempotency.ErrInvalidArgument, lease)
	}
	keys, err := s.keys(key)
	if err != nil {
		return err
	}
	v, _, err := s.run(ctx, renewScript, keys, false, string(token), millis(lease), s.fenceMemory)
	return s.done("renew", v, err)
}

// Checkpoint implements [idempotency.Store.Checkpoint] with one script.
func (s *Store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: redis: checkpoint of %d bytes, limit %d", idempotency.ErrTooLarge, len(value), s.maxValue)
	}
	keys, err := s.keys(key)
	if err != nil {
		return err
	}
	v, _, err := s.run(ctx, checkpointScript, keys[:1], false, string(token), name, value)
	return s.done("checkpoint", v, err)
}

// Complete implements [idempotency.Store.Complete] with one script.
func (s *Store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := s.completeCall(key, token, result, retention)
	if err != nil {
		return err
	}
	r, err := s.call(ctx, c)
	return s.completeDone(millis(retention), r, err)
}

// completeCall is the script call that completes the record under key
// held under token, or the completion's error.
func (s *Store) completeCall(key string, token idempotency.Token, result []byte, retention time.Duration) (scriptCall, error) {
	if len(result) > s.maxValue {
		return scriptCall{}, fmt.Errorf("%w: redis: result of %d bytes, limit %d", idempotency.ErrTooLarge, len(result), s.maxValue)
	}
	if retention <= 0 {
		return scriptCall{}, fmt.Errorf("%w: redis: retention %v", idempotency.ErrInvalidArgument, retention)
	}
	touch := "0"
	if s.replicas > 0 {
		touch = "1"
	}
	keys, err := s.keys(key)
	if err != nil {
		return scriptCall{}, err
	}
	return scriptCall{sc: completeScript, keys: keys, write: true,
		args: []any{string(token), result, millis(retention), touch, s.notify, s.fenceMemory}}, nil
}

// completeDone reads the reply of a completion's script, of a retention
// of ms milliseconds, and the replicas' acknowledgment when they are
// required.
func (s *Store) completeDone(ms int64, r ran, err error) error {
	if err := s.done("complete", r.v, err); err != nil {
		return err
	}
	if s.retention.Load() != ms {
		s.retention.Store(ms)
	}
	if err := s.checkWait(r.wait); err != nil {
		return fmt.Errorf("redis: complete: %w", err)
	}
	return nil
}

// Release implements [idempotency.Store.Release] with one script.
func (s *Store) Release(ctx context.Context, key string, token idempotency.Token) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := s.releaseCall(key, token)
	if err != nil {
		return err
	}
	r, err := s.call(ctx, c)
	return s.done("release", r.v, err)
}

// releaseCall is the script call that releases the record under key held
// under token.
func (s *Store) releaseCall(key string, token idempotency.Token) (scriptCall, error) {
	keys, err := s.keys(key)
	if err != nil {
		return scriptCall{}, err
	}
	return scriptCall{sc: releaseScript, keys: keys[:1], args: []any{string(token), s.notify}}, nil
}

// done turns the 1/0 reply of a write under a lease into an error.
func (s *Store) done(op string, v any, err error) error {
	if err != nil {
		return s.wrap(op, err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(0):
		return idempotency.ErrLeaseLost
	}
	return fmt.Errorf("redis: %s: unexpected reply %v", op, v)
}

// wrap names the operation on a go-redis error; context errors pass through
// as they are. A syntax error inside a script is what a server older than
// Redis 6.2 answers to SET ... GET: the error says so.
func (s *Store) wrap(op string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if oldServer(err) {
		return fmt.Errorf("redis: %s: %w (is the server older than Redis 6.2? The store needs SET with the GET option)", op, err)
	}
	return fmt.Errorf("redis: %s: %w", op, err)
}

// oldServer reports whether err is a Redis error raised by a syntax error
// of a command inside one of the store's scripts.
func oldServer(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.Contains(msg, "script") && strings.Contains(msg, "syntax error")
}

// encodeFingerprint returns the stored form of a fingerprint: "h" and the 32
// bytes of the digest for the "sha256:" and 64 lowercase hex digits that
// the idempotency package produces, "=" and the fingerprint as it is for
// any other. The encoding is one-to-one, so comparing stored forms compares
// fingerprints byte for byte; it keeps the usual fingerprint at 33 bytes,
// under Redis's default hash-max-listpack-value (64), so a record without
// a large result stays in the compact listpack encoding.
func encodeFingerprint(fp idempotency.Fingerprint) string {
	const prefix = "sha256:"
	if len(fp) == len(prefix)+64 && strings.HasPrefix(string(fp), prefix) {
		var b [33]byte
		b[0] = 'h'
		ok := true
		for i := range 32 {
			hi, ok1 := lowerHex(fp[len(prefix)+2*i])
			lo, ok2 := lowerHex(fp[len(prefix)+2*i+1])
			ok = ok && ok1 && ok2
			b[1+i] = hi<<4 | lo
		}
		if ok {
			return string(b[:])
		}
	}
	return "=" + string(fp)
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// millis rounds d up to whole milliseconds, the resolution of PEXPIRE.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// decodeClaim reads the claim script's reply. A reply of another shape
// (a server that is not Redis, a damaged script cache, a future version's
// reply) is an error naming what was wrong, never a guess: a claim that
// cannot be read must not be taken for an acquisition.
func decodeClaim(v any) (idempotency.ClaimResult, error) {
	bad := func(what string) (idempotency.ClaimResult, error) {
		return idempotency.ClaimResult{}, fmt.Errorf("redis: claim: unexpected reply (%s): %.200v", what, v)
	}
	a, ok := v.([]any)
	if !ok || len(a) < 4 {
		return bad("not an array of at least 4")
	}
	outcome, ok1 := a[0].(int64)
	fence, ok2 := a[1].(int64)
	attempt, ok3 := a[2].(int64)
	if !ok1 || !ok2 || !ok3 {
		return bad("outcome, fence and attempt not integers")
	}
	if fence <= 0 || attempt < 1 || attempt > math.MaxInt32 {
		return bad("fence or attempt out of range")
	}
	res := idempotency.ClaimResult{Outcome: idempotency.Outcome(outcome), Fence: fence, Attempt: int(attempt)}
	switch res.Outcome {
	case idempotency.OutcomeAcquired:
		if len(a)%2 != 0 {
			return bad("a checkpoint without a value")
		}
		if len(a) > 4 {
			res.Checkpoints = make(map[string][]byte, (len(a)-4)/2)
			for i := 4; i+1 < len(a); i += 2 {
				name, ok1 := a[i].(string)
				value, ok2 := a[i+1].(string)
				if !ok1 || !ok2 {
					return bad("a checkpoint name or value not a string")
				}
				res.Checkpoints[name] = []byte(value)
			}
		}
	case idempotency.OutcomeReplay:
		r, ok := a[3].(string)
		if !ok || len(a) != 5 {
			return bad("the result not one string and a time to live")
		}
		res.Result = []byte(r)
		// The record's time to live, by the server's clock: said at the cost
		// of one PTTL on the replay's path only.
		if ttl, ok := a[4].(int64); ok && ttl > 0 {
			res.ExpiresIn = time.Duration(ttl) * time.Millisecond
		}
	case idempotency.OutcomeInProgress:
		ms, ok := a[3].(int64)
		if !ok || ms < 0 || len(a) != 4 {
			return bad("the time left not one integer of ms")
		}
		res.RetryAfter = time.Duration(ms) * time.Millisecond
	case idempotency.OutcomeMismatch:
		if len(a) != 4 {
			return bad("more than 4 elements")
		}
	default:
		return bad("unknown outcome")
	}
	return res, nil
}
