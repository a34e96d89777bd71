package redis

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
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

// Purge deletes the record under key and its index entry, as
// [idempotency.Inspector] documents, with one script; with
// [Options.Notify] it publishes on the record's shard channel, which wakes
// its watchers. The next claim's fence is above the purged record's: the
// key's high-water mark outlives it by Options.FenceMemory (see the
// README's fence section).
func (s *Store) Purge(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	keys, err := s.keys(key)
	if err != nil {
		return err
	}
	v, _, err := s.run(ctx, purgeScript, keys, false, s.notify, s.fenceMemory)
	if err != nil {
		return s.wrap("purge", err)
	}
	if v != int64(1) {
		return fmt.Errorf("redis: purge: unexpected reply %v", v)
	}
	return nil
}

// Paging of Stuck. Shards are read in batches, one script per shard in one
// pipeline (on a cluster, go-redis sends each node its part at once). A
// page starts with a small batch, in case stuck records are many (a
// batch's shards after the one that fills the page are read for nothing),
// and grows it while they are few, to the size a full pass over 1024
// mostly empty shards needs: 16 + 64 + 256 × 4 shards, six round trips.
const (
	firstStuckBatch = 16
	maxStuckBatch   = 256
	// maxStuckWant bounds the records one script lists, and stuckBudget
	// the entries it looks at beyond them (stale ones), so that no script
	// holds the server long: a shard with more goes on in the next batch.
	maxStuckWant = 500
	stuckBudget  = 256
)

// Stuck lists the STARTED records whose lease has ended, as
// [idempotency.Inspector] documents, without scanning the keyspace: it
// reads the index of STARTED records of each shard (see [Store.Key]) in
// shard order, each shard's entries in the order of their lease deadline,
// taking only the entries whose deadline passed. Each entry is checked
// against its record; entries whose record is gone or no longer STARTED
// (it expired by TTL, or was completed) are stale and dropped. Every
// script works on one shard, and shards are read in pipelined batches, so
// a page costs a few round trips, not one per shard; see the package
// README for figures.
//
// The cursor is opaque: it names a shard and the deadline and storage key
// of the last entry looked at in it. Records are listed in the order of
// their entries, so a record stuck during the whole listing is listed
// once; a record whose lease is renewed or taken over during it moves in
// that order, and may be listed or not.
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
	var infos []idempotency.RecordInfo
	batch, scanned := firstStuckBatch, 0
	for pos.shard < Shards && len(infos) < limit {
		first, n := pos, min(batch, Shards-pos.shard)
		replies, err := s.stuckBatch(ctx, first, n, min(limit-len(infos), maxStuckWant))
		if err != nil {
			return nil, "", s.wrap("stuck", err)
		}
	shards:
		for i, r := range replies {
			shard := first.shard + i
			scanned++
			for _, rec := range r.records {
				if len(infos) == limit {
					return infos, pos.String(), nil
				}
				infos = append(infos, rec.info)
				pos = position{shard: shard, score: rec.score, member: rec.member}
			}
			if !r.done {
				pos = position{shard: shard, score: r.lastScore, member: r.lastMember}
				break shards
			}
			pos = position{shard: shard + 1}
		}
		// Size the next batch for the records still wanted, at the rate
		// found so far.
		if len(infos) == 0 {
			batch = min(batch*4, maxStuckBatch)
		} else {
			need := float64(limit-len(infos)) * float64(scanned) / float64(len(infos))
			batch = int(min(max(need+1, firstStuckBatch), maxStuckBatch))
		}
	}
	return infos, pos.String(), nil
}

// stuckReply is what stuckScript returns for a shard.
type stuckReply struct {
	done                  bool
	lastScore, lastMember string
	records               []stuckRecord
}

type stuckRecord struct {
	score, member string
	info          idempotency.RecordInfo
}

// stuckBatch runs stuckScript on n shards from first, in one pipeline when
// the client has pipelines.
func (s *Store) stuckBatch(ctx context.Context, first position, n, want int) ([]stuckReply, error) {
	keys := make([]string, n)
	args := make([][]any, n)
	for i := range n {
		keys[i] = s.indexKey(first.shard + i)
		args[i] = []any{want, want + stuckBudget, "", ""}
	}
	args[0][2], args[0][3] = first.score, first.member
	vals, err := do(s, ctx, keys[0], func(ctx context.Context) ([]any, error) {
		p, ok := s.client.(pipeliner)
		if !ok {
			vals := make([]any, n)
			for i := range n {
				v, err := stuckScript.Run(ctx, s.client, keys[i:i+1], args[i]...).Result()
				if err != nil {
					return nil, err
				}
				vals[i] = v
			}
			return vals, nil
		}
		cmds := make([]*goredis.Cmd, n)
		pipe := p.Pipeline()
		for i := range n {
			cmds[i] = stuckScript.EvalSha(ctx, pipe, keys[i:i+1], args[i]...)
		}
		_, _ = pipe.Exec(ctx) // errors are read from each command
		// A server that lost its scripts (SCRIPT FLUSH, a restart, a
		// failover) ran none of them: run those again with EVAL.
		var again goredis.Pipeliner
		for i, c := range cmds {
			if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				if again == nil {
					again = p.Pipeline()
				}
				cmds[i] = stuckScript.Eval(ctx, again, keys[i:i+1], args[i]...)
			}
		}
		if again != nil {
			_, _ = again.Exec(ctx)
		}
		vals := make([]any, n)
		for i, c := range cmds {
			v, err := c.Result()
			if err != nil {
				return nil, err
			}
			vals[i] = v
		}
		return vals, nil
	})
	if err != nil {
		return nil, err
	}
	replies := make([]stuckReply, n)
	for i, v := range vals {
		if replies[i], err = decodeStuck(v); err != nil {
			return nil, err
		}
	}
	return replies, nil
}

// decodeStuck reads stuckScript's reply.
func decodeStuck(v any) (stuckReply, error) {
	bad := func() (stuckReply, error) {
		return stuckReply{}, fmt.Errorf("redis: stuck: unexpected reply %v", v)
	}
	a, ok := v.([]any)
	if !ok || len(a) != 5 {
		return bad()
	}
	done, ok1 := a[0].(int64)
	lastScore, ok2 := a[1].(string)
	lastMember, ok3 := a[2].(string)
	now, ok4 := a[3].(int64)
	recs, ok5 := a[4].([]any)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return bad()
	}
	r := stuckReply{done: done == 1, lastScore: lastScore, lastMember: lastMember}
	for _, rv := range recs {
		rec, ok := rv.([]any)
		if !ok || len(rec) != 4 {
			return bad()
		}
		member, ok1 := rec[0].(string)
		score, ok2 := rec[1].(string)
		pttl, ok3 := rec[2].(int64)
		fields, ok4 := rec[3].([]any)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return bad()
		}
		info, err := decodeRecord(member, fields, now, pttl)
		if err != nil {
			return stuckReply{}, err
		}
		r.records = append(r.records, stuckRecord{score: score, member: member, info: info})
	}
	return r, nil
}

// decodeRecord reads a record's fields (HGETALL) into a RecordInfo, with
// the server's now and the record's PTTL, both in ms.
func decodeRecord(key string, fields []any, now, pttl int64) (idempotency.RecordInfo, error) {
	info := idempotency.RecordInfo{Key: key}
	var lease int64
	for i := 0; i+1 < len(fields); i += 2 {
		name, _ := fields[i].(string)
		value, _ := fields[i+1].(string)
		var err error
		switch {
		case name == "f":
			info.Fingerprint, err = decodeFingerprint(value)
		case name == "s":
			info.State = idempotency.State(value)
		case name == "n":
			info.Fence, err = strconv.ParseInt(value, 10, 64)
		case name == "a":
			info.Attempt, err = strconv.Atoi(value)
		case name == "l":
			lease, err = strconv.ParseInt(value, 10, 64)
		case name == "r":
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
	switch info.State {
	case idempotency.StateStarted:
		info.LeaseLeft = time.Duration(max(lease-now, 0)) * time.Millisecond
		info.Result = nil
	case idempotency.StateCompleted:
		if info.Result == nil {
			info.Result = []byte{}
		}
		info.ResultSize = len(info.Result)
		info.Checkpoints = nil
	default:
		return idempotency.RecordInfo{}, fmt.Errorf("redis: key %q has state %q", key, info.State)
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

// position is a place in the listing of Stuck: a shard, and in it the
// deadline (score) and storage key (member) of the last index entry looked
// at, or the start of the shard when score is "".
type position struct {
	shard         int
	score, member string
}

// cursorVersion starts every cursor, so that a cursor of another layout is
// refused rather than misread.
const cursorVersion = "r1:"

// String returns the cursor of p: "" after the last shard, else
// "r1:<shard, 3 hex>:<score>:<member>" in unpadded base64url, which keeps
// any storage key printable.
func (p position) String() string {
	if p.shard >= Shards {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%s%03x:%s:%s", cursorVersion, p.shard, p.score, p.member)))
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
	if !ok || len(rest) < 5 || rest[3] != ':' {
		return bad()
	}
	shard, err := strconv.ParseUint(rest[:3], 16, 16)
	if err != nil || shard >= Shards {
		return bad()
	}
	score, member, ok := strings.Cut(rest[4:], ":")
	if !ok || strings.Trim(score, "0123456789") != "" || (score == "") != (member == "") {
		return bad()
	}
	return position{shard: int(shard), score: score, member: member}, nil
}
