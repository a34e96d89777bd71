package main

import (
	"bytes"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// section returns the part of a Markdown document under the heading, up to
// the next heading of the same level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no %q section", heading)
	}
	rest := doc[i+len(heading)+2:]
	if j := strings.Index(rest, "\n"+strings.SplitAfter(heading, " ")[0]); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// fenced returns the content of the first code block in s fenced as
// ```lang, and what follows the block.
func fenced(t *testing.T, s, lang string) (code, rest string) {
	t.Helper()
	open := "```" + lang + "\n"
	i := strings.Index(s, open)
	if i < 0 {
		t.Fatalf("no %q block in:\n%s", open, s)
	}
	s = s[i+len(open):]
	j := strings.Index(s, "```\n")
	if j < 0 {
		t.Fatalf("%q block is not closed", open)
	}
	return s[:j], s[j+4:]
}

// funcBody returns the statements of the named function in a Go file,
// one per line with indentation and spacing collapsed, without comments
// that start with "Output:" and the lines after them.
func funcBody(t *testing.T, name string, src []byte) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name+".go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != name || fd.Recv != nil {
			continue
		}
		body := string(src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset])
		if i := strings.Index(body, "// Output:"); i >= 0 {
			body = body[:i]
		}
		var lines []string
		for _, l := range strings.Split(body, "\n") {
			if l = strings.Join(strings.Fields(l), " "); l != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	t.Fatalf("no func %s", name)
	return nil
}

// The Quick start in README.md is a complete program: it is gofmt-clean,
// it builds against this checkout from a module outside the workspace, it
// prints what the README says it prints, and Example in the root package
// has the same statements, so go doc shows the same code.
func TestReadmeQuickStart(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	quick := section(t, string(readme), "## Quick start")
	code, rest := fenced(t, quick, "go")
	want, _ := fenced(t, rest, "text")

	if formatted, err := format.Source([]byte(code)); err != nil {
		t.Fatalf("the Quick start does not parse: %v", err)
	} else if !bytes.Equal(formatted, []byte(code)) {
		t.Errorf("the Quick start is not gofmt-clean; gofmt gives:\n%s", formatted)
	}

	dir := t.TempDir()
	rootMod, err := readModFile(root, ".")
	if err != nil {
		t.Fatal(err)
	}
	gomod := "module quickstart\n\ngo " + rootMod.Go.Version + "\n\n" +
		"require " + rootPath + " v0.0.0\n\n" +
		"replace " + rootPath + " => " + root + "\n"
	// The root's go.sum vouches for the root's dependencies.
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"go.mod": gomod, "go.sum": string(gosum), "main.go": code} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The root's own dependencies come from the module cache, which the
	// workspace has filled: no network, and no version of ours is fetched.
	cmd := exec.Command("go", "run", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOTOOLCHAIN=local")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run of the Quick start: %v\n%s", err, stderr.String())
	}
	if got := stdout.String(); got != want {
		t.Errorf("the Quick start prints\n%s\nthe README shows\n%s", got, want)
	}

	example, err := os.ReadFile(filepath.Join(root, "example_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	mainLines := funcBody(t, "main", []byte(code))
	exampleLines := funcBody(t, "Example", example)
	if strings.Join(mainLines, "\n") != strings.Join(exampleLines, "\n") {
		t.Errorf("Example in example_test.go and main in the README's Quick start differ:\nExample:\n%s\n\nREADME:\n%s",
			strings.Join(exampleLines, "\n"), strings.Join(mainLines, "\n"))
	}
}
