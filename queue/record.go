package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"time"
)

// The record of an item, as the file stores it (a persisted format: the
// layout below only ever gains a new version byte, never a changed
// meaning). A record is the item's ID (the bbolt key: 8 bytes, big endian)
// and a value of up to three sections, each
//
//	crc32c(payload) uint32 LE | uvarint len(payload) | payload
//
// so that a damaged byte is found and named instead of being sent:
//
//	version byte (recordVersion)
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

// encodeRecord returns a new record of h and b (and x, for a dead item).
func encodeRecord(h *head, b *body, x *end) []byte {
	e := enc{b: make([]byte, 0, 128+len(b.data))}
	e.b = append(e.b, recordVersion)
	encodeHead(&e, h)
	encodeBody(&e, b)
	if x != nil {
		encodeEnd(&e, x)
	}
	return e.b
}

// withHead returns the record old with its head replaced by h, keeping
// its other sections as they are (bytes copied: old may be the file's
// memory).
func withHead(old []byte, h *head) ([]byte, error) {
	_, rest, err := splitHead(old)
	if err != nil {
		return nil, err
	}
	e := enc{b: make([]byte, 0, 128+len(rest))}
	e.b = append(e.b, recordVersion)
	encodeHead(&e, h)
	e.b = append(e.b, rest...)
	return e.b, nil
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

// splitHead decodes the head of a record and returns it with the rest of
// the record (its other sections, undecoded).
func splitHead(rec []byte) (*head, []byte, error) {
	if len(rec) == 0 || rec[0] != recordVersion {
		if len(rec) > 0 && rec[0] > recordVersion {
			return nil, nil, fmt.Errorf("record version %d, newer than this code's %d", rec[0], recordVersion)
		}
		return nil, nil, errDamaged
	}
	d := &dec{b: rec[1:]}
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
