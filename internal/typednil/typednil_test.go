package typednil

import (
	"io"
	"strings"
	"testing"
)

func TestIs(t *testing.T) {
	var r *strings.Reader
	var w io.Writer
	var m map[string]int
	var f func()
	for _, c := range []struct {
		v    any
		want bool
	}{
		{nil, true}, {r, true}, {io.Reader(r), true}, {w, true}, {m, true}, {f, true},
		{strings.NewReader("x"), false}, {0, false}, {"", false}, {struct{}{}, false}, {map[string]int{}, false},
	} {
		if got := Is(c.v); got != c.want {
			t.Errorf("Is(%#v) = %v, want %v", c.v, got, c.want)
		}
	}
}
