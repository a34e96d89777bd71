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
	// size returns the bytes of the record's key and of its live marker,
	// and of its entry in the index of STARTED records.
	size := func() (record, live, index int) {
		resp, err := c.Get(ctx, base, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		entry, err := c.Get(ctx, s.StartedKey(sk))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range entry.Kvs {
			index = kv.Size() + 17
		}
		for _, kv := range resp.Kvs {
			switch {
			case strings.HasSuffix(string(kv.Key), "\x00h"):
				record = kv.Size() + 17
			case strings.HasSuffix(string(kv.Key), "\x00l"):
				live = kv.Size() + 17
			default:
				t.Errorf("unexpected key %q", kv.Key)
			}
		}
		return record, live, index
	}
	rev := func() int64 {
		resp, err := c.Get(ctx, "rev")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	var started, live, index int
	before := rev()
	res, err := idempotency.Do(ctx, r, req, func(context.Context) (string, error) {
		started, live, index = size()
		return strings.Repeat("r", 197), nil // 200 bytes stored with the kind byte and quotes
	})
	if err != nil || res.Replayed {
		t.Fatal(res, err)
	}
	revs := rev() - before
	done, _, doneIndex := size()
	t.Logf("storage key %d bytes; started: record %d bytes + live marker %d bytes + index entry %d bytes; completed: record %d bytes (the live marker stays until its lease ends, the index entry is deleted); a fresh Do writes %d revisions (5 key versions: the claim's record, live marker and index entry, the completion's record and the entry's deletion), kept until compaction",
		len(sk), started, live, index, done, revs)
	if started == 0 || live == 0 || index == 0 || done == 0 || doneIndex != 0 || revs != 2 {
		t.Errorf("started %d + %d + %d bytes, completed %d bytes (+ %d in the index), %d revisions: want a record, a live marker, an index entry deleted on completion and 2 revisions", started, live, index, done, doneIndex, revs)
	}
}
