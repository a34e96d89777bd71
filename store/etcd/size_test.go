package etcd_test

import (
	"context"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBytesPerRecord measures what a record occupies in etcd's key-value
// store: for each of its keys, the key-value as etcd stores it in bbolt
// (the marshaled mvccpb.KeyValue under a 17-byte revision key), for a
// completed record of a 200-byte result with a sha256 fingerprint and a
// 64-byte storage key, and for a started one; and how many revisions one
// fresh Do writes (all kept until compaction).
func TestBytesPerRecord(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c, nil)
	r, err := idempotency.New(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	req := idempotency.Request{Scope: []string{"tenant-427"}, Key: "order-7-" + strings.Repeat("x", 40), Fingerprint: idempotency.FingerprintBytes([]byte("body"))}
	sk, _ := r.StorageKey(req)
	base := strings.TrimSuffix(s.Key(sk), "h")
	size := func() (int, int) {
		resp, err := c.Get(ctx, base, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, kv := range resp.Kvs {
			n += kv.Size() + 17
		}
		return n, len(resp.Kvs)
	}
	rev := func() int64 {
		resp, err := c.Get(ctx, "rev")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	var startedBytes, startedKeys int
	before := rev()
	res, err := idempotency.Do(ctx, r, req, func(context.Context) (string, error) {
		startedBytes, startedKeys = size()
		return strings.Repeat("r", 197), nil // 200 bytes stored with the kind byte and quotes
	})
	if err != nil || res.Replayed {
		t.Fatal(res, err)
	}
	revs := rev() - before
	doneBytes, doneKeys := size()
	t.Logf("storage key %d bytes; started: %d keys, %d bytes; completed: %d keys, %d bytes; a fresh Do writes %d revisions (%d key versions: claim h,i,l; completion h,i,r and l's tombstone), kept until compaction",
		len(sk), startedKeys, startedBytes, doneKeys, doneBytes, revs, 7)
	if doneKeys != 3 || startedKeys != 3 || revs != 2 {
		t.Errorf("started %d keys, completed %d keys, %d revisions: want 3, 3 and 2", startedKeys, doneKeys, revs)
	}
}
