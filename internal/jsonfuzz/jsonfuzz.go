// Package jsonfuzz rewrites JSON documents for fuzz targets: Reencode
// spells the same value differently (object key order, whitespace, number
// spellings such as 1, 1.0, 1e0 and 10E-1, string escapes such as \u00e9
// for é and \/ for /), and Mutate spells a different value (one leaf
// changed, or one member or element added or removed). The fingerprint
// fuzz targets of the root package and of httpidem share it.
//
// Values are compared as RFC 8785 compares them: numbers as IEEE 754
// doubles, strings as sequences of code points, objects as sets of
// members.
package jsonfuzz

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// node is a parsed JSON value.
type node struct {
	kind    byte // 'n' null, 'b' bool, 'f' number, 's' string, 'a' array, 'o' object
	b       bool
	f       float64
	s       string
	elems   []*node
	members []member
}

type member struct {
	name  string
	value *node
}

// surrogateEscape matches a \u escape of a UTF-16 surrogate, which
// encoding/json turns into U+FFFD when it is not part of a valid pair: such
// documents are not rewritten.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89abcdefABCDEF]`)

// Parse parses data into a value that Reencode and Mutate can spell. It
// reports false for what RFC 8785 refuses or this package cannot spell
// faithfully: invalid JSON, invalid UTF-8, surrogate escapes, duplicate
// object keys, numbers out of the double range.
func parse(data []byte) (*node, bool) {
	if !json.Valid(data) || !utf8.Valid(data) || surrogateEscape.Match(data) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	n, ok := parseValue(dec)
	if !ok {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return n, true
}

func parseValue(dec *json.Decoder) (*node, bool) {
	tok, err := dec.Token()
	if err != nil {
		return nil, false
	}
	return parseToken(dec, tok)
}

func parseToken(dec *json.Decoder, tok json.Token) (*node, bool) {
	switch t := tok.(type) {
	case nil:
		return &node{kind: 'n'}, true
	case bool:
		return &node{kind: 'b', b: t}, true
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, false
		}
		return &node{kind: 'f', f: f}, true
	case string:
		return &node{kind: 's', s: t}, true
	case json.Delim:
		switch t {
		case '[':
			n := &node{kind: 'a'}
			for dec.More() {
				e, ok := parseValue(dec)
				if !ok {
					return nil, false
				}
				n.elems = append(n.elems, e)
			}
			_, err := dec.Token() // ]
			return n, err == nil
		case '{':
			n := &node{kind: 'o'}
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, false
				}
				name := k.(string)
				if seen[name] {
					return nil, false
				}
				seen[name] = true
				v, ok := parseValue(dec)
				if !ok {
					return nil, false
				}
				n.members = append(n.members, member{name, v})
			}
			_, err := dec.Token() // }
			return n, err == nil
		}
	}
	return nil, false
}

// Reencode returns data spelled differently, with choices drawn from rng,
// and true; or false when data cannot be rewritten faithfully (see the
// package doc).
func Reencode(data []byte, rng *rand.Rand) ([]byte, bool) {
	n, ok := parse(data)
	if !ok {
		return nil, false
	}
	var b []byte
	b = write(b, n, rng)
	return b, true
}

// Mutate returns a document whose value differs from data's, spelled
// with choices drawn from rng, and true; or false as Reencode does.
func Mutate(data []byte, rng *rand.Rand) ([]byte, bool) {
	root, ok := parse(data)
	if !ok {
		return nil, false
	}
	var all []*node
	var walk func(*node)
	walk = func(n *node) {
		all = append(all, n)
		for _, e := range n.elems {
			walk(e)
		}
		for _, m := range n.members {
			walk(m.value)
		}
	}
	walk(root)
	n := all[rng.IntN(len(all))]
	switch n.kind {
	case 'n':
		*n = node{kind: 'b'}
	case 'b':
		n.b = !n.b
	case 'f':
		if n.f == 1 {
			n.f = 2
		} else {
			n.f = 1
		}
	case 's':
		if n.s != "" && rng.IntN(2) == 0 {
			_, size := utf8.DecodeLastRuneInString(n.s)
			n.s = n.s[:len(n.s)-size]
		} else {
			n.s += string([]rune(" aé€😀")[rng.IntN(5)])
		}
	case 'a':
		if len(n.elems) > 0 && rng.IntN(2) == 0 {
			n.elems = n.elems[:len(n.elems)-1]
		} else {
			n.elems = append(n.elems, &node{kind: 'n'})
		}
	case 'o':
		if len(n.members) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(n.members))
			n.members = append(n.members[:i], n.members[i+1:]...)
			break
		}
		name := ""
		for {
			dup := false
			for _, m := range n.members {
				dup = dup || m.name == name
			}
			if !dup {
				break
			}
			name += "k"
		}
		n.members = append(n.members, member{name, &node{kind: 'n'}})
	}
	var b []byte
	b = write(b, root, rng)
	return b, true
}

func space(b []byte, rng *rand.Rand) []byte {
	for range rng.IntN(3) {
		b = append(b, " \t\n\r"[rng.IntN(4)])
	}
	return b
}

func write(b []byte, n *node, rng *rand.Rand) []byte {
	b = space(b, rng)
	switch n.kind {
	case 'n':
		b = append(b, "null"...)
	case 'b':
		b = strconv.AppendBool(b, n.b)
	case 'f':
		b = appendNumber(b, n.f, rng)
	case 's':
		b = appendString(b, n.s, rng)
	case 'a':
		b = append(b, '[')
		for i, e := range n.elems {
			if i > 0 {
				b = append(space(b, rng), ',')
			}
			b = write(b, e, rng)
		}
		b = append(space(b, rng), ']')
	case 'o':
		b = append(b, '{')
		order := rng.Perm(len(n.members))
		for i, j := range order {
			if i > 0 {
				b = append(space(b, rng), ',')
			}
			m := n.members[j]
			b = appendString(space(b, rng), m.name, rng)
			b = append(space(b, rng), ':')
			b = write(b, m.value, rng)
		}
		b = append(space(b, rng), '}')
	}
	return space(b, rng)
}

// appendNumber spells f as a JSON number of exactly the same decimal
// value as f's shortest representation: its digits, with trailing zeros
// added, the decimal point anywhere, and the exponent adjusted.
func appendNumber(b []byte, f float64, rng *rand.Rand) []byte {
	if f < 0 || (f == 0 && rng.IntN(2) == 0) {
		b = append(b, '-') // -0 is 0 in RFC 8785
	}
	// d.ddde±x: value = digits × 10^(x - (len(digits)-1)).
	e := strconv.FormatFloat(math.Abs(f), 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(expStr)
	exp := x - (len(digits) - 1)
	zeros := rng.IntN(4)
	digits += strings.Repeat("0", zeros)
	exp -= zeros
	// Place the point after p digits: value = digits[:p].digits[p:] ×
	// 10^(exp + len(digits) - p); p == 0 writes "0.digits".
	p := rng.IntN(len(digits) + 1)
	if digits[0] == '0' && p > 1 {
		p = 1 // no leading zeros in JSON's integer part
	}
	if p == 0 {
		b = append(b, '0')
	}
	b = append(b, digits[:p]...)
	if p < len(digits) {
		b = append(b, '.')
		b = append(b, digits[p:]...)
	}
	shown := exp + len(digits) - p
	if shown == 0 && rng.IntN(2) == 0 {
		return b
	}
	b = append(b, "eE"[rng.IntN(2)])
	if shown >= 0 && rng.IntN(2) == 0 {
		b = append(b, '+')
	}
	if shown < 0 {
		b = append(b, '-')
		shown = -shown
	}
	b = append(b, strings.Repeat("0", rng.IntN(2))...)
	return strconv.AppendInt(b, int64(shown), 10)
}

const hexDigits = "0123456789abcdef0123456789ABCDEF"

func appendU(b []byte, u uint16, rng *rand.Rand) []byte {
	b = append(b, '\\', 'u')
	c := 16 * rng.IntN(2) // lower or upper case
	for s := 12; s >= 0; s -= 4 {
		b = append(b, hexDigits[c+int(u>>s&0xf)])
	}
	return b
}

var shortEscapes = map[rune]byte{'\b': 'b', '\f': 'f', '\n': 'n', '\r': 'r', '\t': 't', '"': '"', '\\': '\\', '/': '/'}

func appendString(b []byte, s string, rng *rand.Rand) []byte {
	b = append(b, '"')
	for _, r := range s {
		short, hasShort := shortEscapes[r]
		mustEscape := r < 0x20 || r == '"' || r == '\\'
		switch k := rng.IntN(3); {
		case !mustEscape && k == 2:
			b = utf8.AppendRune(b, r)
		case hasShort && k != 1:
			b = append(b, '\\', short)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			b = appendU(appendU(b, uint16(r1), rng), uint16(r2), rng)
		default:
			b = appendU(b, uint16(r), rng)
		}
	}
	return append(b, '"')
}
