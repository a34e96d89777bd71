package canon

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

// checkSpan fails when canonicalSpan accepts b but jcs.Transform
// would give anything else than the accepted bytes: the fast path must
// never change a fingerprint.
func checkSpan(t testing.TB, b []byte) bool {
	t.Helper()
	start, end, ok := Span(b)
	if !ok {
		return false
	}
	canon, err := jcs.Transform(b)
	if err != nil {
		t.Fatalf("Span accepted %q, which jcs refuses: %v", b, err)
	}
	if !bytes.Equal(canon, b[start:end]) {
		t.Fatalf("Span accepted %q as %q, jcs gives %q", b, b[start:end], canon)
	}
	return true
}

func TestSpanAccepts(t *testing.T) {
	for _, s := range []string{
		`{"amount":1000,"currency":"EUR","customer":"cus_42"}`,
		`{}`, `[]`, `[{}]`, `0`, `-1`, `123456789012345`, `true`, `null`, `""`,
		` {"a":1}` + "\n",
		`{"":0,"a":[1,2.5,-0.001,1e+21,1e-7,"x"],"b":{"c":null,"d":false}}`,
		`["\"\\\b\f\n\r\t","é€😀","` + "\x7f\u2028" + `","a/b"]`,
		`{"A":1,"B":2,"a":3,"b":4}`,
		`[4.5,0.1,100,1.5e+300,9007199254740992]`,
	} {
		if !checkSpan(t, []byte(s)) {
			t.Errorf("%s: canonical but not recognized", s)
		}
	}
}

func TestSpanDefers(t *testing.T) {
	for _, s := range []string{
		`{"b":1,"a":2}`, `{"a":1,"a":1}`, `{"a" :1}`, `{"a":1 }`, `[1, 2]`,
		`{"a":1.0}`, `[1e2]`, `[1E+21]`, `[-0]`, `[0.10]`, `[01]`, `[1.]`, `[.5]`,
		`["\u0041"]`, `["\/"]`, `["\u001f"]`, `{"\n":1}`, `{"é":1}`,
		`["` + "\x01" + `"]`, "[\"\xff\"]", "[\"\xed\xa0\x80\"]",
		``, ` `, `{`, `[1,]`, `{"a":}`, `{"a":1,}`, `[1]x`, `tru`, `nul`, `-`, `1e`, `1e+`,
		`[1e400]`, `[123456789012345678901234567890]`, `[9007199254740993]`,
		strings.Repeat("[", maxCanonicalDepth+1) + strings.Repeat("]", maxCanonicalDepth+1),
	} {
		if checkSpan(t, []byte(s)) {
			t.Errorf("%q: accepted, want deferred to the library", s)
		}
	}
}

// TestSpanRandom compares the fast path with the library on
// random documents, half of them canonical by construction.
func TestSpanRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		randomJSON(rng, &b, 0, i%2 == 0)
		doc := []byte(b.String())
		if checkSpan(t, doc) {
			accepted++
		}
		// Damage it: a byte changed must not make the scanner accept what
		// the library refuses or rewrites.
		if len(doc) > 0 {
			d := bytes.Clone(doc)
			const damage = "{}[]\",:0-.e \\\x00\xc3a"
			d[rng.IntN(len(d))] = damage[rng.IntN(len(damage))]
			checkSpan(t, d)
		}
	}
	if accepted < 5000 {
		t.Fatalf("only %d of 20000 random documents took the fast path", accepted)
	}
}

func FuzzSpan(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[true,null,"x\n"]}`, `[1.5e+300,-0.001]`, `{"b":1,"a":2}`, `"\u00e9"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkSpan(t, b) })
}

// randomJSON writes a random document; canonical asks for one written as
// RFC 8785 writes it (sorted ASCII keys, shortest numbers, no spaces).
func randomJSON(rng *rand.Rand, b *strings.Builder, depth int, canonical bool) {
	k := rng.IntN(8)
	if depth > 3 && k < 2 {
		k += 2
	}
	space := func() {
		if !canonical && rng.IntN(4) == 0 {
			i := rng.IntN(3)
			b.WriteString(" \n\t"[i : i+1])
		}
	}
	switch k {
	case 0: // object
		n := rng.IntN(5)
		keys := map[string]bool{}
		var list []string
		for len(list) < n {
			key := randomKey(rng, canonical)
			if !keys[key] {
				keys[key] = true
				list = append(list, key)
			}
		}
		if canonical {
			sortStrings(list)
		}
		b.WriteByte('{')
		for i, key := range list {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			b.WriteString(strconv.Quote(key))
			space()
			b.WriteByte(':')
			randomJSON(rng, b, depth+1, canonical)
		}
		b.WriteByte('}')
	case 1: // array
		b.WriteByte('[')
		for i := range rng.IntN(5) {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			randomJSON(rng, b, depth+1, canonical)
		}
		b.WriteByte(']')
	case 2, 3: // number
		b.WriteString(randomNumber(rng, canonical))
	case 4, 5: // string
		b.WriteString(randomString(rng, canonical))
	default:
		b.WriteString([]string{"true", "false", "null"}[rng.IntN(3)])
	}
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func randomKey(rng *rand.Rand, canonical bool) string {
	const ascii = "abcAB_z0"
	n := rng.IntN(4)
	var b []byte
	for range n {
		b = append(b, ascii[rng.IntN(len(ascii))])
	}
	if !canonical && rng.IntN(5) == 0 {
		b = append(b, "é\n"[rng.IntN(2)])
	}
	return string(b)
}

func randomNumber(rng *rand.Rand, canonical bool) string {
	var f float64
	switch rng.IntN(4) {
	case 0:
		f = float64(rng.IntN(2000) - 1000)
	case 1:
		f = rng.NormFloat64() * 1000
	case 2:
		f = math.Pow(10, float64(rng.IntN(60)-30)) * rng.Float64()
	default:
		f = float64(rng.Int64N(1 << 60))
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil {
		return "0"
	}
	if canonical {
		return s
	}
	switch rng.IntN(5) {
	case 0:
		return strconv.FormatFloat(f, 'e', -1, 64)
	case 1:
		return strconv.FormatFloat(f, 'f', 3, 64)
	case 2:
		return fmt.Sprintf("%.17g", f)
	}
	return s
}

func randomString(rng *rand.Rand, canonical bool) string {
	parts := []string{"a", "Z", " ", "é", "😀", `\"`, `\\`, `\n`, `\t`, `\b`, `/`, "\u2028", "\x7f"}
	if !canonical {
		parts = append(parts, `\u0041`, `\/`, `\u001f`, `\ud83d\ude00`)
	}
	var b strings.Builder
	b.WriteByte('"')
	for range rng.IntN(6) {
		b.WriteString(parts[rng.IntN(len(parts))])
	}
	b.WriteByte('"')
	return b.String()
}
