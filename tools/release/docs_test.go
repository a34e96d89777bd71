package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Every document that lists modules agrees with the tool, which reads
// them from go.work and the go.mod files: RELEASING.md's lists are what
// the docs command writes; README.md's Install section has a go get line
// for each published module and no other; every go get of ours in any
// document names a published module.
func TestDocsListModules(t *testing.T) {
	root := repoRoot(t)
	mods, err := loadModules(root)
	if err != nil {
		t.Fatal(err)
	}
	var published []string
	for _, m := range mods {
		if m.Published {
			published = append(published, m.Path)
		}
	}

	releasing, err := os.ReadFile(filepath.Join(root, releasingDoc))
	if err != nil {
		t.Fatal(err)
	}
	if want, err := rewriteRegions(string(releasing), moduleRegions(mods)); err != nil {
		t.Errorf("%s: %v", releasingDoc, err)
	} else if want != string(releasing) {
		t.Errorf("%s does not list the modules of go.work: run go run ./tools/release docs", releasingDoc)
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	install, _ := fenced(t, section(t, string(readme), "## Install"), "")
	got := goGets(install)
	slices.Sort(got)
	if want := slices.Sorted(slices.Values(published)); !slices.Equal(got, want) {
		t.Errorf("README.md, Install: go get lines for %v; want one for each published module: %v", got, want)
	}

	docs := mustGit(t, root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md")
	for _, name := range strings.Split(strings.TrimRight(docs, "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range goGets(string(data)) {
			if !slices.Contains(published, p) {
				t.Errorf("%s: go get %s, which is not a published module (published: %v)", name, p, published)
			}
		}
	}
}

// The regions of a document are rewritten in place, and a document that
// lacks one or has an unknown one is refused.
func TestRewriteRegions(t *testing.T) {
	regions := map[string]string{"a": "A\n", "b": "B1\nB2\n"}
	doc := "x\n<!-- modules: a -->\nold\n<!-- end modules -->\ny\n<!-- modules: b -->\n<!-- end modules -->\n"
	got, err := rewriteRegions(doc, regions)
	if want := "x\n<!-- modules: a -->\nA\n<!-- end modules -->\ny\n<!-- modules: b -->\nB1\nB2\n<!-- end modules -->\n"; err != nil || got != want {
		t.Fatalf("rewriteRegions = %q, %v; want %q", got, err, want)
	}
	if _, err := rewriteRegions("<!-- modules: a -->\n<!-- end modules -->\n", regions); err == nil || !strings.Contains(err.Error(), `no region ["b"]`) {
		t.Errorf("a missing region: %v", err)
	}
	if _, err := rewriteRegions(doc+"<!-- modules: c -->\n<!-- end modules -->\n", regions); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Errorf("an unknown region: %v", err)
	}
}

func TestGoGets(t *testing.T) {
	doc := "go get " + rootPath + "   # root\n" +
		"GOWORK=off go get \\\n    " + rootPath + "@v1.0.0 \\\n    " + rootPath + "/store/x@v1.0.0\n" +
		"go get example.com/other\n"
	want := []string{rootPath, rootPath, rootPath + "/store/x"}
	if got := goGets(doc); !slices.Equal(got, want) {
		t.Errorf("goGets = %q, want %q", got, want)
	}
}
