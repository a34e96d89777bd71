package etcd

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var errWatchClosed = errors.New("etcd: watch closed")

// Watch implements [idempotency.Watcher] through etcd's watch API: it
// returns when the record under key is completed, released, taken over or
// deleted, or is not STARTED when Watch begins, or when ctx is done
// (returning ctx's error).
//
// It reads the record's key, then watches it from the next revision, so a
// change made after the read is never missed, and returns at the first
// event that deletes the key or changes its value (a renewal or a
// checkpoint rewrites it with the same value and is ignored). A watch that
// fails (its revision compacted, the member lost its leader) returns an
// error, and callers poll instead.
func (s *Store) Watch(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := s.keys(key)
	resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(k.holder())).Commit()
	if err != nil {
		return s.wrap(ctx, "watch", err)
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 || len(kvs[0].Value) == 0 || kvs[0].Value[0] != stateStarted {
		return nil
	}
	held := string(kvs[0].Value)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	ch := s.client.Watch(wctx, k.holder(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range ch {
		if err := wr.Err(); err != nil {
			return s.wrap(ctx, "watch", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE || string(ev.Kv.Value) != held {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.wrap(ctx, "watch", errWatchClosed)
}
