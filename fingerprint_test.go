package idempotency_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"

	"github.com/exactlyonce/idempotency"
)

func TestFingerprintJSONCanonical(t *testing.T) {
	same := []string{
		`{"amount":100,"currency":"EUR","meta":{"a":1,"b":[1,2]}}`,
		`{"currency":"EUR","amount":100,"meta":{"b":[1,2],"a":1}}`,
		`{ "amount" : 100.0, "currency" : "\u0045UR", "meta" : { "a" : 1e0, "b" : [ 1.00, 2 ] } }`,
		`{"amount":1e2,"currency":"EUR","meta":{"a":10e-1,"b":[1,0.2e1]}}`,
	}
	want, err := idempotency.FingerprintJSON([]byte(same[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range same[1:] {
		got, err := idempotency.FingerprintJSON(json.RawMessage(s))
		if err != nil || got != want {
			t.Errorf("%s: %s, %v; want %s", s, got, err, want)
		}
	}
	// A Go value marshals to the same canonical form.
	v := map[string]any{"currency": "EUR", "amount": 100, "meta": map[string]any{"b": []int{1, 2}, "a": 1}}
	if got, err := idempotency.FingerprintJSON(v); err != nil || got != want {
		t.Errorf("Go value: %s, %v; want %s", got, err, want)
	}
	differ := []string{
		`{"amount":101,"currency":"EUR","meta":{"a":1,"b":[1,2]}}`,
		`{"amount":"100","currency":"EUR","meta":{"a":1,"b":[1,2]}}`,
		`{"amount":100,"currency":"EUR","meta":{"a":1,"b":[2,1]}}`,
		`{"amount":100,"currency":"eur","meta":{"a":1,"b":[1,2]}}`,
		`{"amount":100,"currency":"EUR","meta":{"a":1,"b":[1,2]},"x":null}`,
	}
	seen := map[idempotency.Fingerprint]string{want: same[0]}
	for _, s := range differ {
		got, err := idempotency.FingerprintJSON([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("%s and %s have the same fingerprint", s, prev)
		}
		seen[got] = s
	}
}

func TestFingerprintJSONRejectsBrokenJSON(t *testing.T) {
	for _, s := range []string{`{"a":`, `{'a':1}`, ``, `{"a":1}{`} {
		if _, err := idempotency.FingerprintJSON([]byte(s)); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("%q: err = %v, want ErrInvalidArgument", s, err)
		}
	}
	if _, err := idempotency.FingerprintJSON(func() {}); !errors.Is(err, idempotency.ErrInvalidArgument) {
		t.Errorf("func value: %v", err)
	}
}

func TestFingerprintPartsUnambiguous(t *testing.T) {
	a := idempotency.FingerprintParts("POST", "/pay", "ab", "c")
	b := idempotency.FingerprintParts("POST", "/pay", "a", "bc")
	if a == b {
		t.Fatal("parts are concatenated ambiguously")
	}
	if a != idempotency.FingerprintParts("POST", "/pay", "ab", "c") {
		t.Fatal("not deterministic")
	}
	if idempotency.FingerprintBytes([]byte("x")) == idempotency.FingerprintBytes([]byte("y")) {
		t.Fatal("bytes fingerprint collides")
	}
}

func TestStorageKeyUnambiguous(t *testing.T) {
	cases := []struct {
		scope []string
		key   string
	}{
		{[]string{"a:b"}, "c"},
		{[]string{"a"}, "b:c"},
		{[]string{"a", "b"}, "c"},
		{[]string{"ab"}, "c"},
		{nil, "abc"},
		{[]string{"1:a"}, "bc"},
	}
	seen := map[string]int{}
	for i, c := range cases {
		k, err := idempotency.StorageKey(c.scope, c.key)
		if err != nil {
			t.Fatal(err)
		}
		if j, dup := seen[k]; dup {
			t.Errorf("cases %d and %d share storage key %q", i, j, k)
		}
		seen[k] = i
	}
}

// FuzzStorageKey checks that distinct (scope, key) pairs never share a
// storage key.
func FuzzStorageKey(f *testing.F) {
	f.Add("a", "b", "c", "d")
	f.Add("a:b", "c", "a", "b:c")
	f.Fuzz(func(t *testing.T, s1, k1, s2, k2 string) {
		a, err1 := idempotency.StorageKey([]string{s1}, k1)
		b, err2 := idempotency.StorageKey([]string{s2}, k2)
		if err1 != nil || err2 != nil {
			return
		}
		if (a == b) != (s1 == s2 && k1 == k2) {
			t.Fatalf("(%q,%q)->%q, (%q,%q)->%q", s1, k1, a, s2, k2, b)
		}
	})
}

// TestFingerprintJSONStable pins the fingerprint of a document in every
// spelling, fast path or not, to the value v0.1.0 computed: the SHA-256 of
// the RFC 8785 form. A change here would turn retries of requests recorded
// by earlier versions into mismatches.
func TestFingerprintJSONStable(t *testing.T) {
	const canon = `{"amount":1000,"currency":"EUR","customer":"cus_42","tags":["a\nb","é"],"x":1.5}`
	sum := sha256.Sum256([]byte(canon))
	want := idempotency.Fingerprint("sha256:" + hex.EncodeToString(sum[:]))
	for _, s := range []string{
		canon,
		canon + "\n",
		`{"x":1.50,"tags":["a\u000ab","\u00e9"],"customer":"cus_42","currency":"EUR","amount":1e3}`,
		"{\n  \"amount\": 1000,\n  \"currency\": \"EUR\",\n  \"customer\": \"cus_42\",\n  \"tags\": [\"a\\nb\", \"é\"],\n  \"x\": 1.5\n}",
	} {
		got, err := idempotency.FingerprintJSON([]byte(s))
		if err != nil || got != want {
			t.Errorf("%s: %s, %v; want %s", s, got, err, want)
		}
	}
}
