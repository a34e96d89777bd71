package postgres

import "testing"

func TestParseTID(t *testing.T) {
	for in, want := range map[string][2]uint64{"": {0, 0}, "(0,0)": {0, 0}, "(12,3)": {12, 3}, "(4294967295,65535)": {4294967295, 65535}} {
		b, o, ok := parseTID(in)
		if !ok || b != want[0] || o != want[1] {
			t.Errorf("parseTID(%q) = %d, %d, %v; want %d, %d, true", in, b, o, ok, want[0], want[1])
		}
		if in != "" && formatTID(b, o) != in {
			t.Errorf("formatTID(%d, %d) = %q, want %q", b, o, formatTID(b, o), in)
		}
	}
	for _, in := range []string{"(12,3", "12,3)", "12,3", "(1,2)x", "(-1,2)", "(4294967296,1)", "(1,65536)", "( 1,2)", "(01,2)", "(1;2)", "()", "key"} {
		if _, _, ok := parseTID(in); ok {
			t.Errorf("parseTID(%q) accepted it", in)
		}
	}
}
