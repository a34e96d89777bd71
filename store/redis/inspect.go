package redis

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
	goredis "github.com/redis/go-redis/v9"
)

var _ idempotency.Inspector = (*Store)(nil)

// Inspect returns the live record under key, as [idempotency.Inspector]
// documents: one script, which reads the record, TIME and PTTL, so the
// times left are judged by the server's clock.
func (s *Store) Inspect(ctx context.Context, key string) (idempotency.RecordInfo, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.RecordInfo{}, err
	}
	keys, err := s.keys(key)
	if err != nil {
		return idempotency.RecordInfo{}, err
	}
	v, _, err := s.run(ctx, inspectScript, keys[:1], false)
	if err != nil {
		return idempotency.RecordInfo{}, s.wrap("inspect", err)
	}
	a, ok := v.([]any)
	if ok && len(a) == 0 {
		return idempotency.RecordInfo{}, fmt.Errorf("%w: redis: %q", idempotency.ErrNotFound, key)
	}
	if !ok || len(a) != 3 {
		return idempotency.RecordInfo{}, fmt.Errorf("redis: inspect: unexpected reply %v", v)
	}
	now, ok1 := a[0].(int64)
	pttl, ok2 := a[1].(int64)
	fields, ok3 := a[2].([]any)
	if !ok1 || !ok2 || !ok3 {
		return idempotency.RecordInfo{}, fmt.Errorf("redis: inspect: unexpected reply %v", v)
	}
	return decodeRecord(key, fields, now, pttl)
}

// Purge deletes the record under key, as [idempotency.Inspector]
// documents, with one script; with [Options.Notify] it publishes on the
// record's shard channel, which wakes its watchers. The next claim's fence
// is above the purged record's: the shard's fence mark outlives the
// record by Options.FenceMemory (see the README's fence section).
func (s *Store) Purge(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	keys, err := s.keys(key)
	if err != nil {
		return err
	}
	v, _, err := s.run(ctx, purgeScript, keys[:1], false, s.notify)
	if err != nil {
		return s.wrap("purge", err)
	}
	if v != int64(1) {
		return fmt.Errorf("redis: purge: unexpected reply %v", v)
	}
	return nil
}

// Bounds of Stuck. One script makes at most stuckSteps SCAN steps of
// stuckCount keys (about 200 keys, 1 ms of the server's time at most on
// a quiet server: a claim waits behind one script at most, see the
// README), and one call of Stuck runs at most stuckScripts of them, one
// after another, before it returns the page it has (which may be short,
// or empty, with a cursor to go on from).
const (
	stuckCount   = 100
	stuckSteps   = 2
	stuckScripts = 128
	// maxStuckWant bounds the records one script lists.
	maxStuckWant = 500
	// stuckSetLife is how long a listing's set of listed records lives
	// past its latest page: a listing paused for longer starts over its
	// deduplication (and may list a record twice).
	stuckSetLife = 10 * time.Minute
)

// Stuck lists the STARTED records whose lease has ended, as
// [idempotency.Inspector] documents. It walks the keyspace of each node
// (the single server, each master of a cluster, each shard of a ring) in
// the order of their addresses, with SCAN in scripts that judge each
// record by the server's clock as they get it, so the hot path keeps no
// index: the listing is paid by the operator's call. A listing keeps on
// each node a set of the records it listed (a key of the store's prefix
// that lives 10 minutes past the listing's latest page), because SCAN
// may return a key twice: a record stuck during the whole listing is
// listed once; one that changes during it may be listed or not. A call
// does a bounded amount of work (at most 128 scripts of about 200 keys
// each) and may return a short page, even an empty one, with a
// cursor to go on from; the cursor is "" once every node was walked.
//
// The cursor is opaque: it names the listing, a node by its address and
// the node's SCAN cursor. A node that left the deployment during the
// listing (a failover, a resharding) makes the listing go on from the
// next address; records may then be missed or listed twice.
func (s *Store) Stuck(ctx context.Context, cursor string, limit int) ([]idempotency.RecordInfo, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		return nil, "", fmt.Errorf("%w: redis: Stuck: limit %d is not positive", idempotency.ErrInvalidArgument, limit)
	}
	pos, err := parseCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if cursor == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		pos = position{listing: hex.EncodeToString(b[:]), scan: "0"}
	}
	nodes, err := s.scanNodes(ctx)
	if err != nil {
		return nil, "", s.wrap("stuck", err)
	}
	i := sort.Search(len(nodes), func(i int) bool { return nodes[i].addr >= pos.addr })
	if i < len(nodes) && nodes[i].addr != pos.addr {
		pos.scan = "0" // the node is gone: go on from the next one
	}
	var infos []idempotency.RecordInfo
	for scripts := 0; i < len(nodes) && len(infos) < limit && scripts < stuckScripts; scripts++ {
		n := nodes[i]
		set, err := s.stuckSet(ctx, n, pos.listing)
		if err != nil {
			return nil, "", s.wrap("stuck", err)
		}
		r, err := do(s, ctx, set, func(ctx context.Context) (stuckReply, error) {
			v, err := stuckScript.Run(ctx, n.client, nil, s.match, pos.scan, stuckCount, stuckSteps, set,
				stuckSetLife.Milliseconds(), min(limit-len(infos), maxStuckWant)).Result()
			if err != nil {
				return stuckReply{}, err
			}
			return s.decodeStuck(v)
		})
		if err != nil {
			return nil, "", s.wrap("stuck", err)
		}
		infos = append(infos, r.records...)
		pos.scan = r.cursor
		if r.done {
			i++
			pos.scan = "0"
		}
		if i < len(nodes) {
			pos.addr = nodes[i].addr
		}
	}
	if i == len(nodes) {
		return infos, "", nil
	}
	return infos, pos.String(), nil
}

// A scanNode is one node whose keyspace Stuck walks.
type scanNode struct {
	addr   string
	client goredis.Scripter
}

// scanNodes returns the nodes that hold the store's keys, in the order of
// their addresses: the masters of a cluster, the shards of a ring, or the
// client itself.
func (s *Store) scanNodes(ctx context.Context) ([]scanNode, error) {
	var mu sync.Mutex
	var nodes []scanNode
	add := func(_ context.Context, c *goredis.Client) error {
		mu.Lock()
		nodes = append(nodes, scanNode{c.Options().Addr, c})
		mu.Unlock()
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, add)
	case *goredis.Ring:
		err = c.ForEachShard(ctx, add)
	default:
		nodes = []scanNode{{"", s.client}}
	}
	slices.SortFunc(nodes, func(a, b scanNode) int { return strings.Compare(a.addr, b.addr) })
	return nodes, err
}

// stuckSet returns the key of the listing's set on node n: a key of the
// store's prefix, with the tag of the first shard the node serves, so
// that the node's script may use it.
func (s *Store) stuckSet(ctx context.Context, n scanNode, listing string) (string, error) {
	key := func(shard int) string {
		b := make([]byte, 0, len(s.prefix)+tagLen+len(stuckInfix)+len(listing))
		b = appendTag(append(b, s.prefix...), shard)
		return string(append(append(b, stuckInfix...), listing...))
	}
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		for shard := range Shards {
			m, err := c.MasterForKey(ctx, key(shard))
			if err != nil {
				return "", err
			}
			if m.Options().Addr == n.addr {
				return key(shard), nil
			}
		}
		return "", fmt.Errorf("node %s serves none of the store's shards", n.addr)
	case *goredis.Ring:
		for shard := range Shards {
			m, err := c.GetShardClientForKey(key(shard))
			if err != nil {
				return "", err
			}
			if m.Options().Addr == n.addr {
				return key(shard), nil
			}
		}
		return "", fmt.Errorf("ring shard %s serves none of the store's shards", n.addr)
	}
	return key(0), nil
}

// stuckInfix follows the tag in the key of a listing's set, before the
// listing's id.
const stuckInfix = "\x00stuck:"

// stuckReply is what stuckScript returns for a node.
type stuckReply struct {
	cursor  string
	done    bool
	records []idempotency.RecordInfo
}

// decodeStuck reads stuckScript's reply.
func (s *Store) decodeStuck(v any) (stuckReply, error) {
	bad := func() (stuckReply, error) {
		return stuckReply{}, fmt.Errorf("redis: stuck: unexpected reply %.200v", v)
	}
	a, ok := v.([]any)
	if !ok || len(a) != 4 {
		return bad()
	}
	cursor, ok1 := a[0].(string)
	done, ok2 := a[1].(int64)
	now, ok3 := a[2].(int64)
	recs, ok4 := a[3].([]any)
	if !ok1 || !ok2 || !ok3 || !ok4 || len(recs)%3 != 0 || strings.Trim(cursor, "0123456789") != "" || cursor == "" {
		return bad()
	}
	r := stuckReply{cursor: cursor, done: done == 1}
	for i := 0; i < len(recs); i += 3 {
		k, ok1 := recs[i].(string)
		pttl, ok2 := recs[i+1].(int64)
		fields, ok3 := recs[i+2].([]any)
		if !ok1 || !ok2 || !ok3 || len(k) < len(s.prefix)+tagLen || !strings.HasPrefix(k, s.prefix) {
			return bad()
		}
		info, err := decodeRecord(k[len(s.prefix)+tagLen:], fields, now, pttl)
		if err != nil {
			return stuckReply{}, err
		}
		r.records = append(r.records, info)
	}
	return r, nil
}

// decodeRecord reads a record's fields (HGETALL) into a RecordInfo, with
// the server's now and the record's PTTL, both in ms.
func decodeRecord(key string, fields []any, now, pttl int64) (idempotency.RecordInfo, error) {
	info := idempotency.RecordInfo{Key: key, Attempt: 1} // a is absent for 1
	var lease int64
	hasResult := false
	for i := 0; i+1 < len(fields); i += 2 {
		name, _ := fields[i].(string)
		value, _ := fields[i+1].(string)
		var err error
		switch {
		case name == "f":
			info.Fingerprint, err = decodeFingerprint(value)
		case name == "n":
			info.Fence, err = strconv.ParseInt(value, 10, 64)
		case name == "a":
			info.Attempt, err = strconv.Atoi(value)
		case name == "l": // "<deadline>:<grace>:<m>"
			info.State = idempotency.StateStarted
			deadline, _, _ := strings.Cut(value, ":")
			lease, err = strconv.ParseInt(deadline, 10, 64)
		case name == "r":
			hasResult = true
			info.Result = []byte(value)
		case strings.HasPrefix(name, "c:"):
			if info.Checkpoints == nil {
				info.Checkpoints = map[string][]byte{}
			}
			info.Checkpoints[name[2:]] = []byte(value)
		}
		if err != nil {
			return idempotency.RecordInfo{}, fmt.Errorf("redis: corrupt field %q of key %q: %w", name, key, err)
		}
	}
	switch {
	case info.State == idempotency.StateStarted && !hasResult:
		info.LeaseLeft = time.Duration(max(lease-now, 0)) * time.Millisecond
		info.Result = nil
	case info.State == "" && hasResult:
		info.State = idempotency.StateCompleted
		info.ResultSize = len(info.Result)
		info.Checkpoints = nil
	default:
		return idempotency.RecordInfo{}, fmt.Errorf("redis: key %q has both a lease and a result, or neither", key)
	}
	if pttl > 0 {
		info.ExpiresIn = time.Duration(pttl) * time.Millisecond
	}
	return info, nil
}

// decodeFingerprint inverts encodeFingerprint.
func decodeFingerprint(stored string) (idempotency.Fingerprint, error) {
	switch {
	case len(stored) == 33 && stored[0] == 'h':
		return idempotency.Fingerprint("sha256:" + hex.EncodeToString([]byte(stored[1:]))), nil
	case len(stored) > 0 && stored[0] == '=':
		return idempotency.Fingerprint(stored[1:]), nil
	}
	return "", fmt.Errorf("not a stored fingerprint: %q", stored)
}

// position is a place in the listing of Stuck: the listing's id (which
// names its sets), the address of the node being walked, and SCAN's
// cursor on it ("0" for its start).
type position struct {
	listing, addr, scan string
}

// cursorVersion starts every cursor, so that a cursor of another layout is
// refused rather than misread.
const cursorVersion = "r2:"

// String returns the cursor of p: "r2:<listing>:<scan cursor>:<node
// address>" in unpadded base64url.
func (p position) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorVersion + p.listing + ":" + p.scan + ":" + p.addr))
}

// parseCursor reads a cursor made by position.String; "" is the start.
func parseCursor(cursor string) (position, error) {
	if cursor == "" {
		return position{}, nil
	}
	bad := func() (position, error) {
		return position{}, fmt.Errorf("%w: redis: Stuck: not a cursor of this store: %q", idempotency.ErrInvalidArgument, cursor)
	}
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return bad()
	}
	rest, ok := strings.CutPrefix(string(b), cursorVersion)
	if !ok {
		return bad()
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 || len(parts[0]) != 16 || strings.Trim(parts[0], "0123456789abcdef") != "" ||
		parts[1] == "" || strings.Trim(parts[1], "0123456789") != "" {
		return bad()
	}
	return position{listing: parts[0], scan: parts[1], addr: parts[2]}, nil
}
