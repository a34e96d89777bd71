// Package etcd is an [idempotency.Store] on etcd v3, through the official
// client go.etcd.io/etcd/client/v3. It works with etcd 3.4 and later.
//
// Every decision is one etcd transaction with compares: a claim creates a
// record if its holder key is absent, or reads the record and then takes
// it over (or renews a repeated claim) with a transaction that commits only
// if the record did not change since it was read. Fences are etcd
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
	// to whole seconds), reported by [Store.Limits] when the server cannot
	// be asked.
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
	// MinLease, when set, is what [Store.Limits] reports as the shortest
	// lease, instead of asking the server.
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
	_ idempotency.Store        = (*Store)(nil)
	_ idempotency.Watcher      = (*Store)(nil)
	_ idempotency.LimitedStore = (*Store)(nil)
)

// New returns a store on client. It sends nothing to the server. A nil
// client or invalid options give an error wrapping
// idempotency.ErrInvalidArgument.
func New(client Client, opts *Options) (*Store, error) {
	if client == nil || isNilPointer(client) {
		return nil, fmt.Errorf("%w: etcd store: nil client", idempotency.ErrInvalidArgument)
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
		return nil, fmt.Errorf("%w: etcd store: MaxValueSize %d is negative", idempotency.ErrInvalidArgument, o.MaxValueSize)
	case o.MaxCheckpoints < 0 || o.MaxCheckpoints > 120:
		return nil, fmt.Errorf("%w: etcd store: MaxCheckpoints %d is not in 1..120", idempotency.ErrInvalidArgument, o.MaxCheckpoints)
	case o.MinLease < 0:
		return nil, fmt.Errorf("%w: etcd store: MinLease %v is negative", idempotency.ErrInvalidArgument, o.MinLease)
	case len(o.Prefix) > 4096:
		return nil, fmt.Errorf("%w: etcd store: Prefix of %d bytes is longer than 4096", idempotency.ErrInvalidArgument, len(o.Prefix))
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

// limitsTimeout bounds the question Limits asks the server.
const limitsTimeout = 5 * time.Second

// Limits implements [idempotency.LimitedStore]: the shortest lease is the
// server's minimum lease TTL. etcd raises a shorter TTL to 1.5 election
// timeouts, rounded up to whole seconds (2 s with the default 1 s election
// timeout), so a shorter lease would last longer than asked. Unless
// [Options.MinLease] is set, Limits asks the server, granting a lease of
// one second and reading the TTL it got (then revoking it); if the server
// cannot be asked within 5 s it reports [DefaultMinLease].
func (s *Store) Limits() idempotency.Limits {
	if s.minLease > 0 {
		return idempotency.Limits{MinLease: s.minLease}
	}
	ctx, cancel := context.WithTimeout(context.Background(), limitsTimeout)
	defer cancel()
	resp, err := s.client.Grant(ctx, 1)
	if err != nil {
		return idempotency.Limits{MinLease: max(DefaultMinLease, time.Duration(s.leases.raised.Load())*time.Second)}
	}
	_, _ = s.client.Revoke(ctx, resp.ID)
	return idempotency.Limits{MinLease: time.Duration(max(resp.TTL, 1)) * time.Second}
}

// Key returns the etcd key of the holder of storageKey's record (the
// record's other keys share its prefix up to the NUL byte before the last
// one), for tests and operators.
func (s *Store) Key(storageKey string) string { return s.keys(storageKey).holder() }

// maxCAS bounds the transactions one operation sends when the record keeps
// changing between its read and its write. Only a holder's own concurrent
// calls and a takeover change a record, so a second attempt almost always
// succeeds.
const maxCAS = 16

var errContended = errors.New("etcd store: the record changed during every attempt")

// Claim implements [idempotency.Store].
//
// One transaction creates the record if its holder key is absent (etcd has
// deleted an expired record with its lease), or else reads it. A read
// record decides a mismatch, a replay or an in-progress answer at the
// revision it was read (an in-progress answer then asks the lease's time
// left); a repeat by the holder's token and a takeover of an ended lease
// are a second transaction that commits only if the holder key is
// unchanged since that read (and, for a takeover, the live marker still
// absent), and otherwise starts over.
func (s *Store) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, err
	}
	switch {
	case r.Lease <= 0:
		return idempotency.ClaimResult{}, fmt.Errorf("%w: etcd store: lease %v is not positive", idempotency.ErrInvalidArgument, r.Lease)
	case r.Grace < 0:
		return idempotency.ClaimResult{}, fmt.Errorf("%w: etcd store: grace %v is negative", idempotency.ErrInvalidArgument, r.Grace)
	}
	start := time.Now()
	k := s.keys(r.Key)
	grace := ceilMillis(r.Grace)
	// The checkpoint names, read only when a repeat or a takeover needs
	// them, as of the holder key's revision namesAt.
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
			clientv3.OpPut(k.holder(), holderValue(stateStarted, r.Token), clientv3.WithLease(life)),
			clientv3.OpPut(k.ident(), meta{attempt: 1, grace: grace, fp: r.Fingerprint}.encode(), clientv3.WithLease(life)),
			clientv3.OpPut(k.live(), liveValue(r.Lease), clientv3.WithLease(live)),
		).Else(k.readMeta()).Commit()
		if isLeaseNotFound(err) {
			s.leases.forget(live, life)
			continue
		}
		if err != nil {
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
		}
		if resp.Succeeded {
			s.holders.put(r.Key, r.Token, holderState{hRev: resp.Header.Revision, lease: life, grace: grace, known: true})
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: resp.Header.Revision, Attempt: 1}, nil
		}
		rec, err := parseRecord(resp.Header.Revision, resp.Responses[0].GetResponseRange(), nil, k)
		if err != nil {
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", err)
		}
		if rec.holder == nil {
			continue // cannot happen: the holder key existed in this revision
		}
		if rec.meta.fp != r.Fingerprint {
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeMismatch, Fence: rec.fence(), Attempt: rec.meta.attempt}, nil
		}
		state, tok := rec.state()
		switch {
		case state == stateCompleted:
			var result []byte
			if rec.result != nil {
				result = slices.Clone(rec.result.Value)
			}
			if result == nil {
				result = []byte{}
			}
			return idempotency.ClaimResult{Outcome: idempotency.OutcomeReplay, Fence: rec.fence(), Attempt: rec.meta.attempt, Result: result}, nil
		case state != stateStarted:
			return idempotency.ClaimResult{}, s.wrap(ctx, "claim", errCorrupt)
		case tok != r.Token && rec.live != nil:
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
		m, newHolder, fence := rec.meta, "", rec.fence()
		m.grace = grace
		if tok != r.Token {
			// The lease ended and nobody took the record over: take it
			// over, with a fence above every revision the read saw, so
			// above every fence handed out before.
			m = meta{attempt: rec.meta.attempt + 1, grace: grace, fence: rec.rev + 1, fp: r.Fingerprint}
			newHolder, fence = holderValue(stateStarted, r.Token), m.fence
		}
		known := rec.holder.ModRevision == namesAt
		if known {
			rec.names = names
		}
		res, ok, err := s.reacquire(ctx, k, rec, known, newHolder, m, r.Lease, live, life)
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
			if res.read != nil && res.read.holder != nil {
				names, namesAt = res.read.names, res.read.holder.ModRevision
			}
			continue
		}
		s.holders.put(r.Key, r.Token, holderState{hRev: res.rev, lease: life, grace: grace, names: rec.names, known: true})
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeAcquired, Fence: fence, Attempt: m.attempt, Checkpoints: res.checkpoints}, nil
	}
	return idempotency.ClaimResult{}, s.wrap(ctx, "claim", errContended)
}

// twoLeases returns the live marker's lease and the record's life lease,
// asking the server for both at once when neither is in the pool.
func (s *Store) twoLeases(ctx context.Context, live, life time.Duration, start time.Time) (clientv3.LeaseID, clientv3.LeaseID, error) {
	var lifeID clientv3.LeaseID
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
	checkpoints map[string][]byte
	read        *record
}

// reacquire rewrites the record rec read, if it is unchanged since: the
// holder key (to newHolder for a takeover; as it is for a repeat, when
// newHolder is empty), the identity m, every checkpoint re-attached to the
// life lease, and a new live marker for a lease of leaseLen. A takeover
// also requires the live marker absent, so the lease ended as the server
// judges it. When the checkpoint names are not known (namesKnown false),
// it requires that there be none, and otherwise reads them. It returns ok
// false when the record changed (the caller decides again).
func (s *Store) reacquire(ctx context.Context, k recordKeys, rec record, namesKnown bool, newHolder string, m meta, leaseLen time.Duration, live, life clientv3.LeaseID) (reacquired, bool, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.holder()), "=", rec.holder.ModRevision)}
	var orElse []clientv3.Op
	if !namesKnown {
		rec.names = nil
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.cpStart()), "=", 0).WithRange(k.cpEnd()))
		orElse = []clientv3.Op{k.readMeta(), k.readCheckpointNames()}
	}
	ops := make([]clientv3.Op, 0, 4+len(rec.names))
	if newHolder != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.live()), "=", 0))
		ops = append(ops, clientv3.OpPut(k.holder(), newHolder, clientv3.WithLease(life)))
	} else {
		ops = append(ops, clientv3.OpPut(k.holder(), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)))
	}
	ops = append(ops,
		clientv3.OpPut(k.ident(), m.encode(), clientv3.WithLease(life)),
		clientv3.OpPut(k.live(), liveValue(leaseLen), clientv3.WithLease(live)),
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
	out := reacquired{rev: resp.Header.Revision}
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

// Renew implements [idempotency.Store]: one transaction that commits only
// if the holder key is unchanged since the store last saw it under token
// (so that it knows every key to re-attach), writing a new live marker and
// moving every other key to a life lease of lease plus the grace. When the
// store has not seen the record, or it changed, the transaction reads it
// instead and a second one renews.
func (s *Store) Renew(ctx context.Context, key string, token idempotency.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("%w: etcd store: lease %v is not positive", idempotency.ErrInvalidArgument, lease)
	}
	start := time.Now()
	k := s.keys(key)
	st := s.holders.get(key, token)
	for range maxCAS {
		if !st.known {
			rec, err := s.read(ctx, k)
			if err != nil {
				return s.wrap(ctx, "renew", err)
			}
			if !rec.heldBy(token) {
				s.holders.drop(key, token)
				return fmt.Errorf("%w: etcd store: renew of %q", idempotency.ErrLeaseLost, key)
			}
			st = rec.holderState()
		}
		live, life, err := s.twoLeases(ctx, lease, lease+st.grace, start)
		if err != nil {
			return s.wrap(ctx, "renew", err)
		}
		ops := make([]clientv3.Op, 0, 3+len(st.names))
		ops = append(ops,
			clientv3.OpPut(k.holder(), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)),
			clientv3.OpPut(k.ident(), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)),
			clientv3.OpPut(k.live(), liveValue(lease), clientv3.WithLease(live)),
		)
		for _, n := range st.names {
			ops = append(ops, clientv3.OpPut(k.checkpoint(n), "", clientv3.WithIgnoreValue(), clientv3.WithLease(life)))
		}
		resp, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(k.holder()), "=", st.hRev),
			clientv3.Compare(clientv3.Value(k.holder()), "=", holderValue(stateStarted, token)),
		).Then(ops...).Else(k.readMeta(), k.readCheckpointNames()).Commit()
		if isLeaseNotFound(err) {
			s.leases.forget(live, life)
			continue
		}
		if err != nil {
			return s.wrap(ctx, "renew", err)
		}
		if resp.Succeeded {
			st.hRev, st.lease = resp.Header.Revision, life
			s.holders.put(key, token, st)
			return nil
		}
		if st, err = s.reread(ctx, "renew", key, token, k, resp); err != nil {
			return err
		}
	}
	return s.wrap(ctx, "renew", errContended)
}

// Checkpoint implements [idempotency.Store]: one transaction that writes
// the value on the record's life lease if the holder key holds token and
// is unchanged since the store last wrote or read it (so the store knows
// the lease and every checkpoint name; when it does not, or the record
// changed, the transaction reads the record instead and a second one
// writes). It also rewrites the holder key in place, so that a renewal or
// takeover that read the record before it does not commit without
// re-attaching the new checkpoint.
func (s *Store) Checkpoint(ctx context.Context, key string, token idempotency.Token, name string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: etcd store: checkpoint %q of %d bytes, above MaxValueSize %d", idempotency.ErrTooLarge, name, len(value), s.maxValue)
	}
	k := s.keys(key)
	st := s.holders.get(key, token)
	for range maxCAS {
		if st.known && !slices.Contains(st.names, name) && len(st.names) >= s.maxCheckpoints {
			return fmt.Errorf("%w: etcd store: checkpoint %q would be the record's %dth, above MaxCheckpoints %d", idempotency.ErrTooLarge, name, len(st.names)+1, s.maxCheckpoints)
		}
		resp, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(k.holder()), "=", st.hRev),
			clientv3.Compare(clientv3.Value(k.holder()), "=", holderValue(stateStarted, token)),
		).Then(
			clientv3.OpPut(k.checkpoint(name), string(value), clientv3.WithLease(st.lease)),
			clientv3.OpPut(k.holder(), "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease()),
		).Else(k.readMeta(), k.readCheckpointNames()).Commit()
		if err != nil {
			return s.wrapWrite(ctx, "checkpoint", err)
		}
		if resp.Succeeded {
			st.hRev = resp.Header.Revision
			if !slices.Contains(st.names, name) {
				st.names = append(slices.Clip(st.names), name)
			}
			s.holders.put(key, token, st)
			return nil
		}
		if st, err = s.reread(ctx, "checkpoint", key, token, k, resp); err != nil {
			return err
		}
	}
	return s.wrap(ctx, "checkpoint", errContended)
}

// Complete implements [idempotency.Store]: one transaction that, if the
// holder key holds token in STARTED, rewrites it as COMPLETED, writes the
// result, moves the identity to a retention lease and deletes the live
// marker and the checkpoints; else, in the same transaction, checks
// whether it is already COMPLETED under token.
func (s *Store) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > s.maxValue {
		return fmt.Errorf("%w: etcd store: result of %d bytes, above MaxValueSize %d", idempotency.ErrTooLarge, len(result), s.maxValue)
	}
	if retention <= 0 {
		return fmt.Errorf("%w: etcd store: retention %v is not positive", idempotency.ErrInvalidArgument, retention)
	}
	start := time.Now()
	k := s.keys(key)
	for range maxCAS {
		keep, err := s.leases.get(ctx, retention, start)
		if err != nil {
			return s.wrap(ctx, "complete", err)
		}
		done := holderValue(stateCompleted, token)
		resp, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.Value(k.holder()), "=", holderValue(stateStarted, token)),
		).Then(
			clientv3.OpPut(k.holder(), done, clientv3.WithLease(keep)),
			clientv3.OpPut(k.ident(), "", clientv3.WithIgnoreValue(), clientv3.WithLease(keep)),
			clientv3.OpPut(k.result(), string(result), clientv3.WithLease(keep)),
			clientv3.OpDelete(k.live()),
			clientv3.OpDelete(k.cpStart(), clientv3.WithRange(k.cpEnd())),
		).Else(
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(k.holder()), "=", done)}, nil, nil),
		).Commit()
		if isLeaseNotFound(err) {
			s.leases.forget(keep)
			continue
		}
		if err != nil {
			return s.wrapWrite(ctx, "complete", err)
		}
		s.holders.drop(key, token)
		if resp.Succeeded || resp.Responses[0].GetResponseTxn().Succeeded {
			return nil
		}
		return fmt.Errorf("%w: etcd store: complete of %q", idempotency.ErrLeaseLost, key)
	}
	return s.wrap(ctx, "complete", errContended)
}

// Release implements [idempotency.Store]: one transaction that deletes
// every key of the record if the holder key holds token in STARTED; else,
// in the same transaction, checks whether the record is absent.
func (s *Store) Release(ctx context.Context, key string, token idempotency.Token) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := s.keys(key)
	resp, err := s.client.Txn(ctx).If(
		clientv3.Compare(clientv3.Value(k.holder()), "=", holderValue(stateStarted, token)),
	).Then(
		clientv3.OpDelete(k.base, clientv3.WithRange(k.allEnd())),
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
	return fmt.Errorf("%w: etcd store: release of %q", idempotency.ErrLeaseLost, key)
}

// reread is the end of a holder's write whose compares failed: its Else
// branch read the record (readMeta, readCheckpointNames), which is either
// held under token (the write is tried again with what was read) or lost.
func (s *Store) reread(ctx context.Context, op, key string, token idempotency.Token, k recordKeys, resp *clientv3.TxnResponse) (holderState, error) {
	rec, err := parseTxn(resp, k)
	if err != nil {
		return holderState{}, s.wrap(ctx, op, err)
	}
	if !rec.heldBy(token) {
		s.holders.drop(key, token)
		return holderState{}, fmt.Errorf("%w: etcd store: %s of %q", idempotency.ErrLeaseLost, op, key)
	}
	return rec.holderState(), nil
}

// read reads the record in one transaction.
func (s *Store) read(ctx context.Context, k recordKeys) (record, error) {
	resp, err := s.client.Txn(ctx).Then(k.readMeta(), k.readCheckpointNames()).Commit()
	if err != nil {
		return record{}, err
	}
	return parseTxn(resp, k)
}

func (k recordKeys) readMeta() clientv3.Op {
	return clientv3.OpGet(k.metaStart(), clientv3.WithRange(k.metaEnd()))
}

func (k recordKeys) readCheckpointNames() clientv3.Op {
	return clientv3.OpGet(k.cpStart(), clientv3.WithRange(k.cpEnd()), clientv3.WithKeysOnly())
}

// record is a record as one transaction read it.
type record struct {
	rev                         int64 // the revision it was read at
	holder, ident, live, result *mvccpb.KeyValue
	meta                        meta
	names                       []string // checkpoint names
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
			rec.holder = kv
		case k.ident():
			rec.ident = kv
		case k.live():
			rec.live = kv
		case k.result():
			rec.result = kv
		}
	}
	if cpRange != nil { // nil: the names were not read
		for _, kv := range cpRange.GetKvs() {
			rec.names = append(rec.names, strings.TrimPrefix(string(kv.Key), k.cpStart()))
		}
	}
	if rec.holder == nil {
		return rec, nil
	}
	if rec.ident == nil || len(rec.holder.Value) == 0 {
		return rec, errCorrupt
	}
	m, err := decodeMeta(rec.ident.Value)
	if err != nil {
		return rec, err
	}
	rec.meta = m
	return rec, nil
}

// state returns the record's state and holder's token.
func (rec record) state() (byte, idempotency.Token) {
	return rec.holder.Value[0], idempotency.Token(rec.holder.Value[1:])
}

// heldBy reports whether the record is STARTED under token.
func (rec record) heldBy(token idempotency.Token) bool {
	return rec.holder != nil && string(rec.holder.Value) == holderValue(stateStarted, token)
}

// fence is the record's fence: the last takeover's, or the revision that
// created the holder key.
func (rec record) fence() int64 {
	if rec.meta.fence != 0 {
		return rec.meta.fence
	}
	return rec.holder.CreateRevision
}

// holderState is what the store remembers of a record it read.
func (rec record) holderState() holderState {
	return holderState{
		hRev:  rec.holder.ModRevision,
		lease: clientv3.LeaseID(rec.holder.Lease),
		grace: rec.meta.grace,
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
	return fmt.Errorf("etcd store: %s: %w", op, err)
}

// wrapWrite is wrap for a write that carried a value: a request the server
// (or the client, before sending) refused as too large wrote nothing, and
// is reported as idempotency.ErrTooLarge.
func (s *Store) wrapWrite(ctx context.Context, op string, err error) error {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("%w: etcd store: %s: %w", idempotency.ErrTooLarge, op, err)
	}
	return s.wrap(ctx, op, err)
}

func isLeaseNotFound(err error) bool {
	return err != nil && errors.Is(err, rpctypes.ErrLeaseNotFound)
}
