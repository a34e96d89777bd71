package etcd

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/exactlyonce/idempotency"
)

// A record is a few etcd keys under one base, the store's prefix followed
// by the storage key and a NUL byte:
//
//	<prefix><storage key>\x00c/<name>   checkpoint <name> (STARTED only)
//	<prefix><storage key>\x00h          holder: state byte + token
//	<prefix><storage key>\x00i          identity: attempt, grace, fence, fingerprint
//	<prefix><storage key>\x00l          live marker, on the holder's lease (STARTED only)
//	<prefix><storage key>\x00r          result (COMPLETED only)
//
// Storage keys never contain NUL, so the base of one storage key is never
// a prefix of another's: a range from base+"h" to base+"s", or over
// base+"c/", holds the keys of one record only, whatever the keys are.
// The suffixes sort c/ < h < i < l < r, so one range reads h, i, l and r,
// and another the checkpoints.
//
// Every key of a record except l is attached to one etcd lease, the
// record's life (lease plus grace while STARTED, the retention once
// COMPLETED): etcd deletes them together, in one revision, when it ends.
// Every operation that moves the record's life re-attaches all of them in
// the transaction that decides it.
type recordKeys struct {
	base string
}

func (s *Store) keys(storageKey string) recordKeys {
	return recordKeys{base: s.prefix + storageKey + "\x00"}
}

func (k recordKeys) holder() string             { return k.base + "h" }
func (k recordKeys) ident() string              { return k.base + "i" }
func (k recordKeys) live() string               { return k.base + "l" }
func (k recordKeys) result() string             { return k.base + "r" }
func (k recordKeys) checkpoint(n string) string { return k.base + "c/" + n }

// metaStart and metaEnd bound the range holding h, i, l and r.
func (k recordKeys) metaStart() string { return k.base + "h" }
func (k recordKeys) metaEnd() string   { return k.base + "s" }

// cpStart and cpEnd bound the range of the checkpoints.
func (k recordKeys) cpStart() string { return k.base + "c/" }
func (k recordKeys) cpEnd() string   { return k.base + "c0" }

// all is the whole record: every key that starts with base.
func (k recordKeys) allEnd() string { return k.base[:len(k.base)-1] + "\x01" }

// States, as the first byte of the holder key. Persisted: never change them.
const (
	stateStarted   = 's'
	stateCompleted = 'c'
)

func holderValue(state byte, tok idempotency.Token) string {
	return string(state) + string(tok)
}

// meta is the value of the identity key.
type meta struct {
	attempt int
	grace   time.Duration
	// fence is the fence handed out by the last takeover, or 0 when the
	// record was never taken over: its fence is then the create revision
	// of its holder key (the revision of the claim that created it).
	fence int64
	fp    idempotency.Fingerprint
}

// metaVersion is the first byte of the identity value. Persisted.
const metaVersion = 1

func (m meta) encode() string {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(m.fp))
	b = append(b, metaVersion)
	b = binary.AppendUvarint(b, uint64(m.attempt))
	b = binary.AppendUvarint(b, uint64(m.grace/time.Millisecond))
	b = binary.AppendUvarint(b, uint64(m.fence))
	b = append(b, m.fp...)
	return string(b)
}

var errCorrupt = errors.New("etcd store: corrupt record")

func decodeMeta(b []byte) (meta, error) {
	if len(b) == 0 || b[0] != metaVersion {
		return meta{}, errCorrupt
	}
	b = b[1:]
	var vals [3]uint64
	for i := range vals {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return meta{}, errCorrupt
		}
		vals[i], b = v, b[n:]
	}
	return meta{
		attempt: int(vals[0]),
		grace:   time.Duration(vals[1]) * time.Millisecond,
		fence:   int64(vals[2]),
		fp:      idempotency.Fingerprint(b),
	}, nil
}

// ceilMillis rounds d up to whole milliseconds, the unit in which grace is
// kept.
func ceilMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
