package httpidem

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
)

// recorder is the ResponseWriter the handler writes to. It buffers the
// response so that it can be stored before any byte reaches the client
// (a client never sees a response whose record was not written), up to
// limit bytes of body; beyond that it sends what it has and streams the
// rest, and only a marker is stored.
type recorder struct {
	in     bodyReader // the request body handed to the handler
	w      http.ResponseWriter
	header http.Header // the handler's header until the final status is written
	// after is the header map the handler sees once the final status is
	// written (made by the first Header call after it): as with net/http,
	// what is changed there no longer reaches the response, except the
	// trailers the handler declared.
	after http.Header
	sent  bool // the final status is written: header is the response's
	limit int

	status  int    // 0 until the final header is written
	body    []byte // buffered body: a pooled buffer on a first run
	direct  bool   // the response goes straight to w: too large to store
	flushed bool   // the response has been written to w
	done    bool   // the response is out and body released: writes fail

	expires int64  // the stored response's expiry, Unix seconds; 0: not told
	refOK   bool   // the middleware renders references: StoreReference works
	hasRef  bool   // store ref instead of the body
	ref     string // the handler's reference (StoreReference)
}

// errWriteAfterDone is what a handler gets for writing after it returned.
var errWriteAfterDone = errors.New("httpidem: write after the handler returned")

// bodyReader is the request body as the handler reads it, kept in the
// recorder to save allocations.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

func (rec *recorder) Header() http.Header {
	if !rec.sent {
		return rec.header
	}
	if rec.after == nil {
		rec.after = rec.header.Clone()
	}
	return rec.after
}

func (rec *recorder) WriteHeader(code int) {
	if rec.status != 0 {
		return // like net/http: only the first final status counts
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses (103 Early Hints) go out at once and are
		// not part of what is stored.
		copyHeader(rec.w.Header(), rec.header)
		rec.w.WriteHeader(code)
		return
	}
	if code < 100 || code > 999 {
		panic("httpidem: invalid WriteHeader code " + strconv.Itoa(code))
	}
	rec.status = code
	rec.sent = true
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.done {
		return 0, errWriteAfterDone
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.direct {
		return rec.w.Write(p)
	}
	if len(rec.body)+len(p) > rec.limit {
		rec.goDirect()
		return rec.w.Write(p)
	}
	rec.body = append(rec.body, p...)
	return len(p), nil
}

// WriteString lets io.WriteString avoid a conversion.
func (rec *recorder) WriteString(s string) (int, error) {
	if rec.done {
		return 0, errWriteAfterDone
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.direct || len(rec.body)+len(s) > rec.limit {
		if !rec.direct {
			rec.goDirect()
		}
		return io.WriteString(rec.w, s)
	}
	rec.body = append(rec.body, s...)
	return len(s), nil
}

// Flush is a no-op while the response is buffered (it must be stored
// before the client sees it) and flushes once the response streams.
func (rec *recorder) Flush() {
	if rec.direct {
		http.NewResponseController(rec.w).Flush()
	}
}

// Unwrap gives http.ResponseController access to the connection's
// deadlines.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// StoreReference tells the middleware around w (the ResponseWriter a
// handler gets from [New], or a wrapper of it with an Unwrap method) to
// store ref instead of the response's body: a reference to what the
// request made (the created resource's ID), which the renderer of
// [WithReferenceRenderer] turns back into a response on every replay. The
// response the handler writes is sent to its client as usual, whatever
// its size; only ref and the status are stored, so a replay shows the
// resource as it is then, not the bytes the first client got. The
// fingerprint and scope rules are the same. It reports false, storing
// nothing, when w is not the middleware's or the middleware has no
// reference renderer: the body is then stored as usual (or, too large,
// not at all). Call it before the handler returns; the last call wins.
func StoreReference(w http.ResponseWriter, ref string) bool {
	for {
		switch x := w.(type) {
		case *recorder:
			if !x.refOK || x.done {
				return false
			}
			x.hasRef, x.ref = true, ref
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// Hijack hands the connection to the handler, through a type assertion
// (http.Hijacker) or http.ResponseController alike. What the handler
// then writes goes to the client unseen: the response is out of the
// middleware's hands, so, as for a response too large to store, only a
// marker is stored and retries get 410, never a second run (a retry
// before the handler returned gets 409: the client may read the hijacked
// answer before the marker is stored). It fails,
// changing nothing, where the server's writer cannot hijack (HTTP/2).
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if rec.done || rec.status != 0 {
		return nil, nil, errors.New("httpidem: hijack after the response began")
	}
	conn, rw, err := http.NewResponseController(rec.w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	rec.direct, rec.flushed, rec.body = true, true, nil
	rec.status = http.StatusOK // what the marker records; nothing is sent
	rec.sent = true
	return conn, rw, nil
}

// goDirect sends the buffered part and switches to streaming.
func (rec *recorder) goDirect() {
	rec.direct = true
	rec.flushed = true
	copyHeader(rec.w.Header(), rec.header)
	rec.w.WriteHeader(rec.status)
	if len(rec.body) > 0 {
		rec.w.Write(rec.body)
	}
	rec.body = nil
}

// finish completes the response after the handler returned.
func (rec *recorder) finish() {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if _, ok := rec.header["Content-Type"]; !ok && len(rec.body) > 0 && bodyAllowed(rec.status) && !rec.direct {
		// What net/http would sniff, so the stored response says it too.
		rec.header.Set("Content-Type", http.DetectContentType(rec.body))
	}
	if rec.direct {
		rec.sendTrailers()
	}
}

// hasTrailers reports whether the response has trailers: declared in the
// Trailer header, or set after the body with http.TrailerPrefix.
func (rec *recorder) hasTrailers() bool {
	if len(rec.header["Trailer"]) > 0 {
		return true
	}
	for k := range rec.after {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// sendTrailers hands the trailer values the handler set after the final
// status to the client's writer, which sends them after the body as
// net/http does for a handler that writes directly.
func (rec *recorder) sendTrailers() {
	if rec.after == nil {
		return
	}
	h := rec.w.Header()
	for _, v := range rec.header["Trailer"] {
		for _, name := range strings.Split(v, ",") {
			name = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
			if vs, ok := rec.after[name]; ok {
				h[name] = vs
			}
		}
	}
	for k, vs := range rec.after {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			h[k] = vs
		}
	}
}

// flush writes the buffered response to the client (once), with its
// trailers.
func (rec *recorder) flush() {
	if rec.flushed {
		return
	}
	rec.flushed = true
	copyHeader(rec.w.Header(), rec.header)
	if !rec.hasTrailers() {
		writeBody(rec.w, rec.status, rec.body)
		return
	}
	// No Content-Length: trailers need a chunked (or HTTP/2) body.
	rec.w.WriteHeader(rec.status)
	if len(rec.body) > 0 && bodyAllowed(rec.status) {
		rec.w.Write(rec.body)
	}
	rec.sendTrailers()
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	if bodyAllowed(status) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if len(body) > 0 && bodyAllowed(status) {
		w.Write(body)
	}
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && status >= 200
}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
}

// The stored form of a response, the T of Do. Version 1:
//
//	byte    version (1)
//	byte    flags: flagTooLarge when only the status was kept,
//	        flagExpires when the expiry follows, flagReference when the
//	        body is the handler's reference (and no header is kept)
//	uvarint expiry, Unix seconds (flagExpires only)
//	uvarint status
//	uvarint number of header values, then for each:
//	        uvarint len, name, uvarint len, value
//	rest    body
//
// A compact binary form rather than a JSON object: it is the codec's
// input, so a replaceable codec (encryption, redaction) still sees every
// byte, and it costs a fraction of encoding/json's allocations.
const (
	storedVersion = 1
	flagTooLarge  = 1
	flagExpires   = 2
	flagReference = 4
)

var errCorruptResponse = errors.New("httpidem: stored response is corrupt")

// encode appends to b (empty, a buffer to reuse) the stored form of the
// recorded response: its status, the allowed headers and the body, or
// only the status and a flag when the body went straight to the client.
func (rec *recorder) encode(b []byte, allowed map[string]string) []byte {
	var flags byte
	body := rec.body
	switch {
	case rec.hasRef:
		flags, body = flagReference, []byte(rec.ref)
	case rec.direct:
		flags, body = flagTooLarge, nil
	}
	if rec.expires > 0 {
		flags |= flagExpires
	}
	n, size := 0, 2+binary.MaxVarintLen64*3+len(body)
	if flags&(flagTooLarge|flagReference) == 0 {
		for k, vs := range rec.header {
			if _, ok := allowed[k]; ok {
				for _, v := range vs {
					n++
					size += 2*binary.MaxVarintLen64 + len(k) + len(v)
				}
			}
		}
	}
	b = slices.Grow(b[:0], size)
	b = append(b, storedVersion, flags)
	if rec.expires > 0 {
		b = binary.AppendUvarint(b, uint64(rec.expires))
	}
	b = binary.AppendUvarint(b, uint64(rec.status))
	b = binary.AppendUvarint(b, uint64(n))
	if n > 0 {
		for k, vs := range rec.header {
			if _, ok := allowed[k]; ok {
				for _, v := range vs {
					b = binary.AppendUvarint(b, uint64(len(k)))
					b = append(b, k...)
					b = binary.AppendUvarint(b, uint64(len(v)))
					b = append(b, v...)
				}
			}
		}
	}
	return append(b, body...)
}

// stored is a decoded stored response.
type stored struct {
	status    int
	tooLarge  bool
	reference bool  // body is the handler's reference
	expires   int64 // Unix seconds; 0: not told
	body      []byte
}

// decodeStored decodes a stored response, adding its headers to h; names
// found in names (the allowlist) are shared rather than copied. Bytes that
// are not a whole stored response (another version, damage) give
// errCorruptResponse and leave h as it was.
func decodeStored(b []byte, h http.Header, names map[string]string) (stored, error) {
	var s stored
	if len(b) < 2 || b[0] != storedVersion {
		return s, errCorruptResponse
	}
	flags := b[1]
	s.tooLarge, s.reference = flags&flagTooLarge != 0, flags&flagReference != 0
	b = b[2:]
	if flags&flagExpires != 0 {
		exp, k := binary.Uvarint(b)
		if k <= 0 || exp == 0 || exp > 1<<40 {
			return s, errCorruptResponse
		}
		s.expires = int64(exp)
		b = b[k:]
	}
	status, k := binary.Uvarint(b)
	// Only final statuses are stored: a replayed 1xx would be sent as an
	// interim response, followed by an empty 200.
	if k <= 0 || status < 200 || status > 999 {
		return s, errCorruptResponse
	}
	s.status = int(status)
	b = b[k:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return s, errCorruptResponse
	}
	b = b[k:]
	// Check every header before adding any to h, so that a corrupt record
	// leaks none into the error response.
	for rest, i := b, uint64(0); i < n; i++ {
		var ok bool
		if _, rest, ok = readBytes(rest); ok {
			_, rest, ok = readBytes(rest)
		}
		if !ok {
			return s, errCorruptResponse
		}
	}
	var values []string
	if n > 0 {
		values = make([]string, n)
	}
	for i := range values {
		name, rest, _ := readBytes(b)
		value, rest, _ := readBytes(rest)
		b = rest
		values[i] = string(value)
		key, ok := names[string(name)]
		if !ok {
			key = string(name)
		}
		if old, ok := h[key]; ok {
			h[key] = append(old, values[i])
		} else {
			h[key] = values[i : i+1 : i+1]
		}
	}
	s.body = b
	return s, nil
}

func readBytes(b []byte) ([]byte, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	b = b[k:]
	return b[:n], b[n:], true
}
