package jsonfuzz

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// TestReencode checks that the spellings are valid JSON of the same value
// (as encoding/json decodes it) and that they do vary: key order, number
// and string spellings.
func TestReencode(t *testing.T) {
	doc := `{"a": 1, "b": [0.5, -0, 1e21, "é/\n"], "c": {"x": null, "y": true}}`
	var want any
	json.Unmarshal([]byte(doc), &want)
	seen := map[string]bool{}
	var all strings.Builder
	for i := range 200 {
		b, ok := Reencode([]byte(doc), rand.New(rand.NewPCG(uint64(i), 0)))
		if !ok {
			t.Fatal("Reencode refused a plain document")
		}
		var got any
		if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("Reencode gave %s (%v), another value", b, err)
		}
		seen[string(b)] = true
		all.Write(b)
	}
	if len(seen) < 150 {
		t.Fatalf("only %d spellings in 200", len(seen))
	}
	for _, s := range []string{`\u00e9`, `\u00E9`, `\/`, `\u000a`, "E+", "e-", "0.5", ".0", `"c"`, `-0`} {
		if !strings.Contains(all.String(), s) {
			t.Errorf("no spelling has %q", s)
		}
	}
	for _, bad := range []string{`{"a":1,"a":2}`, `"\ud800"`, `1e400`, "\"\xff\"", `{`, `1 2`} {
		if _, ok := Reencode([]byte(bad), rand.New(rand.NewPCG(1, 0))); ok {
			t.Errorf("Reencode(%q) should refuse", bad)
		}
	}
}

// TestMutate checks that a mutation decodes to another value.
func TestMutate(t *testing.T) {
	doc := `{"a": 1, "b": [0.5, "é", false, null, {}], "c": ""}`
	var orig any
	json.Unmarshal([]byte(doc), &orig)
	for i := range 200 {
		b, ok := Mutate([]byte(doc), rand.New(rand.NewPCG(uint64(i), 0)))
		var got any
		if err := json.Unmarshal(b, &got); !ok || err != nil || reflect.DeepEqual(got, orig) {
			t.Fatalf("Mutate gave %s (%v, %v), the same value", b, ok, err)
		}
	}
}
