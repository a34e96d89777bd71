// Package etcd is an [idempotency.Store] on etcd v3, through the official
// client go.etcd.io/etcd/client/v3. It works with etcd 3.4 and later.
//
// Every decision is one etcd transaction with compares: a claim creates a
// record if its key is absent, or reads the record and then takes it over
// (or renews a repeated claim) with a transaction that commits only if the
// record did not change since it was read. Fences are etcd
// revisions, which strictly increase across the whole cluster; deadlines
// are etcd leases, counted by the leader's clock. See the README for the
// data model, what a leader change does to leases, compaction and the
// limits.
//
// The store takes the caller's client (any [Client]: a *clientv3.Client,
// or parts of one such as a namespaced KV) and never closes it.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/internal/typednil"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Client is the part of an etcd client the store uses: transactions,
// lease grants and watches. A *clientv3.Client is one; [Parts] assembles
// one from a KV, a Lease and a Watcher, such as those of etcd's namespace
// package ([Namespace]).
type Client interface {
	Txn(ctx context.Context) clientv3.Txn
	Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error)
	Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error)
	TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error)
	Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan
}

// Parts is a [Client] made of the parts of one: for example a KV and a
// Watcher wrapped by etcd's namespace package, which keep every key under
// a prefix.
type Parts struct {
	clientv3.KV
	clientv3.Lease
	clientv3.Watcher
}

// Namespace returns c with every key kept under prefix, through etcd's
// namespace package (namespace.NewKV, NewLease and NewWatcher): the
// store's own [Options.Prefix] then comes after it.
func Namespace(c *clientv3.Client, prefix string) Parts {
	return Parts{
		KV:      namespace.NewKV(c.KV, prefix),
		Lease:   namespace.NewLease(c.Lease, prefix),
		Watcher: namespace.NewWatcher(c.Watcher, prefix),
	}
}

// Defaults of [Options].
const (
	DefaultPrefix = "idem/"
	// DefaultMaxValueSize is the largest result or checkpoint value kept:
	// 1 MiB, which with the record's keys fits in etcd's default request
	// limit of 1.5 MiB (--max-request-bytes).
	DefaultMaxValueSize = 1 << 20
	// DefaultMaxCheckpoints is the most checkpoint names a record keeps. A
	// renewal re-attaches every key of the record in one transaction, and
	// etcd allows 128 operations in one (--max-txn-ops).
	DefaultMaxCheckpoints = 64
	// DefaultMinLease is the minimum lease TTL of an etcd server with the
	// default election settings (a 1s election timeout: 1.5 s, rounded up
	// to whole seconds), reported by [Store.Capabilities] unless
	// [Options.MinLease] says otherwise.
	DefaultMinLease = 2 * time.Second
)

// Options configure a [Store]. The zero value (or nil) means the defaults.
type Options struct {
	// Prefix starts every key of the store. Default: [DefaultPrefix].
	Prefix string
	// MaxValueSize is the largest result, or checkpoint value, kept: a
	// larger one gets idempotency.ErrTooLarge and nothing is written. Keep
	// it below the server's --max-request-bytes (1.5 MiB by default) minus
	// a few KiB. Default: [DefaultMaxValueSize].
	MaxValueSize int
	// MaxCheckpoints is the most checkpoint names one record keeps; a
	// Checkpoint of a new name beyond it gets idempotency.ErrTooLarge. At
	// most 120 with etcd's default --max-txn-ops of 128.
	// Default: [DefaultMaxCheckpoints].
	MaxCheckpoints int
	// MinLease, when set, is the shortest lease the store reports in its
	// Capabilities: the server's minimum lease TTL ([ServerMinLease]).
	// Default: [DefaultMinLease], the minimum of a server with etcd's
	// default election timeout.
	MinLease time.Duration
}

// Store is an [idempotency.Store] on etcd. It is safe for concurrent use.
type Store struct {
	client         Client
	prefix         string
	maxValue       int
	maxCheckpoints int
	minLease       time.Duration
	leases         *leasePool
	holders        holderCache
}

var (
	_ idempotency.Store     = (*Store)(nil)
	_ idempotency.Watcher   = (*Store)(nil)
	_ idempotency.Inspector = (*Store)(nil)
)

// New returns a store on client. It sends nothing to the server. A nil
// client or invalid options give an error wrapping
// idempotency.ErrInvalidArgument.
func New(client Client, opts *Options) (*Store, error) {
	if typednil.Is(client) {
		return nil, fmt.Errorf("%w: etcd: nil client", idempotency.ErrInvalidArgument)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.MaxValueSize == 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.MaxCheckpoints == 0 {
		o.MaxCheckpoints = DefaultMaxCheckpoints
	}
	switch {
	case o.MaxValueSize < 0:
		return nil, fmt.Errorf("%w: etcd: MaxValueSize %d is negative", idempotency.ErrInvalidArgument, o.MaxValueSize)
	case o.MaxCheckpoints < 0 || o.MaxCheckpoints > 120:
		return nil, fmt.Errorf("%w: etcd: MaxCheckpoints %d is not in 1..120", idempotency.ErrInvalidArgument, o.MaxCheckpoints)
	case o.MinLease < 0:
		return nil, fmt.Errorf("%w: etcd: MinLease %v is negative", idempotency.ErrInvalidArgument, o.MinLease)
	case len(o.Prefix) > 4096:
		return nil, fmt.Errorf("%w: etcd: Prefix of %d bytes is longer than 4096", idempotency.ErrInvalidArgument, len(o.Prefix))
	}
	return &Store{
		client:         client,
		prefix:         o.Prefix,
		maxValue:       o.MaxValueSize,
		maxCheckpoints: o.MaxCheckpoints,
		minLease:       o.MinLease,
		leases:         newLeasePool(client),
		holders:        holderCache{m: make(map[holderID]holderState)},
	}, nil
}

// Capabilities reports what the store does beyond the
// [idempotency.Store] contract: it watches (etcd's watch API), it lets
// operators inspect, purge and list stuck records ([Store.Inspect],
// [Store.Purge], [Store.Stuck]), its leases
// are whole seconds of at least [Options.MinLease] (or [DefaultMinLease]),
// and it keeps values up to [Options.MaxValueSize]. It asks the server
// nothing: see [ServerMinLease] for a server whose minimum lease is not
// the default.
func (s *Store) Capabilities() idempotency.Capabilities {
	minLease := s.minLease
	if minLease == 0 {
		minLease = max(DefaultMinLease, time.Duration(s.leases.raised.Load())*time.Second)
	}
	return idempotency.Capabilities{Watcher: s, Inspector: s, Limits: idempotency.Limits{
		MinLease: minLease, Resolution: time.Second, MaxValueSize: s.maxValue}}
}

// ServerMinLease asks the server behind client for its minimum lease TTL,
// within ctx: it grants a lease of one second, reads the TTL it got and
// revokes it. etcd raises a shorter TTL to 1.5 election timeouts, rounded
// up to whole seconds (2 s with the default 1 s election timeout), so a
// shorter lease would last longer than asked. Give the result to
// [Options.MinLease] when the server's election timeout is not the
// default.
func ServerMinLease(ctx context.Context, client Client) (time.Duration, error) {
	if typednil.Is(client) {
		return 0, fmt.Errorf("%w: etcd: nil client", idempotency.ErrInvalidArgument)
	}
	resp, err := client.Grant(ctx, 1)
	if err != nil {
		return 0, fmt.Errorf("etcd: grant a lease to read the server's minimum TTL: %w", err)
	}
	_, _ = client.Revoke(ctx, resp.ID)
	return time.Duration(max(resp.TTL, 1)) * time.Second, nil
}

// Key returns the etcd key of storageKey's record (its live marker and
// checkpoints share the key's prefix up to the NUL byte before its last
// byte), for tests and operators.
func (s *Store) Key(storageKey string) string { return s.keys(storageKey).holder() }

// StartedKey returns the etcd key of storageKey's entry in the index of
// STARTED records, which [Store.Stuck] reads (see the README), for tests
// and operators.
func (s *Store) StartedKey(storageKey string) string { return s.keys(storageKey).started() }

// maxCAS bounds the transactions one operation sends when the record keeps
// changing between its read and its write. Only a holder's own concurrent
// calls and a takeover change a record, so a second attempt almost always
// succeeds.
const maxCAS = 16

var errContended = errors.New("etcd: the record changed during every attempt")

// Claim implements [idempotency.Store].
//
// One transaction creates the record if its key is absent (etcd deleted
// an expired record with its lease), or else reads it. A read record
// decides a mismatch, a replay or an in-progress answer at the revision it
// was read (an in-progress answer then asks the lease's time left); a
// repeat by the holder's token and a takeover of an ended lease are a
// second transaction that commits only if the record is unchanged since
// that read (and, for a takeover, the live marker still absent), and
// otherwise decides again.
func (s *Store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, err
	}
	if err := idempotency.ValidateClaim("etcd", r); err != nil {
		return idempotency.ClaimResult{}, err
	}
	start := time.Now()
	k := s.keys(r.Key)
	grace := ceilMillis(r.Grace)
	fresh := meta{attempt: 1, grace: grace, fp: r.Fingerprint}
	// The checkpoint names, read only when a repeat or a takeover needs
	// them, as of the record's revision namesAt.
	var names []string
	namesAt := int64(-1)
	for range maxCAS {
		live, life, err := s.twoLeases(ctx, r.Lease, r.Lease+grace, start)
		if err != nil {
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
		}
		resp, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(k.holder()), "=", 0),
		).Then(
			clientv3.OpPut(k.holder(), encodeRecord(stateStarted, r.Token, fresh, nil), clientv3.WithLease(life)),
			clientv3.OpPut(k.live(), liveValue(r.Lease), clientv3.WithLease(live)),
			clientv3.OpPut(k.started(), "", clientv3.WithLease(life)),
		).Else(k.readMeta()).Commit()
		if isLeaseNotFound(err) {
			s.leases.forget(live, life)
			continue
		}
		if err != nil {
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
		}
		if resp.Succeeded {
			s.holders.put(r.Key, r.Token, holderState{hRev: resp.Header.Revision, lease: life, meta: fresh, known: true})
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: resp.Header.Revision, Attempt: 1}, nil
		}
		rec, err := parseRecord(resp.Header.Revision, resp.Responses[0].GetResponseRange(), nil, k)
		if err != nil {
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
		}
		if rec.h == nil {
			continue // cannot happen: the key existed in this revision
		}
		if rec.meta.fp != r.Fingerprint {
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeMismatch, Fence: rec.fence(), Attempt: rec.meta.attempt}, nil
		}
		if rec.state == stateCompleted {
			result := make([]byte, len(rec.result))
			copy(result, rec.result)
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeReplay, Fence: rec.fence(), Attempt: rec.meta.attempt, Result: result}, nil
		}
		if rec.token != r.Token && rec.live != nil {
			left, err := s.timeLeft(ctx, rec.live)
			if err != nil {
				return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
			}
			if left <= 0 {
				continue // the lease ended meanwhile: decide again
			}
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeInProgress, Fence: rec.fence(), Attempt: rec.meta.attempt, RetryAfter: left}, nil
		}
		// A repeat of the holder's claim keeps the fence and attempt and
		// sets the lease and grace anew.
		m, takeover := rec.meta, rec.token != r.Token
		m.grace = grace
		if takeover {
			// The lease ended and nobody took the record over: take it
			// over, with a fence above every revision the read saw, so
			// above every fence handed out before.
			m = meta{attempt: rec.meta.attempt + 1, grace: grace, fence: rec.rev + 1, fp: r.Fingerprint}
		}
		known := rec.h.ModRevision == namesAt
		if known {
			rec.names = names
		}
		res, ok, err := s.reacquire(ctx, k, rec, known, takeover, encodeRecord(stateStarted, r.Token, m, nil), r.Lease, live, life)
		if isLeaseNotFound(err) {
			s.leases.forget(live, life)
			continue
		}
		if err != nil {
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
		}
		if !ok {
			// The record changed since it was read, or has checkpoints the
			// store did not know of: decide again.
			if res.read != nil && res.read.h != nil {
				names, namesAt = res.read.names, res.read.h.ModRevision
			}
			continue
		}
		s.holders.put(r.Key, r.Token, holderState{hRev: res.rev, lease: life, meta: m, names: res.names, known: true})
		fence := m.fence
		if fence == 0 {
			fence = rec.h.CreateRevision
		}
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: fence, Attempt: m.attempt, Checkpoints: res.checkpoints}, nil
	}
	return idempotency.ClaimResult{}, s.wrap(ctx, "claim", errContended)
}

// twoLeases returns the live marker's lease and the record's life lease,
// asking the server for both at once when neither is in the pool.
func (s *Store) twoLeases(ctx context.Context, live, life time.Duration, start time.Time) (clientv3.LeaseID, clientv3.LeaseID, error) {
	liveID, ok1 := s.leases.pooled(live, start)
	lifeID, ok2 := s.leases.pooled(life, start)
	switch {
	case ok1 && ok2:
		return liveID, lifeID, nil
	case ok1:
		lifeID, err := s.leases.get(ctx, life, start)
		return liveID, lifeID, err
	case ok2:
		liveID, err := s.leases.get(ctx, live, start)
		return liveID, lifeID, err
	}
	var lifeErr error
	var wg sync.WaitGroup
	wg.Go(func() { lifeID, lifeErr = s.leases.get(ctx, life, start) })
	liveID, liveErr := s.leases.get(ctx, live, start)
	wg.Wait()
	return liveID, lifeID, errors.Join(liveErr, lifeErr)
}

// reacquired is what a repeat or a takeover wrote, or, when it wrote
// nothing, what it read instead.
type reacquired struct {
	rev         int64
	names       []string
	checkpoints map[string][]byte
	read        *record
}

// reacquire rewrites the record rec read as value, if it is unchanged
// since, with every checkpoint re-attached to the life lease and a new
// live marker for a lease of leaseLen. A takeover also requires the live
// marker absent, so the lease ended as the server judges it. When the
// checkpoint names are not known (namesKnown false), it requires that
// there be none, and otherwise reads them. It returns ok false when the
// record changed (the caller decides again).
func (s *Store) reacquire(ctx context.Context, k recordKeys, rec record, namesKnown, takeover bool, value string, leaseLen time.Duration, live, life clientv3.LeaseID) (reacquired, bool, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.holder()), "=", rec.h.ModRevision)}
	var orElse []clientv3.Op
	if !namesKnown {
		rec.names = nil
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.cpStart()), "=", 0).WithRange(k.cpEnd()))
		orElse = []clientv3.Op{k.readMeta(), k.readCheckpointNames()}
	}
	if takeover {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.live()), "=", 0))
	}
	ops := make([]clientv3.Op, 0, 4+len(rec.names))
	ops = append(ops,
		clientv3.OpPut(k.holder(), value, clientv3.WithLease(life)),
		clientv3.OpPut(k.live(), liveValue(leaseLen), clientv3.WithLease(live)),
		clientv3.OpPut(k.started(), "", clientv3.WithLease(life)),
	)
	for _, n := range rec.names {
		ops = append(ops, clientv3.OpPut(k.checkpoint(n), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)))
	}
	if len(rec.names) > 0 {
		ops = append(ops, clientv3.OpGet(k.cpStart(), clientv3.WithRange(k.cpEnd())))
	}
	resp, err := s.client.Txn(ctx).If(cmps...).Then(ops...).Else(orElse...).Commit()
	if err != nil {
		return reacquired{}, false, err
	}
	if !resp.Succeeded {
		if namesKnown {
			return reacquired{}, false, nil
		}
		read, err := parseTxn(resp, k)
		return reacquired{read: &read}, false, err
	}
	out := reacquired{rev: resp.Header.Revision, names: rec.names}
	if len(rec.names) > 0 {
		out.checkpoints = make(map[string][]byte, len(rec.names))
		for _, kv := range resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs {
			out.checkpoints[strings.TrimPrefix(string(kv.Key), k.cpStart())] = slices.Clone(kv.Value)
		}
	}
	return out, true, nil
}

// timeLeft asks the server how long the live marker's lease has left:
// etcd reports whole seconds, rounded down, so half a second is added, and
// the answer is at most the length of the lease the holder asked for (the
// marker's value), as a shared lease may outlast it. Zero or less means
// the lease has ended.
func (s *Store) timeLeft(ctx context.Context, live *mvccpb.KeyValue) (time.Duration, error) {
	resp, err := s.client.TimeToLive(ctx, clientv3.LeaseID(live.Lease))
	if err != nil {
		if isLeaseNotFound(err) {
			return 0, nil
		}
		return 0, err
	}
	if resp.TTL < 0 {
		return 0, nil
	}
	left := time.Duration(resp.TTL)*time.Second + time.Second/2
	if asked, err := strconv.ParseInt(string(live.Value), 10, 64); err == nil && asked > 0 {
		left = min(left, time.Duration(asked)*time.Millisecond)
	}
	return left, nil
}

// liveValue is the live marker's value: the length of the lease the holder
// asked for, in milliseconds (rounded up).
func liveValue(lease time.Duration) string {
	return strconv.FormatInt(int64(ceilMillis(lease)/time.Millisecond), 10)
}

// known returns what the store remembers of the record held under token,
// or reads it: ErrLeaseLost when it is not STARTED under token. done
// reports a record already COMPLETED under token (for Complete).
func (s *Store) known(ctx context.Context, op, key string, token idempotency.Token, k recordKeys) (st holderState, done bool, err error) {
	if st = s.holders.get(key, token); st.known {
		return st, false, nil
	}
	resp, err := s.client.Txn(ctx).Then(k.readMeta(), k.readCheckpointNames()).Commit()
	if err != nil {
		return st, false, err
	}
	return s.reread(op, key, token, k, resp)
}

// reread is the end of a holder's write whose compare failed: its Else
// branch read the record (readMeta, readCheckpointNames), which is held
// under token (the write is tried again with what was read), COMPLETED
// under token (done), or lost.
func (s *Store) reread(op, key string, token idempotency.Token, k recordKeys, resp *clientv3.TxnResponse) (holderState, bool, error) {
	rec, err := parseTxn(resp, k)
	if err != nil {
		return holderState{}, false, err
	}
	if rec.h != nil && rec.token == token {
		switch rec.state {
		case stateStarted:
			return rec.holderState(), false, nil
		case stateCompleted:
			s.holders.drop(key, token)
			return holderState{}, true, nil
		}
	}
	s.holders.drop(key, token)
	return holderState{}, false, fmt.Errorf("%w: etcd: %s of %q", idempotency.ErrLeaseLost, op, key)
}

// holderWrite runs the write that ops(st) builds for the record held under
// token, as one transaction that commits only if the record is unchanged
// since the store last wrote or read it (so that st, what the store
// remembers, is exact), and otherwise reads it and tries again. It returns
// the revision written, or done for a record already COMPLETED under token
// (which only Complete accepts), or ErrLeaseLost. ops may ask for leases,
// and return leases to forget if the server no longer has them.
func (s *Store) holderWrite(ctx context.Context, op, key string, token idempotency.Token, ops func(st holderState) ([]clientv3.Op, []clientv3.LeaseID, error)) (st holderState, rev int64, done bool, err error) {
	k := s.keys(key)
	if st, done, err = s.known(ctx, op, key, token, k); err != nil || done {
		return st, 0, done, err
	}
	for range maxCAS {
		then, leases, err := ops(st)
		if err != nil {
			return st, 0, false, err
		}
		resp, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(k.holder()), "=", st.hRev),
		).Then(then...).Else(k.readMeta(), k.readCheckpointNames()).Commit()
		if isLeaseNotFound(err) {
			s.leases.forget(leases...)
			continue
		}
		if err != nil {
			return st, 0, false, err
		}
		if resp.Succeeded {
			return st, resp.Header.Revision, false, nil
		}
		if st, done, err = s.reread(op, key, token, k, resp); err != nil || done {
			return st, 0, done, err
		}
	}
	return st, 0, false, errContended
}

// Renew implements [idempotency.Store]: one transaction, committed only if
// the record is unchanged since the store last saw it held under token
// (so that it knows every key to re-attach), that writes a new live marker
// and moves the record and its checkpoints to a life lease of lease plus
// the grace. When the store has not seen the record, or it changed, it
// reads it first.
func (s *Store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("%w: etcd: lease %v is not positive", idempotency.ErrInvalidArgument, lease)
	}
	start := time.Now()
	k := s.keys(key)
	var life clientv3.LeaseID
	st, rev, done, err := s.holderWrite(ctx, "renew", key, token, func(st holderState) ([]clientv3.Op, []clientv3.LeaseID, error) {
		live, l, err := s.twoLeases(ctx, lease, lease+st.meta.grace, start)
		if err != nil {
			return nil, nil, err
		}
		life = l
		ops := make([]clientv3.Op, 0, 3+len(st.names))
		ops = append(ops,
			clientv3.OpPut(k.holder(), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)),
			clientv3.OpPut(k.live(), liveValue(lease), clientv3.WithLease(live)),
			clientv3.OpPut(k.started(), "", clientv3.WithLease(life)),
		)
		for _, n := range st.names {
			ops = append(ops, clientv3.OpPut(k.checkpoint(n), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)))
		}
		return ops, []clientv3.LeaseID{live, life}, nil
	})
	switch {
	case done:
		return fmt.Errorf("%w: etcd: renew of %q: completed", idempotency.ErrLeaseLost, key)
	case err != nil:
		return s.fail(ctx, "renew", err)
	}
	st.hRev, st.lease = rev, life
	s.holders.put(key, token, st)
	return nil
}

// Checkpoint implements [idempotency.Store]: one transaction, committed
// only if the record is unchanged since the store last saw it held under
// token, that writes the value on the record's life lease and rewrites the
// record in place (so that a renewal or takeover that read the record
// before it cannot commit without re-attaching the new checkpoint). When
// the store has not seen the record, or it changed, it reads it first.
func (s *Store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: etcd: checkpoint %q of %d bytes, above MaxValueSize %d", idempotency.ErrTooLarge, name, len(value), s.maxValue)
	}
	k := s.keys(key)
	st, rev, done, err := s.holderWrite(ctx, "checkpoint", key, token, func(st holderState) ([]clientv3.Op, []clientv3.LeaseID, error) {
		if !slices.Contains(st.names, name) && len(st.names) >= s.maxCheckpoints {
			return nil, nil, fmt.Errorf("%w: etcd: checkpoint %q would be the record's %dth, above MaxCheckpoints %d", idempotency.ErrTooLarge, name, len(st.names)+1, s.maxCheckpoints)
		}
		return []clientv3.Op{
			clientv3.OpPut(k.checkpoint(name), string(value), clientv3.WithLease(st.lease)),
			clientv3.OpPut(k.holder(), "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease()),
		}, nil, nil
	})
	switch {
	case done:
		return fmt.Errorf("%w: etcd: checkpoint of %q: completed", idempotency.ErrLeaseLost, key)
	case err != nil:
		return s.fail(ctx, "checkpoint", err)
	}
	st.hRev = rev
	if !slices.Contains(st.names, name) {
		st.names = append(slices.Clip(st.names), name)
	}
	s.holders.put(key, token, st)
	return nil
}

// Complete implements [idempotency.Store]: one transaction, committed only
// if the record is unchanged since the store last saw it held under token,
// that rewrites it as COMPLETED with the result on a retention lease and
// deletes its checkpoints. When the store has not seen the record, or it
// changed, it reads it first; a record already COMPLETED under token is a
// success that changes nothing.
func (s *Store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > s.maxValue {
		return fmt.Errorf("%w: etcd: result of %d bytes, above MaxValueSize %d", idempotency.ErrTooLarge, len(result), s.maxValue)
	}
	if retention <= 0 {
		return fmt.Errorf("%w: etcd: retention %v is not positive", idempotency.ErrInvalidArgument, retention)
	}
	start := time.Now()
	k := s.keys(key)
	_, _, _, err := s.holderWrite(ctx, "complete", key, token, func(st holderState) ([]clientv3.Op, []clientv3.LeaseID, error) {
		keep, err := s.leases.get(ctx, retention, start)
		if err != nil {
			return nil, nil, err
		}
		m := st.meta
		m.grace = ceilMillis(retention) // see meta.grace
		ops := []clientv3.Op{
			clientv3.OpPut(k.holder(), encodeRecord(stateCompleted, token, m, result), clientv3.WithLease(keep)),
			clientv3.OpDelete(k.started()),
		}
		if len(st.names) > 0 {
			ops = append(ops, clientv3.OpDelete(k.cpStart(), clientv3.WithRange(k.cpEnd())))
		}
		return ops, []clientv3.LeaseID{keep}, nil
	})
	s.holders.drop(key, token)
	if err != nil {
		return s.fail(ctx, "complete", err)
	}
	return nil
}

// Release implements [idempotency.Store]: one transaction that deletes
// every key of the record if it is STARTED under token, and else, in the
// same transaction, checks whether it is absent.
func (s *Store) Release(ctx context.Context, key string, token idempotency.Token) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := s.keys(key)
	resp, err := s.client.Txn(ctx).If(
		heldBy(k, stateStarted, token)...,
	).Then(
		clientv3.OpDelete(k.base, clientv3.WithRange(k.allEnd())),
		clientv3.OpDelete(k.started()),
	).Else(
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.holder()), "=", 0)}, nil, nil),
	).Commit()
	if err != nil {
		return s.wrap(ctx, "release", err)
	}
	s.holders.drop(key, token)
	if resp.Succeeded || resp.Responses[0].GetResponseTxn().Succeeded {
		return nil
	}
	return fmt.Errorf("%w: etcd: release of %q", idempotency.ErrLeaseLost, key)
}

func (k recordKeys) readMeta() clientv3.Op {
	return clientv3.OpGet(k.metaStart(), clientv3.WithRange(k.metaEnd()))
}

func (k recordKeys) readCheckpointNames() clientv3.Op {
	return clientv3.OpGet(k.cpStart(), clientv3.WithRange(k.cpEnd()), clientv3.WithKeysOnly())
}

// record is a record as one transaction read it.
type record struct {
	rev     int64            // the revision it was read at
	h, live *mvccpb.KeyValue // the record's key and its live marker
	state   byte
	token   idempotency.Token
	meta    meta
	result  []byte   // aliases h.Value
	names   []string // checkpoint names, when read
}

// parseTxn parses the two ranges that start a transaction's responses.
func parseTxn(resp *clientv3.TxnResponse, k recordKeys) (record, error) {
	return parseRecord(resp.Header.Revision, resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange(), k)
}

// parseRecord parses the record from a read of its meta range and of its
// checkpoint names (cpRange nil when they were not read).
func parseRecord(rev int64, metaRange, cpRange interface {
	GetKvs() []*mvccpb.KeyValue
}, k recordKeys) (record, error) {
	rec := record{rev: rev}
	for _, kv := range metaRange.GetKvs() {
		switch string(kv.Key) {
		case k.holder():
			rec.h = kv
		case k.live():
			rec.live = kv
		}
	}
	if cpRange != nil { // nil: the names were not read
		for _, kv := range cpRange.GetKvs() {
			rec.names = append(rec.names, strings.TrimPrefix(string(kv.Key), k.cpStart()))
		}
	}
	if rec.h == nil {
		return rec, nil
	}
	var err error
	rec.state, rec.token, rec.meta, rec.result, err = decodeRecord(rec.h.Value)
	return rec, err
}

// fence is the record's fence: the last takeover's, or the revision that
// created the record's key.
func (rec record) fence() int64 {
	if rec.meta.fence != 0 {
		return rec.meta.fence
	}
	return rec.h.CreateRevision
}

// holderState is what the store remembers of a STARTED record it read.
func (rec record) holderState() holderState {
	return holderState{
		hRev:  rec.h.ModRevision,
		lease: clientv3.LeaseID(rec.h.Lease),
		meta:  rec.meta,
		names: rec.names,
		known: true,
	}
}

// wrap names the operation in err; a context error is returned as it is
// when ctx is done.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return fmt.Errorf("etcd: %s: %w", op, err)
}

// fail is the error of a holder's write: the store's own refusals
// (ErrLeaseLost, ErrTooLarge) as they are; a request the server (or the
// client, before sending) refused as too large, which wrote nothing, as
// idempotency.ErrTooLarge; anything else wrapped.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrTooLarge):
		return err
	case errors.Is(err, rpctypes.ErrRequestTooLarge) || tooLargeToSend(err):
		return fmt.Errorf("%w: etcd: %s: %w", idempotency.ErrTooLarge, op, err)
	}
	return s.wrap(ctx, op, err)
}

// tooLargeToSend reports gRPC's refusal to send a message above the
// client's limit (2 MiB for etcd's client). etcd's "too many requests" has
// the same code, ResourceExhausted, and is not one.
func tooLargeToSend(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "larger than max")
}

func isLeaseNotFound(err error) bool {
	return err != nil && errors.Is(err, rpctypes.ErrLeaseNotFound)
}
