package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"time"
)

// The records of an item, as the file stores them (a persisted format:
// the layout below only ever gains a new version byte, never a changed
// meaning). Each is a value under the item's ID (the bbolt key: 8 bytes,
// big endian): a version byte (recordVersion) and sections, each
//
//	crc32c(payload) uint32 LE | uvarint len(payload) | payload
//
// so that a damaged byte is found and named instead of being sent. A
// pending item has a head record (the head section) in the items bucket
// and a body record (the body section) in the bodies bucket, so that
// Open reads the small heads only and a retry rewrites its head only; a
// dead item has one record of all three sections in the dead bucket:
//
//	head: key, order, method, url (uvarint length + bytes each),
//	      enqueued, sent, expires, next (varint Unix nanoseconds, 0 = none),
//	      attempts (uvarint), last error (uvarint length + bytes)
//	body: header count, then per header: name, value count, values;
//	      then the body (uvarint length + bytes)
//	end:  (dead items only) reason, status (uvarint), replayed (1 byte),
//	      response header (as in body), response body, truncated (1 byte)
//
// The head is a section of its own, so that a damaged body still leaves
// the item's ordering key known and only its own order stopped.
const recordVersion = 1

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errDamaged is the cause of a record whose checksum or framing is wrong.
var errDamaged = errors.New("damaged record")

// head is the part of an item that changes while it waits.
type head struct {
	key, order, method, url string
	enqueued, sent          time.Time
	expires, next           time.Time
	attempts                int
	lastErr                 string
}

// body is the part of an item that never changes.
type body struct {
	header http.Header
	data   []byte
}

// end is how a dead item ended.
type end struct {
	reason string
	resp   *Response // nil when no response stopped it
}

type enc struct{ b []byte }

func (e *enc) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) str(s string)     { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *enc) bytes(p []byte)   { e.uvarint(uint64(len(p))); e.b = append(e.b, p...) }
func (e *enc) time(t time.Time) {
	var n int64
	if !t.IsZero() {
		n = t.UnixNano()
	}
	e.b = binary.AppendVarint(e.b, n)
}
func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *enc) header(h http.Header) {
	e.uvarint(uint64(len(h)))
	for name, vs := range h {
		e.str(name)
		e.uvarint(uint64(len(vs)))
		for _, v := range vs {
			e.str(v)
		}
	}
}

// section appends a section whose payload fill writes.
func (e *enc) section(fill func(*enc)) {
	var p enc
	fill(&p)
	e.b = binary.LittleEndian.AppendUint32(e.b, crc32.Checksum(p.b, crcTable))
	e.bytes(p.b)
}

func encodeHead(e *enc, h *head) {
	e.section(func(p *enc) {
		p.str(h.key)
		p.str(h.order)
		p.str(h.method)
		p.str(h.url)
		p.time(h.enqueued)
		p.time(h.sent)
		p.time(h.expires)
		p.time(h.next)
		p.uvarint(uint64(h.attempts))
		p.str(h.lastErr)
	})
}

func encodeBody(e *enc, b *body) {
	e.section(func(p *enc) {
		p.header(b.header)
		p.bytes(b.data)
	})
}

func encodeEnd(e *enc, x *end) {
	e.section(func(p *enc) {
		p.str(x.reason)
		r := x.resp
		if r == nil {
			p.bool(false)
			return
		}
		p.bool(true)
		p.uvarint(uint64(r.Status))
		p.bool(r.Replayed)
		p.header(r.Header)
		p.bytes(r.Body)
		p.bool(r.Truncated)
	})
}

// headRecord returns the head record of a pending item.
func headRecord(h *head) []byte {
	e := enc{b: make([]byte, 0, 160)}
	e.b = append(e.b, recordVersion)
	encodeHead(&e, h)
	return e.b
}

// bodyRecord returns the body record of a pending item.
func bodyRecord(b *body) []byte {
	e := enc{b: make([]byte, 0, 64+len(b.data))}
	e.b = append(e.b, recordVersion)
	encodeBody(&e, b)
	return e.b
}

// deadRecord returns the record of a dead item.
func deadRecord(h *head, b *body, x *end) []byte {
	e := enc{b: make([]byte, 0, 256+len(b.data))}
	e.b = append(e.b, recordVersion)
	encodeHead(&e, h)
	encodeBody(&e, b)
	encodeEnd(&e, x)
	return e.b
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() {
	if d.err == nil {
		d.err = errDamaged
	}
	d.b = nil
}

func (d *dec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) str() string { return string(d.bytes()) }

func (d *dec) time() time.Time {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return time.Time{}
	}
	d.b = d.b[n:]
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v)
}

func (d *dec) bool() bool {
	if len(d.b) == 0 || d.b[0] > 1 {
		d.fail()
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

func (d *dec) header() http.Header {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	h := make(http.Header, n)
	for range n {
		name := d.str()
		m := d.uvarint()
		if m > uint64(len(d.b)) {
			d.fail()
			return nil
		}
		vs := make([]string, 0, m)
		for range m {
			vs = append(vs, d.str())
		}
		h[name] = vs
	}
	return h
}

// section reads one section, checking its checksum; the returned payload
// is a sub-slice of d's bytes.
func (d *dec) section() (*dec, error) {
	if len(d.b) < 4 {
		return nil, errDamaged
	}
	sum := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	p := d.bytes()
	if d.err != nil {
		return nil, d.err
	}
	if crc32.Checksum(p, crcTable) != sum {
		return nil, errDamaged
	}
	return &dec{b: p}, nil
}

// version checks a record's version byte and returns the rest.
func version(rec []byte) ([]byte, error) {
	if len(rec) == 0 || rec[0] != recordVersion {
		if len(rec) > 0 && rec[0] > recordVersion {
			return nil, fmt.Errorf("record version %d, newer than this code's %d", rec[0], recordVersion)
		}
		return nil, errDamaged
	}
	return rec[1:], nil
}

// splitHead decodes the head of a record and returns it with the rest of
// the record (its other sections, undecoded; none in a head record).
func splitHead(rec []byte) (*head, []byte, error) {
	rest, err := version(rec)
	if err != nil {
		return nil, nil, err
	}
	d := &dec{b: rest}
	p, err := d.section()
	if err != nil {
		return nil, nil, err
	}
	h := &head{
		key: p.str(), order: p.str(), method: p.str(), url: p.str(),
		enqueued: p.time(), sent: p.time(), expires: p.time(), next: p.time(),
	}
	h.attempts = int(p.uvarint())
	h.lastErr = p.str()
	if p.err != nil || len(p.b) != 0 {
		return nil, nil, errDamaged
	}
	return h, d.b, nil
}

// indexHead decodes of a head record what the index keeps: the key, the
// order (a sub-slice of rec: look it up, do not keep it) and the retry
// state. It is splitHead without the strings Open does not need.
func indexHead(rec []byte) (key string, order []byte, st retryState, err error) {
	rest, err := version(rec)
	if err != nil {
		return "", nil, st, err
	}
	d := &dec{b: rest}
	p, err := d.section()
	if err != nil {
		return "", nil, st, err
	}
	key = p.str()
	order = p.bytes()
	p.bytes() // method
	p.bytes() // url
	p.time()  // enqueued
	st.sent, st.expires, st.next = p.time(), p.time(), p.time()
	st.attempts = int(p.uvarint())
	st.lastErr = p.str()
	if p.err != nil || len(p.b) != 0 || len(d.b) != 0 {
		return "", nil, st, errDamaged
	}
	return key, order, st, nil
}

// decodeBody decodes a body record.
func decodeBody(rec []byte) (*body, error) {
	rest, err := version(rec)
	if err != nil {
		return nil, err
	}
	b, x, err := decodeRest(rest)
	if err == nil && x != nil {
		err = errDamaged
	}
	return b, err
}

// decodeRest decodes the sections after the head: the body and, if
// present, the end.
func decodeRest(rest []byte) (*body, *end, error) {
	d := &dec{b: rest}
	p, err := d.section()
	if err != nil {
		return nil, nil, err
	}
	b := &body{header: p.header(), data: append([]byte(nil), p.bytes()...)}
	if p.err != nil || len(p.b) != 0 {
		return nil, nil, errDamaged
	}
	if len(d.b) == 0 {
		return b, nil, nil
	}
	p, err = d.section()
	if err != nil {
		return b, nil, err
	}
	x := &end{reason: p.str()}
	if p.bool() {
		r := &Response{Status: int(p.uvarint()), Replayed: p.bool()}
		r.Header = p.header()
		r.Body = append([]byte(nil), p.bytes()...)
		r.Truncated = p.bool()
		x.resp = r
	}
	if p.err != nil || len(p.b) != 0 || len(d.b) != 0 {
		return b, nil, errDamaged
	}
	return b, x, nil
}
