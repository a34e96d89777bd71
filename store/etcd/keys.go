package etcd

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/exactlyonce/idempotency"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A record is one etcd key, plus a live marker while STARTED and one key
// per checkpoint, under one base, the store's prefix followed by the
// storage key and a NUL byte:
//
//	<prefix><storage key>\x00c/<name>   checkpoint <name> (STARTED only)
//	<prefix><storage key>\x00h          the record: state, token, attempt,
//	                                    grace, fence, fingerprint, result
//	<prefix><storage key>\x00l          live marker, on the holder's lease
//
// Storage keys never contain NUL, so the base of one storage key is never
// a prefix of another's: a range from base+"h" to base+"s", or over
// base+"c/", holds keys of one record only, whatever the keys are. The
// suffixes sort c/ < h < l, so one range reads the record and its live
// marker, another the checkpoints, and one from base+"c/" to base+"s"
// all three.
//
// While a record is STARTED it also has an entry in the store's index of
// STARTED records, which Stuck reads instead of the keyspace:
//
//	<prefix>\x00s/<storage key>       empty, on the record's life lease
//
// Storage keys are never empty, so no record's key starts with the
// prefix and a NUL: the index is a range of its own. The claim that
// creates or takes over the record writes the entry, every move of the
// record's life re-attaches it, and Complete, Release and Purge delete
// it, each in the transaction that decides, so it costs no round trip;
// when the life lease ends etcd deletes it with the record.
//
// The record key and the checkpoints are attached to one etcd lease, the
// record's life (lease plus grace while STARTED, the retention once
// COMPLETED): etcd deletes them together, in one revision, when it ends.
// Every operation that moves the record's life re-attaches all of them in
// the transaction that decides it. The live marker is on the holder's
// lease; once the record is COMPLETED nothing reads it, and it is left to
// that lease.
type recordKeys struct {
	base string
	plen int // the length of the store's prefix, with which base starts
}

func (s *Store) keys(storageKey string) recordKeys {
	return recordKeys{base: s.prefix + storageKey + "\x00", plen: len(s.prefix)}
}

// startedInfix follows the prefix in the keys of the index of STARTED
// records; startedEnd ends their range.
const (
	startedInfix = "\x00s/"
	startedEnd   = "\x00s0"
)

// started is the record's entry in the index of STARTED records.
func (k recordKeys) started() string {
	return k.base[:k.plen] + startedInfix + k.base[k.plen:len(k.base)-1]
}

func (k recordKeys) holder() string             { return k.base + "h" }
func (k recordKeys) live() string               { return k.base + "l" }
func (k recordKeys) checkpoint(n string) string { return k.base + "c/" + n }

// metaStart and metaEnd bound the range holding the record and its live
// marker.
func (k recordKeys) metaStart() string { return k.base + "h" }
func (k recordKeys) metaEnd() string   { return k.base + "s" }

// cpStart and cpEnd bound the range of the checkpoints.
func (k recordKeys) cpStart() string { return k.base + "c/" }
func (k recordKeys) cpEnd() string   { return k.base + "c0" }

// recordStart and recordEnd bound the range of the checkpoints, the
// record and its live marker.
func (k recordKeys) recordStart() string { return k.cpStart() }
func (k recordKeys) recordEnd() string   { return k.metaEnd() }

// allEnd ends the range of every key of the record, which starts at base.
func (k recordKeys) allEnd() string { return k.base[:len(k.base)-1] + "\x01" }

// States, as the first byte of the record. Persisted: never change them.
const (
	stateStarted   = 's'
	stateCompleted = 'c'
)

// meta is what a record keeps besides its state, token and result.
type meta struct {
	attempt int
	// grace is, while STARTED, how long the record is kept after its
	// lease; once COMPLETED, the retention Complete was asked for (records
	// completed by a store older than the Inspector kept the grace there),
	// at which Inspect caps ExpiresIn.
	grace time.Duration
	// fence is the fence handed out by the last takeover, or 0 when the
	// record was never taken over: its fence is then the create revision
	// of its key (the revision of the claim that created it).
	fence int64
	fp    idempotency.Fingerprint
}

// holderPrefix starts the value of a record in state held under tok: the
// state byte and the token, length-prefixed, so that the values of one
// state and token are exactly those that have this prefix.
func holderPrefix(state byte, tok idempotency.Token) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(tok))
	b = append(b, state)
	b = binary.AppendUvarint(b, uint64(len(tok)))
	return append(b, tok...)
}

// encodeRecord is the value of a record: holderPrefix, then attempt, grace
// in milliseconds and fence as uvarints, the fingerprint (length-prefixed)
// and the result (the rest, COMPLETED only).
func encodeRecord(state byte, tok idempotency.Token, m meta, result []byte) string {
	b := holderPrefix(state, tok)
	b = binary.AppendUvarint(b, uint64(m.attempt))
	b = binary.AppendUvarint(b, uint64(m.grace/time.Millisecond))
	b = binary.AppendUvarint(b, uint64(m.fence))
	b = binary.AppendUvarint(b, uint64(len(m.fp)))
	b = append(b, m.fp...)
	return string(append(b, result...))
}

var errCorrupt = errors.New("etcd: corrupt record")

// decodeRecord parses a record's value. The result aliases b.
func decodeRecord(b []byte) (state byte, tok idempotency.Token, m meta, result []byte, err error) {
	if len(b) == 0 || b[0] != stateStarted && b[0] != stateCompleted {
		return 0, "", meta{}, nil, errCorrupt
	}
	state, b = b[0], b[1:]
	field := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	bytesField := func() ([]byte, bool) {
		n, ok := field()
		if !ok || n > uint64(len(b)) {
			return nil, false
		}
		v := b[:n]
		b = b[n:]
		return v, true
	}
	t, ok := bytesField()
	var vals [3]uint64
	for i := range vals {
		if ok {
			vals[i], ok = field()
		}
	}
	var fp []byte
	if ok {
		fp, ok = bytesField()
	}
	if !ok {
		return 0, "", meta{}, nil, errCorrupt
	}
	m = meta{
		attempt: int(vals[0]),
		grace:   time.Duration(vals[1]) * time.Millisecond,
		fence:   int64(vals[2]),
		fp:      idempotency.Fingerprint(fp),
	}
	return state, idempotency.Token(t), m, b, nil
}

// heldBy compares the record's value with the prefix of state and tok:
// true exactly when the record exists in that state under that token. A
// record's value always goes on after the prefix (its attempt at least),
// so it is greater than the prefix itself.
func heldBy(k recordKeys, state byte, tok idempotency.Token) []clientv3.Cmp {
	p := string(holderPrefix(state, tok))
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(k.holder()), ">", p),
		clientv3.Compare(clientv3.Value(k.holder()), "<", clientv3.GetPrefixRangeEnd(p)),
	}
}

// ceilMillis rounds d up to whole milliseconds, the unit in which grace is
// kept.
func ceilMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
