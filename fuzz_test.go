package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/internal/jsonfuzz"
	"github.com/exactlyonce/idempotency/store/memory"
)

// The fuzz targets of this file run on their seed corpus (testdata/fuzz)
// in every go test; scripts/fuzz.sh fuzzes them for longer.

// FuzzFingerprintJSON checks that FingerprintJSON is equal for every
// spelling of the same JSON value (key order, whitespace, number
// spellings, string escapes; the spelling is made here from seed),
// different for a different value (one leaf changed, one member or
// element added or removed), and that what is not JSON is refused with
// ErrInvalidArgument.
func FuzzFingerprintJSON(f *testing.F) {
	for _, s := range fingerprintSeeds {
		f.Add([]byte(s), uint64(len(s)))
	}
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		fp, err := idempotency.FingerprintJSON(data)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidArgument) {
				t.Fatalf("FingerprintJSON(%q): error %v does not match ErrInvalidArgument", data, err)
			}
		} else if !json.Valid(data) {
			t.Fatalf("FingerprintJSON(%q) accepted invalid JSON: %s", data, fp)
		}
		rng := rand.New(rand.NewPCG(seed, 1))
		same, ok := jsonfuzz.Reencode(data, rng)
		if !ok {
			return // not a value RFC 8785 takes faithfully
		}
		if err != nil {
			t.Fatalf("FingerprintJSON(%q) refused JSON without duplicate keys or lone surrogates: %v", data, err)
		}
		fp2, err := idempotency.FingerprintJSON(same)
		if err != nil {
			t.Fatalf("FingerprintJSON(%q) (a re-encoding of %q): %v", same, data, err)
		}
		if fp2 != fp {
			t.Fatalf("re-encoding changed the fingerprint:\n%q -> %s\n%q -> %s", data, fp, same, fp2)
		}
		other, _ := jsonfuzz.Mutate(data, rng)
		fp3, err := idempotency.FingerprintJSON(other)
		if err != nil {
			t.Fatalf("FingerprintJSON(%q) (a mutation of %q): %v", other, data, err)
		}
		if fp3 == fp {
			t.Fatalf("different values share a fingerprint:\n%q\n%q\n-> %s", data, other, fp)
		}
	})
}

// fingerprintSeeds are JSON documents (and some that are not) to start
// from: the corpus in testdata/fuzz/FuzzFingerprintJSON adds the edge cases.
var fingerprintSeeds = []string{
	`{"amount": 1000, "currency": "EUR"}`,
	`{"b":[1,1.0,1e0,10E-1,-0,0.1,1e21,1e-7,123456789012345678901234567890],"a":{"é":"\u00e9","/":"\/"}}`,
	`[null,true,false,"",{},[]]`,
	`"\ud83d\ude00 \u2028 \\ \" \b\f\n\r\t"`,
	`{"a":1,"a":2}`,
	`{"a":1}x`,
	`1e400`,
	`"\ud800"`,
	``,
}

// FuzzParseStorageKey checks that ParseStorageKey takes back exactly what
// StorageKey makes: whatever it accepts, StorageKey makes again from the
// parts, and what StorageKey makes from the fuzzed parts is parsed back to
// them. Anything else is refused with ErrInvalidKey.
func FuzzParseStorageKey(f *testing.F) {
	f.Add("6:tenant3:abc", "tenant", "abc")
	f.Add("0:1:k", "", "k")
	f.Add("01:a1:b", "a", "b")
	f.Add("1:\x001:k", "\x00", "k")
	f.Add("99999:a", "a:b", "c")
	f.Fuzz(func(t *testing.T, s, part, key string) {
		scope, k, err := idempotency.ParseStorageKey(s)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidKey) {
				t.Fatalf("ParseStorageKey(%q): %v does not match ErrInvalidKey", s, err)
			}
		} else if again, err := idempotency.StorageKey(scope, k); err != nil && !strings.Contains(err.Error(), "longer") || err == nil && again != s {
			t.Fatalf("ParseStorageKey(%q) = %q, %q; StorageKey of those: %q, %v", s, scope, k, again, err)
		}
		made, err := idempotency.StorageKey([]string{part}, key)
		if err != nil {
			return
		}
		scope, k, err = idempotency.ParseStorageKey(made)
		if err != nil || len(scope) != 1 || scope[0] != part || k != key {
			t.Fatalf("ParseStorageKey(StorageKey(%q, %q) = %q) = %q, %q, %v", part, key, made, scope, k, err)
		}
	})
}

// newFuzzRunner returns a runner on a fresh memory store with a manual
// clock, and the storage key of req.
func newFuzzRunner(t *testing.T, req idempotency.Request) (*idempotency.Runner, *memory.Store, *conformancetest.Clock, string) {
	clock := conformancetest.NewClock(time.Unix(1_700_000_000, 0))
	store := memStore(&memory.Options{Now: clock.Now})
	r, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	key, err := r.StorageKey(req)
	if err != nil {
		t.Fatal(err)
	}
	return r, store, clock, key
}

var fuzzReq = idempotency.Request{Scope: []string{"tenant"}, Key: "k", Fingerprint: "fp"}

// fuzzValue is the T of the decoding targets: mode chooses among a few
// shapes of result.
type fuzzStruct struct {
	A int               `json:"a"`
	B []string          `json:"b"`
	C map[string]uint16 `json:"c"`
}

// FuzzStoredResult checks what Do does with a completed record whose
// result bytes come from outside (another version, another codec, damage):
// fn never runs, the call is a replay, and the error, if any, is
// ErrCorrupt, ErrResultNotStored or a *StoredError (ErrPermanent). With
// mode odd, data is instead a value stored by EncodeOutcome (as Do stores
// it), which must be replayed as it was.
func FuzzStoredResult(f *testing.F) {
	f.Add([]byte(`v"ch_1"`), uint8(0))
	f.Add([]byte(`v{"a":1,"b":["x"],"c":{"z":7}}`), uint8(4))
	f.Add([]byte(`e"declined"`), uint8(0))
	f.Add([]byte(`e`), uint8(2))
	f.Add([]byte(`x`), uint8(6))
	f.Add([]byte(`vAAEC`), uint8(2))
	f.Add([]byte(`v"AAEC"`), uint8(2))
	f.Add([]byte(`v1e999`), uint8(6))
	f.Add([]byte{}, uint8(0))
	f.Add([]byte("ch_1"), uint8(1))
	f.Add([]byte("\xff\x00"), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		switch mode / 2 % 4 {
		case 0:
			checkStoredResult(t, data, mode, validString)
		case 1:
			checkStoredResult(t, data, mode, func(b []byte) []byte { return b })
		case 2:
			checkStoredResult(t, data, mode, func(b []byte) fuzzStruct {
				return fuzzStruct{A: len(b), B: []string{validString(b)}, C: map[string]uint16{validString(b): 1}}
			})
		default:
			checkStoredResult(t, data, mode, func(b []byte) int64 { return int64(len(b)) << 40 })
		}
	})
}

func checkStoredResult[T any](t *testing.T, data []byte, mode uint8, value func([]byte) T) {
	ctx := context.Background()
	r, store, _, key := newFuzzRunner(t, fuzzReq)
	stored, want, valid := fuzzInput(t, data, mode, value, func(v T) ([]byte, error) {
		b, keep, err := idempotency.EncodeOutcome(r, v, nil)
		if err == nil && !keep {
			err = errors.New("not kept")
		}
		return b, err
	})
	seedCompleted(t, store, key, stored)
	for range 2 { // and a retry: the record must be unchanged
		res, err := idempotency.Do(ctx, r, fuzzReq, func(context.Context) (T, error) {
			t.Fatalf("fn ran for a completed record holding %q", stored)
			return want, nil
		})
		if !res.Replayed {
			t.Fatalf("stored %q: Replayed false (err %v)", stored, err)
		}
		var se *idempotency.StoredError
		switch {
		case valid && err != nil:
			t.Fatalf("stored %q by EncodeOutcome(%#v): %v", stored, want, err)
		case valid && !sameValue(res.Value, want):
			t.Fatalf("stored %q by EncodeOutcome(%#v): replayed %#v", stored, want, res.Value)
		case err == nil, errors.Is(err, idempotency.ErrResultNotStored), errors.As(err, &se):
		case errors.Is(err, idempotency.ErrCorrupt):
			if errors.Is(err, idempotency.ErrStore) || errors.Is(err, idempotency.ErrPermanent) {
				t.Fatalf("stored %q: corrupt result reported as %v", stored, err)
			}
		default:
			t.Fatalf("stored %q: error %v matches none of ErrCorrupt, ErrResultNotStored, *StoredError", stored, err)
		}
	}
}

// validString is b as a string of valid UTF-8: JSONCodec replaces what is
// not (see its doc; the fuzzer found it), so only []byte values carry
// arbitrary bytes here.
func validString(b []byte) string { return strings.ToValidUTF8(string(b), "?") }

// fuzzInput returns what a decoding target stores: data itself when mode
// is even (bytes from outside), or else the value made from data and its
// encoding, which must then be decoded as it was.
func fuzzInput[T any](t *testing.T, data []byte, mode uint8, value func([]byte) T, encode func(T) ([]byte, error)) (stored []byte, want T, valid bool) {
	if mode%2 == 0 {
		return data, want, false
	}
	want = value(data)
	stored, err := encode(want)
	if err != nil {
		t.Fatalf("encode %#v: %v", want, err)
	}
	return stored, want, true
}

// sameValue reports whether a decoded value equals the one encoded, a nil
// and an empty slice or map being the same (encoding/json does not keep
// that difference).
func sameValue(a, b any) bool {
	return reflect.DeepEqual(a, b) || (isEmpty(a) && isEmpty(b))
}

func isEmpty(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Map:
		return rv.Len() == 0
	}
	return false
}

// seedCompleted writes a COMPLETED record holding result through the
// Store interface, as an older version or a damaged backend could have.
func seedCompleted(t *testing.T, store idempotency.Store, key string, result []byte) {
	ctx := context.Background()
	cr, err := store.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fuzzReq.Fingerprint, Token: "older", Lease: time.Minute})
	if err != nil || cr.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("seed claim: %v %v", cr.Outcome, err)
	}
	if err := store.Complete(ctx, key, "older", result, time.Hour); err != nil {
		t.Fatalf("seed complete: %v", err)
	}
}

// FuzzRecoveryPoint checks what Step does with a recovery point, handed
// over by a takeover, whose bytes come from outside: the step never runs
// again; a point that cannot be decoded gives ErrCorrupt, and when fn
// returns that error the record keeps its point (it is not released), so
// that the next takeover finds it and does not run the step either. With
// mode odd, data is instead a value encoded by the default codec, which
// Step must return as it was.
func FuzzRecoveryPoint(f *testing.F) {
	f.Add([]byte(`"gw_ref_1"`), uint8(0))
	f.Add([]byte(`{"a":1,"b":["x"]}`), uint8(4))
	f.Add([]byte(`"AAEC"`), uint8(2))
	f.Add([]byte(`AAEC`), uint8(2))
	f.Add([]byte(`{"a":`), uint8(4))
	f.Add([]byte{}, uint8(0))
	f.Add([]byte("ref"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		switch mode / 2 % 3 {
		case 0:
			checkRecoveryPoint(t, data, mode, validString)
		case 1:
			checkRecoveryPoint(t, data, mode, func(b []byte) []byte { return b })
		default:
			checkRecoveryPoint(t, data, mode, func(b []byte) fuzzStruct { return fuzzStruct{A: len(b), B: []string{validString(b)}} })
		}
	})
}

func checkRecoveryPoint[T any](t *testing.T, data []byte, mode uint8, value func([]byte) T) {
	ctx := context.Background()
	r, store, clock, key := newFuzzRunner(t, fuzzReq)
	point, want, valid := fuzzInput(t, data, mode, value, func(v T) ([]byte, error) {
		return idempotency.JSONCodec{}.Marshal(v)
	})
	// A holder that recorded the point and crashed.
	cr, err := store.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: fuzzReq.Fingerprint, Token: "crashed", Lease: time.Minute, Grace: time.Hour})
	if err != nil || cr.Outcome != idempotency.OutcomeAcquired {
		t.Fatalf("seed claim: %v %v", cr.Outcome, err)
	}
	if err := store.Checkpoint(ctx, key, "crashed", "call-gateway", point); err != nil {
		t.Fatalf("seed checkpoint: %v", err)
	}
	for attempt := 2; attempt <= 3; attempt++ { // two takeovers
		clock.Advance(idempotency.DefaultLease + time.Minute)
		res, err := idempotency.Do(ctx, r, fuzzReq, func(ctx context.Context) (T, error) {
			return idempotency.Step(ctx, "call-gateway", func(context.Context) (T, error) {
				t.Fatalf("takeover %d ran a recorded step again (point %q)", attempt, point)
				return want, nil
			})
		})
		switch {
		case valid && err != nil:
			t.Fatalf("point %q, encoded from %#v: %v", point, want, err)
		case valid && !sameValue(res.Value, want):
			t.Fatalf("point %q, encoded from %#v: Step returned %#v", point, want, res.Value)
		case err == nil:
			return // completed with the decoded value: nothing more to check
		case !errors.Is(err, idempotency.ErrCorrupt):
			t.Fatalf("point %q: error %v does not match ErrCorrupt", point, err)
		}
		if res.Attempt != attempt {
			t.Fatalf("point %q: attempt %d, want %d", point, res.Attempt, attempt)
		}
		info, ierr := store.Inspect(ctx, key)
		if ierr != nil || info.State != idempotency.StateStarted || !bytes.Equal(info.Checkpoints["call-gateway"], point) {
			t.Fatalf("point %q: after ErrCorrupt the record is %+v (%v), want STARTED with its point", point, info, ierr)
		}
		// A retry within the lease is in progress, and runs nothing.
		if _, err := idempotency.Do(ctx, r, fuzzReq, func(context.Context) (T, error) {
			t.Fatal("fn ran within another holder's lease")
			return want, nil
		}); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("point %q: retry within the lease: %v, want ErrInProgress", point, err)
		}
	}
}
