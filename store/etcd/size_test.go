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
	// size returns the bytes of the record's key and of its live marker.
	size := func() (record, live int) {
		resp, err := c.Get(ctx, base, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
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
		return record, live
	}
	rev := func() int64 {
		resp, err := c.Get(ctx, "rev")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	var started, live int
	before := rev()
	res, err := idempotency.Do(ctx, r, req, func(context.Context) (string, error) {
		started, live = size()
		return strings.Repeat("r", 197), nil // 200 bytes stored with the kind byte and quotes
	})
	if err != nil || res.Replayed {
		t.Fatal(res, err)
	}
	revs := rev() - before
	done, _ := size()
	t.Logf("storage key %d bytes; started: record %d bytes + live marker %d bytes; completed: record %d bytes (the live marker stays until its lease ends); a fresh Do writes %d revisions (3 key versions: the claim's record and live marker, the completion's record), kept until compaction",
		len(sk), started, live, done, revs)
	if started == 0 || live == 0 || done == 0 || revs != 2 {
		t.Errorf("started %d + %d bytes, completed %d bytes, %d revisions: want a record, a live marker and 2 revisions", started, live, done, revs)
	}
}
