package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The operator's part of the store ([idempotency.Inspector]): reads of a
// record, its deletion, and the listing of stuck records from the index
// of STARTED records (see keys.go), so that no listing reads the records
// that are COMPLETED, which are nearly all of them.

// stuckBatch is how many index entries one transaction checks: one op
// each, within etcd's default limit of 128 ops a transaction
// (--max-txn-ops); stuckParallel how many such transactions a page sends
// at once, so that a page among many live holders costs a few round
// trips of time, not one per hundred holders.
const (
	stuckBatch    = 100
	stuckParallel = 5
)

// stuckScan bounds the index entries one page of Stuck looks at beyond
// the records it lists, so that a page among many live holders returns
// in a few round trips (with a cursor to go on from).
const stuckScan = 1000

// Inspect implements [idempotency.Inspector]: one transaction reads the
// record, its live marker and its checkpoints, then TimeToLive asks the
// time left on the leases. LeaseLeft is the live marker's (as a claim's
// RetryAfter); ExpiresIn is the record's lease, whole seconds plus half
// of one, at most what was asked: the lease left plus the grace while
// STARTED, the retention once COMPLETED (a shared lease may outlast
// both, see the README).
func (s *Store) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.RecordInfo{}, err
	}
	k := s.keys(key)
	resp, err := s.client.Txn(ctx).Then(k.readRecord()).Commit()
	if err != nil {
		return idempotency.RecordInfo{}, s.wrap(ctx, "inspect", err)
	}
	rec, cps, err := parseWhole(resp.Header.Revision, resp.Responses[0].GetResponseRange().GetKvs(), k)
	if err != nil {
		return idempotency.RecordInfo{}, s.wrap(ctx, "inspect", fmt.Errorf("%w: %w", idempotency.ErrCorrupt, err))
	}
	if rec.h == nil {
		return idempotency.RecordInfo{}, fmt.Errorf("%w: etcd: %q", idempotency.ErrNotFound, key)
	}
	info, err := s.describe(ctx, key, rec, cps, map[clientv3.LeaseID]time.Duration{})
	if err != nil {
		return idempotency.RecordInfo{}, s.wrap(ctx, "inspect", err)
	}
	return info, nil
}

// Purge implements [idempotency.Inspector]: one transaction deletes every
// key of the record and its index entry. A holder of the record then
// finds it changed and gets ErrLeaseLost; a new record's fence is the
// revision that creates it, above every earlier one.
func (s *Store) Purge(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := s.keys(key)
	_, err := s.client.Txn(ctx).Then(
		clientv3.OpDelete(k.base, clientv3.WithRange(k.allEnd())),
		clientv3.OpDelete(k.started()),
	).Commit()
	if err != nil {
		return s.wrap(ctx, "purge", err)
	}
	return nil
}

// Stuck implements [idempotency.Inspector] from the index of STARTED
// records, in storage key order: it reads up to 500 index entries after
// the cursor (one range, keys only), asks which of them have a live
// marker (transactions of 100 keys-only reads, five at once), then reads
// the others whole (record, live marker, checkpoints) and lists the
// STARTED records without a live marker, whose lease etcd has ended:
// those a claim would take over. COMPLETED records are never read; live
// holders cost a keys-only read of their marker. A page looks at no more
// than limit plus 1,000 entries and then returns what it found with a
// cursor (the storage key of the last entry looked at). Entries whose
// record is gone or COMPLETED (left by a record deleted behind the
// store's back) are deleted, each only if its record is unchanged since
// it was read.
func (s *Store) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		return nil, "", fmt.Errorf("%w: etcd: stuck: limit %d is not positive", idempotency.ErrInvalidArgument, limit)
	}
	index := s.prefix + startedInfix
	from := index
	if cursor != "" {
		from = index + cursor + "\x00" // the first key after the cursor's
	}
	ttls := map[clientv3.LeaseID]time.Duration{}
	var out []idempotency.RecordInfo
	for looked := 0; looked < limit+stuckScan; {
		resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(from, clientv3.WithRange(s.prefix+startedEnd),
			clientv3.WithKeysOnly(), clientv3.WithLimit(stuckBatch*stuckParallel))).Commit()
		if err != nil {
			return nil, "", s.wrap(ctx, "stuck: reading the index", err)
		}
		entries := resp.Responses[0].GetResponseRange().GetKvs()
		if len(entries) == 0 {
			return out, "", nil
		}
		keys := make([]string, len(entries))
		for i, e := range entries {
			keys[i] = strings.TrimPrefix(string(e.Key), index)
		}
		live, err := s.liveMarkers(ctx, keys)
		if err != nil {
			return nil, "", s.wrap(ctx, "stuck: reading the live markers", err)
		}
		var candidates []string
		for i, key := range keys {
			if !live[i] {
				candidates = append(candidates, key)
			}
		}
		found, stopped, err := s.stuckAmong(ctx, candidates, limit-len(out), ttls)
		if err != nil {
			return nil, "", err
		}
		out = append(out, found...)
		if stopped != "" {
			return out, stopped, nil // the entries after it are for the next page
		}
		looked += len(keys)
		if len(entries) < stuckBatch*stuckParallel {
			return out, "", nil
		}
		if len(out) == limit {
			return out, keys[len(keys)-1], nil
		}
		from = index + keys[len(keys)-1] + "\x00"
	}
	return out, strings.TrimPrefix(from[:len(from)-1], index), nil
}

// liveMarkers reports, for each storage key, whether its record has a live
// marker, with keys-only reads in transactions of stuckBatch, up to
// stuckParallel of them at once.
func (s *Store) liveMarkers(ctx context.Context, keys []string) ([]bool, error) {
	live := make([]bool, len(keys))
	var wg sync.WaitGroup
	errs := make([]error, (len(keys)+stuckBatch-1)/stuckBatch)
	for b := range errs {
		chunk := keys[b*stuckBatch : min((b+1)*stuckBatch, len(keys))]
		wg.Go(func() {
			ops := make([]clientv3.Op, len(chunk))
			for i, key := range chunk {
				ops[i] = clientv3.OpGet(s.keys(key).live(), clientv3.WithKeysOnly())
			}
			resp, err := s.client.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				errs[b] = err
				return
			}
			for i := range chunk {
				live[b*stuckBatch+i] = len(resp.Responses[i].GetResponseRange().GetKvs()) > 0
			}
		})
	}
	wg.Wait()
	return live, errors.Join(errs...)
}

// stuckAmong reads the records of keys (which had no live marker) whole,
// in key order, and returns those still stuck as this read sees them, up
// to limit; stopped is the key of the last one listed when it stopped at
// limit before the end of keys. It deletes the index entries of records
// that are gone or COMPLETED.
func (s *Store) stuckAmong(ctx context.Context, keys []string, limit int, ttls map[clientv3.LeaseID]time.Duration) (out []idempotency.RecordInfo, stopped string, err error) {
	for len(keys) > 0 {
		chunk := keys[:min(stuckBatch, len(keys))]
		keys = keys[len(chunk):]
		ops := make([]clientv3.Op, len(chunk))
		for i, key := range chunk {
			ops[i] = s.keys(key).readRecord()
		}
		resp, err := s.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, "", s.wrap(ctx, "stuck: reading the records", err)
		}
		var stale []clientv3.Op
		for i, key := range chunk {
			k := s.keys(key)
			rec, cps, err := parseWhole(resp.Header.Revision, resp.Responses[i].GetResponseRange().GetKvs(), k)
			switch {
			case err != nil:
				return nil, "", s.wrap(ctx, "stuck", fmt.Errorf("%w: record %q: %w", idempotency.ErrCorrupt, key, err))
			case rec.h == nil || rec.state != stateStarted:
				// Not STARTED: the entry outlived its record. Delete it
				// unless the record changed since this read.
				var hRev int64
				if rec.h != nil {
					hRev = rec.h.ModRevision
				}
				stale = append(stale, clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.holder()), "=", hRev)},
					[]clientv3.Op{clientv3.OpDelete(k.started())}, nil))
				continue
			case rec.live != nil:
				continue // taken over or renewed since the live markers were read
			}
			info, err := s.describe(ctx, key, rec, cps, ttls)
			if err != nil {
				return nil, "", s.wrap(ctx, "stuck", err)
			}
			out = append(out, info)
			if len(out) == limit && (i < len(chunk)-1 || len(keys) > 0) {
				return out, key, s.dropStale(ctx, stale)
			}
		}
		if err := s.dropStale(ctx, stale); err != nil {
			return nil, "", err
		}
	}
	return out, "", nil
}

// dropStale runs the deletions of stale index entries, each a
// transaction of its own inside one.
func (s *Store) dropStale(ctx context.Context, ops []clientv3.Op) error {
	if len(ops) == 0 {
		return nil
	}
	if _, err := s.client.Txn(ctx).Then(ops...).Commit(); err != nil {
		return s.wrap(ctx, "stuck: deleting stale index entries", err)
	}
	return nil
}

// readRecord reads every key of the record but its index entry: its
// checkpoints, the record and its live marker.
func (k recordKeys) readRecord() clientv3.Op {
	return clientv3.OpGet(k.recordStart(), clientv3.WithRange(k.recordEnd()))
}

// parseWhole parses a read of readRecord: the record (with the names of
// its checkpoints) and the checkpoints' values, in fresh slices.
func parseWhole(rev int64, kvs []*mvccpb.KeyValue, k recordKeys) (record, map[string][]byte, error) {
	var meta, cps []*mvccpb.KeyValue
	for _, kv := range kvs {
		if strings.HasPrefix(string(kv.Key), k.cpStart()) {
			cps = append(cps, kv)
		} else {
			meta = append(meta, kv)
		}
	}
	rec, err := parseRecord(rev, kvRange(meta), kvRange(cps), k)
	if err != nil || rec.h == nil || rec.state != stateStarted || len(cps) == 0 {
		return rec, nil, err
	}
	values := make(map[string][]byte, len(cps))
	for _, kv := range cps {
		values[strings.TrimPrefix(string(kv.Key), k.cpStart())] = slices.Clone(kv.Value)
	}
	return rec, values, nil
}

// kvRange is a list of key-values read as one range.
type kvRange []*mvccpb.KeyValue

func (r kvRange) GetKvs() []*mvccpb.KeyValue { return r }

// describe is the RecordInfo of a record read whole, asking the server
// the time left on its leases (once per lease of the life leases in
// ttls, which records share).
func (s *Store) describe(ctx context.Context, key string, rec record, cps map[string][]byte, ttls map[clientv3.LeaseID]time.Duration) (idempotency.RecordInfo, error) {
	info := idempotency.RecordInfo{
		Key:         key,
		State:       idempotency.StateStarted,
		Fingerprint: rec.meta.fp,
		Fence:       rec.fence(),
		Attempt:     rec.meta.attempt,
		Checkpoints: cps,
	}
	if rec.state == stateCompleted {
		info.State = idempotency.StateCompleted
		info.Result = slices.Clone(rec.result)
	} else if rec.live != nil {
		left, err := s.timeLeft(ctx, rec.live)
		if err != nil {
			return info, err
		}
		info.LeaseLeft = max(left, 0)
	}
	id := clientv3.LeaseID(rec.h.Lease)
	life, ok := ttls[id]
	if !ok {
		resp, err := s.client.TimeToLive(ctx, id)
		switch {
		case isLeaseNotFound(err):
		case err != nil:
			return info, err
		case resp.TTL >= 0:
			life = time.Duration(resp.TTL)*time.Second + time.Second/2
		}
		ttls[id] = life
	}
	asked := rec.meta.grace // the retention once COMPLETED: see meta.grace
	if rec.state == stateStarted {
		asked += info.LeaseLeft
	}
	info.ExpiresIn = min(life, asked)
	if asked <= 0 && life > 0 {
		info.ExpiresIn = life // grace 0 with the lease ended: what etcd says
	}
	return info, nil
}
