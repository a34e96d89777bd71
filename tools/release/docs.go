package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// The documents that list modules take the lists from this tool, which
// reads them from go.work and the go.mod files (see isPublished): the
// docs command rewrites each region of RELEASING.md between a line
// "<!-- modules: NAME -->" and a line "<!-- end modules -->", and a test
// fails while a document disagrees with the tool.

// releasingDoc is the document whose module lists docs writes.
const releasingDoc = "RELEASING.md"

var regionRE = regexp.MustCompile(`(?s)<!-- modules: ([a-z-]+) -->\n(.*?)<!-- end modules -->\n`)

// moduleRegions returns the generated text of each region, by name: the
// published modules' table, the unpublished ones, the tags to push, and
// the go get of every published module.
func moduleRegions(mods []*goModule) map[string]string {
	var table, unpublished, tags, gets strings.Builder
	table.WriteString("| module | directory | tag |\n|---|---|---|\n")
	var un []string
	for _, m := range mods {
		if !m.Published {
			un = append(un, "`"+m.Dir+"`")
			continue
		}
		fmt.Fprintf(&table, "| `%s` | `%s` | `%s` |\n", m.Path, m.Dir, tagName(m.Dir, "vX.Y.Z"))
		fmt.Fprintf(&tags, " %s", tagName(m.Dir, "vX.Y.Z"))
		fmt.Fprintf(&gets, " \\\n    %s@vX.Y.Z", m.Path)
	}
	fmt.Fprintf(&unpublished, "Not published, never tagged: %s.\n", strings.Join(un, ", "))
	return map[string]string{
		"published":   table.String(),
		"unpublished": unpublished.String(),
		"push":        "```\ngit push origin main\ngit push origin" + tags.String() + "\n```\n",
		"get": "```\ncd \"$(mktemp -d)\" && go mod init example.com/check &&\n" +
			"  GOWORK=off go get" + gets.String() + "\n```\n",
	}
}

// rewriteRegions replaces the content of every region of doc with its text
// in regions. It fails on a region it has no text for, and when a region
// of regions is missing from doc.
func rewriteRegions(doc string, regions map[string]string) (string, error) {
	seen := map[string]bool{}
	var unknown []string
	out := regionRE.ReplaceAllStringFunc(doc, func(r string) string {
		name := regionRE.FindStringSubmatch(r)[1]
		text, ok := regions[name]
		if !ok {
			unknown = append(unknown, name)
			return r
		}
		seen[name] = true
		return "<!-- modules: " + name + " -->\n" + text + "<!-- end modules -->\n"
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown module regions %q", unknown)
	}
	var missing []string
	for name := range regions {
		if !seen[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return "", fmt.Errorf("no region %q (a line \"<!-- modules: NAME -->\", the text, a line \"<!-- end modules -->\")", missing)
	}
	return out, nil
}

// writeDocs rewrites the module lists of RELEASING.md. It reports whether
// the file changed.
func writeDocs(root string) (bool, error) {
	mods, err := loadModules(root)
	if err != nil {
		return false, err
	}
	name := filepath.Join(root, releasingDoc)
	data, err := os.ReadFile(name)
	if err != nil {
		return false, err
	}
	out, err := rewriteRegions(string(data), moduleRegions(mods))
	if err != nil {
		return false, fmt.Errorf("%s: %w", releasingDoc, err)
	}
	if out == string(data) {
		return false, nil
	}
	return true, os.WriteFile(name, []byte(out), 0o644)
}

var goGetRE = regexp.MustCompile(`\bgo get((?:\s+(?:\\\n)?\s*` + regexp.QuoteMeta(rootPath) + `\S*)+)`)

// goGets returns the module paths of this repository that the go get
// commands in a document name (without their @version), in order.
func goGets(doc string) []string {
	var paths []string
	for _, m := range goGetRE.FindAllStringSubmatch(doc, -1) {
		for _, f := range strings.Fields(strings.ReplaceAll(m[1], "\\\n", " ")) {
			p, _, _ := strings.Cut(f, "@")
			paths = append(paths, p)
		}
	}
	return paths
}
