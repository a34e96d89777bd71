package main

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// rootPath is the module path of the repository's root module. Every other
// module's path is rootPath followed by its directory, which is what lets
// the go command find it under a tag named after that directory.
const rootPath = "github.com/exactlyonce/idempotency"

// A goModule is one module of the workspace, as its go.mod says now.
type goModule struct {
	Dir       string // slash-separated, relative to the repository root; "." for the root
	Path      string // module path
	Published bool   // tagged and meant to be required by users
	File      *modfile.File
}

// unpublishedRE matches the comment line by which a go.mod says that its
// module is never released.
var unpublishedRE = regexp.MustCompile(`(?m)^//\s*This module is (never tagged or published|not published)\b`)

// unpublishedMarker is how a go.mod says that its module is never
// released (examples, benchmarks, test helpers, tools): a comment line
// that begins with it (or with "This module is not published", for a
// module not published yet).
const unpublishedMarker = "// This module is never tagged or published"

// isPublished says whether the module in dir, whose go.mod is gomod, is
// released. Every module of go.work is, but those under internal/ (which
// only this repository may import) and those whose go.mod says otherwise
// in a comment line (see [unpublishedMarker]). So a new module is released
// with the others, and listed in the documents that list them, without an
// edit of this tool; a module that is not published must say so where it
// is defined, and may then keep replace directives to the checkout.
func isPublished(dir string, gomod []byte) bool {
	internal := dir == "internal" || strings.HasPrefix(dir, "internal/")
	return !internal && !unpublishedRE.Match(gomod)
}

// tagName is the tag the go command looks for when it resolves the module
// in dir at version: the version itself for the root, "dir/version" for a
// module in a subdirectory.
func tagName(dir, version string) string {
	if dir == "." {
		return version
	}
	return dir + "/" + version
}

// ours reports whether a module path belongs to this repository.
func ours(p string) bool {
	return p == rootPath || strings.HasPrefix(p, rootPath+"/")
}

// checkVersion accepts the versions a release may have: canonical semantic
// versions, not pseudo-versions, and major version 0 or 1 because the
// module paths carry no /vN suffix.
func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v {
		return fmt.Errorf("version %q is not a canonical semantic version like v1.2.3", v)
	}
	if module.IsPseudoVersion(v) {
		return fmt.Errorf("version %q is a pseudo-version", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("version %q: major %s would need a /%s suffix on every module path", v, m, m)
	}
	return nil
}

// loadModules reads go.work and the go.mod of every module it uses.
func loadModules(root string) ([]*goModule, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []*goModule
	for _, u := range work.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		f, data, err := readModData(root, dir)
		if err != nil {
			return nil, err
		}
		want := rootPath
		if dir != "." {
			want += "/" + dir
		}
		if f.Module == nil || f.Module.Mod.Path != want {
			return nil, fmt.Errorf("%s/go.mod: module path must be %s, so that the tag %s resolves to it", dir, want, tagName(dir, "vX.Y.Z"))
		}
		mods = append(mods, &goModule{Dir: dir, Path: want, Published: isPublished(dir, data), File: f})
	}
	slices.SortFunc(mods, func(a, b *goModule) int { return strings.Compare(a.Dir, b.Dir) })
	return mods, nil
}

func readModFile(root, dir string) (*modfile.File, error) {
	f, _, err := readModData(root, dir)
	return f, err
}

// readModData reads and parses dir/go.mod, and returns its text too.
func readModData(root, dir string) (*modfile.File, []byte, error) {
	name := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, nil, err
	}
	f, err := modfile.Parse(name, data, nil)
	return f, data, err
}

// replaced reports whether m's go.mod replaces the module path p.
func replaced(m *goModule, p string) bool {
	return slices.ContainsFunc(m.File.Replace, func(r *modfile.Replace) bool { return r.Old.Path == p })
}

// writeModFile formats f and writes it back to dir/go.mod.
func writeModFile(root, dir string, f *modfile.File) error {
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, filepath.FromSlash(dir), "go.mod"), data, 0o644)
}

// check reports every way in which the workspace could not be released,
// and the one version at which its modules require each other (empty if
// none does). Published modules are what users' go commands will read:
// they must not rely on replace (ignored in dependencies) or on a version
// that no tag can provide.
func check(root string, mods []*goModule) (version string, problems []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	byPath := map[string]*goModule{}
	for _, m := range mods {
		byPath[m.Path] = m
	}
	versions := map[string][]string{} // version → "dir requires path"
	for _, m := range mods {
		if m.Published {
			for _, r := range m.File.Replace {
				bad("%s/go.mod: replace %s: published modules must not use replace (users' go commands ignore it); if %s is not meant to be published, say so in its go.mod with a comment line %q", m.Dir, r.Old.Path, m.Dir, unpublishedMarker+" ...")
			}
		}
		for _, r := range m.File.Require {
			if !ours(r.Mod.Path) {
				continue
			}
			dep, ok := byPath[r.Mod.Path]
			switch {
			case !ok:
				bad("%s/go.mod: requires %s, which is not a module of go.work", m.Dir, r.Mod.Path)
				continue
			case !dep.Published && (m.Published || !replaced(m, r.Mod.Path)):
				// An unpublished module (lincheck) may use another
				// (internal/etcdtest's embedded servers) through a
				// replace to the checkout; nothing else can resolve it.
				bad("%s/go.mod: requires %s, which is never published", m.Dir, r.Mod.Path)
				continue
			case m.Published && dep.Dir != ".":
				// Lockstep go.sum lines are computed from the commit
				// being released; only the root's content is fixed
				// before the adapters' go.mod files are rewritten.
				bad("%s/go.mod: requires %s; a published module may require only the root", m.Dir, r.Mod.Path)
			}
			if err := checkVersion(r.Mod.Version); err != nil {
				bad("%s/go.mod: requires %s: %v", m.Dir, r.Mod.Path, err)
				continue
			}
			versions[r.Mod.Version] = append(versions[r.Mod.Version], m.Dir+" requires "+r.Mod.Path)
		}
	}
	switch len(versions) {
	case 0:
	case 1:
		for v := range versions {
			version = v
		}
	default:
		var vs []string
		for v, who := range versions {
			vs = append(vs, fmt.Sprintf("%s (%s)", v, strings.Join(who, ", ")))
		}
		slices.Sort(vs)
		bad("modules of this repository are released together, at one version; go.mod files require several: %s", strings.Join(vs, "; "))
	}

	listed := map[string]bool{}
	for _, m := range mods {
		listed[m.Dir] = true
	}
	files, err := git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "go.mod", "*/go.mod")
	if err != nil {
		bad("listing go.mod files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(files, "\x00"), "\x00") {
		if f == "" || strings.Contains(f, "/testdata/") {
			continue
		}
		if dir := path.Dir(f); !listed[dir] {
			bad("%s: module not listed in go.work", f)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "LICENSE")); err != nil {
		bad("LICENSE: %v (the go command copies it into every module zip; pkg.go.dev shows no docs without it)", err)
	}
	return version, problems
}

// bumpRequirements sets every requirement on this repository's modules, in
// every module, to version. It reports the modules it changed.
func bumpRequirements(root string, mods []*goModule, version string) (changed []string, err error) {
	for _, m := range mods {
		before, err := m.File.Format()
		if err != nil {
			return nil, err
		}
		for _, r := range m.File.Require {
			if ours(r.Mod.Path) {
				if err := m.File.AddRequire(r.Mod.Path, version); err != nil {
					return nil, err
				}
			}
		}
		after, err := m.File.Format()
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(before, after) {
			if err := writeModFile(root, m.Dir, m.File); err != nil {
				return nil, err
			}
			changed = append(changed, m.Dir+"/go.mod")
		}
	}
	return changed, nil
}
