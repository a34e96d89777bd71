package queue_test

import (
	"os"
	"strings"
	"testing"
)

// The README's example is Example_offline's body, line for line.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, r, ok := strings.Cut(string(readme), "## Example")
	if !ok {
		t.Fatal("README.md has no Example section")
	}
	_, r, _ = strings.Cut(r, "```go\n")
	block, _, _ := strings.Cut(r, "```")
	_, s, ok := strings.Cut(string(src), "func Example_offline() {\n")
	if !ok {
		t.Fatal("example_test.go has no Example_offline")
	}
	body, _, _ := strings.Cut(s, "\n}\n")
	var want []string
	for _, line := range strings.Split(body, "\n") {
		want = append(want, strings.TrimPrefix(line, "\t"))
	}
	if got := strings.TrimRight(block, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("README.md's example and Example_offline differ:\nREADME:\n%s\n\nexample_test.go:\n%s", got, strings.Join(want, "\n"))
	}
}
