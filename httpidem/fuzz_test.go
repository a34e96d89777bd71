package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/internal/jsonfuzz"
)

// The fuzz targets of this file run on their seed corpus (testdata/fuzz)
// in every go test; scripts/fuzz.sh fuzzes them for longer. They use the
// middleware's public behaviour only, so they hold whatever its internals.

// keyEcho is a handler that answers the client key it runs under, and
// counts its runs.
type keyEcho struct{ runs atomic.Int64 }

func (h *keyEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	info, _ := idempotency.FromContext(r.Context())
	io.WriteString(w, info.Key)
}

// send serves one POST with the key header set to value (absent when
// value is nil) and body.
func send(h http.Handler, value *string, contentType string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(body))
	if value != nil {
		req.Header["Idempotency-Key"] = []string{*value}
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// checkProblem fails unless w is an RFC 9457 problem of status and typ,
// with no header but the problem's own (and the replay header when
// replayed): nothing of a stored response leaks into it.
func checkProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string, what string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("%s: status %d, want %d (%s)", what, w.Code, status, w.Body.Bytes())
	}
	var p httpidem.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Type != typ || p.Status != status {
		t.Fatalf("%s: body %s (%v), want a problem of type %s", what, w.Body.Bytes(), err, typ)
	}
	for name := range w.Header() {
		switch name {
		case "Content-Type", "Content-Length", "Cache-Control", "Idempotent-Replayed":
		default:
			t.Fatalf("%s: problem response has header %s: %q", what, name, w.Header()[name])
		}
	}
	if ct := w.Header().Get("Content-Type"); ct != httpidem.ProblemContentType {
		t.Fatalf("%s: Content-Type %q", what, ct)
	}
}

// sfString parses an RFC 8941 sf-string (section 4.2.5): written here
// from the RFC, apart from the middleware's parser, to compare with it.
func sfString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var sb strings.Builder
	inner := v[1 : len(v)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", false
			}
			sb.WriteByte(inner[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String(), true
}

// quote is the sf-string form of a key of printable ASCII.
func quote(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzKeyHeader checks the Idempotency-Key header through the middleware:
// a value is accepted exactly when it is a bare key or an RFC 8941
// sf-string holding a valid key, and the handler then runs under that
// key; every other form of the same key (quoted, bare, with surrounding
// whitespace) addresses the same record and gets the replay; anything
// refused is refused with 400 and a ProblemKeyMalformed problem, and
// never runs the handler.
func FuzzKeyHeader(f *testing.F) {
	for _, s := range []string{
		"9f2c4e1a-order-7", `"9f2c4e1a-order-7"`, ` "a\"b\\c" `, `"a\x"`, `"abc`, `"a"b"`,
		`"a";p=1`, `""`, "", " \t ", `a"b`, "\t k \t", "é", `"é"`, "a\x00b", "\xff",
		strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat("k", 255) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var h keyEcho
		mw := wrap(t, newRunner(t, memStore(nil)), &h)

		// What the documentation says the value means.
		v := strings.Trim(raw, " \t")
		key, ok := v, v != ""
		if ok && v[0] == '"' {
			key, ok = sfString(v)
		}
		if ok {
			_, err := idempotency.StorageKey([]string{"tenant-1"}, key)
			ok = err == nil
		}

		w := send(mw, &raw, "", nil)
		if !ok {
			checkProblem(t, w, http.StatusBadRequest, httpidem.ProblemKeyMalformed, "key "+strconvQuote(raw))
			if h.runs.Load() != 0 {
				t.Fatalf("key %q refused, but the handler ran", raw)
			}
			return
		}
		if w.Code != http.StatusOK || w.Body.String() != key || h.runs.Load() != 1 {
			t.Fatalf("key %q: status %d, handler ran %d times under key %q, want key %q",
				raw, w.Code, h.runs.Load(), w.Body.String(), key)
		}

		// Every other spelling of the key addresses the same record.
		forms := []string{" " + raw + "\t"}
		if printableASCII(key) {
			forms = append(forms, quote(key), "\t"+quote(key)+" ")
		} else {
			// Not an sf-string: refused, and not taken as a bare key.
			q := `"` + key + `"`
			checkProblem(t, send(mw, &q, "", nil), http.StatusBadRequest, httpidem.ProblemKeyMalformed, "quoted non-ASCII "+strconvQuote(q))
		}
		if key[0] != '"' && strings.Trim(key, " \t") == key {
			forms = append(forms, key)
		}
		for _, form := range forms {
			w := send(mw, &form, "", nil)
			if w.Code != http.StatusOK || w.Body.String() != key || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("key %q sent as %q: status %d, body %q, replayed %q; want the replay of key %q",
					raw, form, w.Code, w.Body.String(), w.Header().Get("Idempotent-Replayed"), key)
			}
		}
		if n := h.runs.Load(); n != 1 {
			t.Fatalf("key %q: the handler ran %d times over %d spellings", raw, n, len(forms)+1)
		}
	})
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

var jsonTypes = []string{"application/json", "application/merge-patch+json; charset=utf-8", "text/plain", ""}

// FuzzBodyFingerprint checks the request fingerprint of the middleware on
// JSON bodies: a retry whose JSON body spells the same value differently
// (key order, whitespace, numbers, escapes; made here from seed) gets the
// replay, a retry with another value gets 422 (ProblemKeyReused); the same
// for DefaultFingerprint called directly, which for a body that is not JSON,
// or not sent as JSON, is RawFingerprint.
func FuzzBodyFingerprint(f *testing.F) {
	for i, s := range fingerprintBodies {
		f.Add([]byte(s), uint64(i), uint8(i))
	}
	f.Fuzz(func(t *testing.T, body []byte, seed uint64, ct uint8) {
		contentType := jsonTypes[int(ct)%len(jsonTypes)]
		rng := rand.New(rand.NewPCG(seed, 2))
		same, sameOK := jsonfuzz.Reencode(body, rng)
		other, otherOK := jsonfuzz.Mutate(body, rng)

		fp := func(b []byte) (idempotency.Fingerprint, idempotency.Fingerprint) {
			req := httptest.NewRequest(http.MethodPost, "/payments?b=2&a=1", nil)
			if contentType != "" {
				req.Header.Set("Content-Type", contentType)
			}
			def, err := httpidem.DefaultFingerprint(req, b)
			if err != nil {
				t.Fatalf("DefaultFingerprint(%q): %v", b, err)
			}
			raw, err := httpidem.RawFingerprint(req, b)
			if err != nil {
				t.Fatalf("RawFingerprint(%q): %v", b, err)
			}
			return def, raw
		}
		def, raw := fp(body)
		asJSON := len(body) > 0 && strings.Contains(contentType, "json")
		inner, err := idempotency.FingerprintJSON(body)
		if (err != nil || !asJSON) && def != raw {
			t.Fatalf("body %q (%s) is not taken as JSON, yet DefaultFingerprint %s != RawFingerprint %s", body, contentType, def, raw)
		}
		// What DefaultFingerprint documents, composed of the exported
		// helpers: the fingerprints of stored records must not change.
		if want := idempotency.FingerprintParts(http.MethodPost, "/payments", "a=1&b=2", "json", string(inner)); err == nil && asJSON && def != want {
			t.Fatalf("body %q (%s): DefaultFingerprint %s, want %s", body, contentType, def, want)
		}
		if !sameOK {
			return
		}
		if def2, _ := fp(same); (def2 == def) != (asJSON || bytes.Equal(same, body)) {
			t.Fatalf("body %q and its re-encoding %q (%s): fingerprints %s and %s", body, same, contentType, def, def2)
		}
		if def3, _ := fp(other); def3 == def {
			t.Fatalf("bodies %q and %q (%s) of different values share fingerprint %s", body, other, contentType, def)
		}
		if !asJSON {
			return
		}

		// The same through the middleware.
		var h keyEcho
		mw := wrap(t, newRunner(t, memStore(nil)), &h)
		key := "k"
		if w := send(mw, &key, contentType, body); w.Code != http.StatusOK {
			t.Fatalf("first request: %d %s", w.Code, w.Body.Bytes())
		}
		if w := send(mw, &key, contentType, same); w.Code != http.StatusOK || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("body %q, then its re-encoding %q (%s): %d %s, want the replay", body, same, contentType, w.Code, w.Body.Bytes())
		}
		if otherOK {
			w := send(mw, &key, contentType, other)
			checkProblem(t, w, http.StatusUnprocessableEntity, httpidem.ProblemKeyReused,
				"body "+strconvQuote(string(body))+", then "+strconvQuote(string(other)))
		}
		if n := h.runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times", n)
		}
	})
}

var fingerprintBodies = []string{
	`{"amount": 1000, "currency": "EUR", "meta": {"note": "caf\u00e9 \/ 1"}}`,
	`[1, 1.0, 1e0, 10E-1, 0.1, -0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308]`,
	`{"é": "é", "\u00e9\u00e9": ["\ud83d\ude00", "/"]}`,
	`{"a":1,"a":2}`,
	`not json`,
	``,
}

// FuzzStoredResponse checks what the middleware answers when the store
// holds, for the request's key, a completed record whose bytes come from
// outside (another version, another codec, damage): the handler never
// runs; the answer is a replay of a final status, 410 when the response
// was not stored, or 500 (ProblemResultCorrupt) with nothing of the record in
// its headers. With mode%3 == 0, data is the raw record, as the store
// holds it; with mode%3 == 1, it is the stored response inside a record
// that Do wrote; with mode%3 == 2, data is a response the handler gives,
// whose replay must equal it.
func FuzzStoredResponse(f *testing.F) {
	f.Add([]byte("v\"AQAAyAEA\""), uint8(0))
	f.Add([]byte("\x01\x00\xc8\x01\x0cContent-Type\x10application/json{}"), uint8(1))
	f.Add([]byte("\x01\x01\xc8\x01\x00"), uint8(1))
	f.Add([]byte("\x01\x00\xc8\x01\x01\x08Location\x05/p/1Xbody"), uint8(1))
	f.Add([]byte("\x01\x00\x64\x00"), uint8(1))
	f.Add([]byte("\x01\x00\xc8\x01\x02\x08Location\x05/p/1\x10"), uint8(1))
	f.Add([]byte("201 body"), uint8(2))
	f.Add([]byte("x"), uint8(0))
	f.Add([]byte{}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		ctx := context.Background()
		store := memStore(nil)
		r := newRunner(t, store)
		var h keyEcho
		mw := wrap(t, r, &h, httpidem.WithStoredHeaders("Location", "Content-Type"))
		key := "k"

		var original *httptest.ResponseRecorder
		switch mode % 3 {
		case 0, 1:
			stored := data
			if mode%3 == 1 {
				// As Do stores a []byte result under the default codec:
				// its kind, then the bytes as they are.
				stored = append([]byte{'b'}, data...)
			}
			req := httptest.NewRequest(http.MethodPost, "/payments", nil)
			fp, err := httpidem.DefaultFingerprint(req, nil)
			if err != nil {
				t.Fatal(err)
			}
			skey, err := r.StorageKey(idempotency.Request{Scope: []string{"tenant-1"}, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			cr, err := store.Claim(ctx, idempotency.ClaimRequest{Key: skey, Fingerprint: fp, Token: "older", Lease: time.Minute})
			if err != nil || cr.Outcome != idempotency.OutcomeAcquired {
				t.Fatalf("seed claim: %v %v", cr.Outcome, err)
			}
			if err := store.Complete(ctx, skey, "older", stored, time.Hour); err != nil {
				t.Fatal(err)
			}
		default:
			// A handler's own response: status from the first byte,
			// a Location header and the rest as the body.
			status := 200
			if len(data) > 0 {
				status = 200 + int(data[0])%300 // stored: 2xx to 4xx but 408 and 429
				if !httpidem.Stored(status) {
					status = 201
				}
			}
			resp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/p/"+strconvQuote(string(data)))
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(status)
				w.Write(data)
			})
			mw = wrap(t, r, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if h.runs.Add(1) > 1 {
					t.Fatal("the handler ran twice")
				}
				resp(w, r)
			}), httpidem.WithStoredHeaders("Location", "Content-Type"))
			original = send(mw, &key, "", nil)
		}

		w := send(mw, &key, "", nil)
		if original != nil {
			if w.Code != original.Code || !bytes.Equal(w.Body.Bytes(), original.Body.Bytes()) ||
				w.Header().Get("Location") != original.Header().Get("Location") ||
				w.Header().Get("Content-Type") != original.Header().Get("Content-Type") ||
				w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("response %d %q %q, replayed as %d %q %q", original.Code, original.Header(), original.Body.Bytes(), w.Code, w.Header(), w.Body.Bytes())
			}
			return
		}
		if h.runs.Load() != 0 {
			t.Fatalf("record %q: the handler ran", data)
		}
		switch {
		case w.Code == http.StatusInternalServerError:
			checkProblem(t, w, w.Code, httpidem.ProblemResultCorrupt, "record "+strconvQuote(string(data)))
		case w.Code == http.StatusGone:
			checkProblem(t, w, w.Code, httpidem.ProblemResponseNotStored, "record "+strconvQuote(string(data)))
		case w.Header().Get("Idempotent-Replayed") != "true":
			t.Fatalf("record %q: answered %d without the replay header", data, w.Code)
		case w.Code < 200:
			t.Fatalf("record %q: replayed as %d, not a final status", data, w.Code)
		}
	})
}
