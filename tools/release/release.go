package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// loadChecked loads the workspace and fails on any problem check finds.
func loadChecked(root string) ([]*goModule, string, error) {
	mods, err := loadModules(root)
	if err != nil {
		return nil, "", err
	}
	version, problems := check(root, mods)
	if len(problems) > 0 {
		return nil, "", errors.New(strings.Join(problems, "\n"))
	}
	return mods, version, nil
}

// rootModule returns the root module of mods.
func rootModule(mods []*goModule) *goModule {
	for _, m := range mods {
		if m.Dir == "." {
			return m
		}
	}
	panic("go.work does not use the root module")
}

// requiresRoot reports whether m requires the root module.
func requiresRoot(m *goModule) bool {
	return required(m.File, rootPath) != ""
}

// prepare makes a clean checkout ready to be tagged version: every
// requirement on our modules names version, and every published module
// that requires the root gets the root's go.sum lines, computed from HEAD
// (prepare changes no file of the root module, so HEAD's root is what the
// release commit will hold). It returns the files it changed.
func prepare(root, version string) ([]string, error) {
	if err := checkVersion(version); err != nil {
		return nil, err
	}
	if err := requireClean(root, "prepare from a clean checkout"); err != nil {
		return nil, err
	}
	mods, _, err := loadChecked(root)
	if err != nil {
		return nil, err
	}
	changed, err := bumpRequirements(root, mods, version)
	if err != nil {
		return nil, err
	}
	lines, err := sumLines(root, rootModule(mods), version, "HEAD")
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		if m.Published && requiresRoot(m) {
			did, err := setSums(filepath.Join(root, filepath.FromSlash(m.Dir), "go.sum"), rootPath, lines)
			if err != nil {
				return nil, err
			}
			if did {
				changed = append(changed, m.Dir+"/go.sum")
			}
		}
	}
	slices.Sort(changed)
	return slices.Compact(changed), nil
}

// setSums replaces the lines of module modPath in a go.sum file with lines.
// It reports whether the file changed.
func setSums(name, modPath string, lines []string) (bool, error) {
	data, err := os.ReadFile(name)
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	var keep []string
	for _, l := range strings.Split(string(data), "\n") {
		if l != "" && strings.Fields(l)[0] != modPath {
			keep = append(keep, l)
		}
	}
	keep = sortSums(append(keep, lines...))
	out := strings.Join(keep, "\n") + "\n"
	if out == string(data) {
		return false, nil
	}
	return true, os.WriteFile(name, []byte(out), 0o644)
}

// sortSums sorts and de-duplicates go.sum lines in the go command's order:
// by module path, then by semantic version, each version's go.mod line
// after its zip line.
func sortSums(lines []string) []string {
	key := func(l string) (path, version, file string) {
		f := strings.Fields(l)
		if len(f) < 2 {
			return l, "", ""
		}
		version, file, _ = strings.Cut(f[1], "/")
		return f[0], version, file
	}
	slices.SortFunc(lines, func(a, b string) int {
		pa, va, fa := key(a)
		pb, vb, fb := key(b)
		return cmp.Or(strings.Compare(pa, pb), semver.Compare(va, vb), strings.Compare(fa, fb), strings.Compare(a, b))
	})
	return slices.Compact(lines)
}

// preparedAt loads the workspace and checks, in seconds, that rev is
// prepared for version, as tag and verify need it: the go.mod files
// require version, and every published module that requires the root
// has, at rev, the go.sum lines of rev's root. (Without this check a
// consumer built from rev fails on the go.sum lines only after
// downloading and compiling every dependency.) Modules and requirements
// are read from the working tree, which the callers have checked is rev.
func preparedAt(root, version, rev string) ([]*goModule, error) {
	mods, required, err := loadChecked(root)
	if err != nil {
		return nil, err
	}
	if required != "" && required != version {
		return nil, fmt.Errorf("the go.mod files require %s, not %s: run prepare %s and commit first", required, version, version)
	}
	want, err := sumLines(root, rootModule(mods), version, rev)
	if err != nil {
		return nil, err
	}
	slices.Sort(want)
	for _, m := range mods {
		if !m.Published || !requiresRoot(m) {
			continue
		}
		sum := "" // none at rev: no lines
		if name := rev + ":" + path.Join(m.Dir, "go.sum"); gitHas(root, name) {
			if sum, err = git(root, "show", name); err != nil {
				return nil, err
			}
		}
		if have := sumsIn(sum, rootPath, version); !slices.Equal(have, want) {
			return nil, fmt.Errorf("%s/go.sum at %s has %q for the root at %s, but the root at %s gives %q: run prepare %s and commit first", m.Dir, rev, have, version, rev, want, version)
		}
	}
	return mods, nil
}

// sumsIn returns, sorted, the go.sum lines of module modPath at version
// in the text of a go.sum file.
func sumsIn(data, modPath, version string) []string {
	var lines []string
	for _, l := range strings.Split(data, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == modPath && strings.TrimSuffix(f[1], "/go.mod") == version {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines
}

// tag checks that HEAD of a clean checkout is prepared for version and
// creates an annotated tag for every published module. It returns the
// tags, which the caller pushes.
func tag(root, version string) ([]string, error) {
	if err := checkVersion(version); err != nil {
		return nil, err
	}
	if err := requireClean(root, "tag a commit: commit the changes (or stash them) first"); err != nil {
		return nil, err
	}
	mods, err := preparedAt(root, version, "HEAD")
	if err != nil {
		return nil, err
	}
	var tags, messages []string
	for _, m := range mods {
		if !m.Published {
			continue
		}
		t := tagName(m.Dir, version)
		if tagExists(root, t) {
			return nil, fmt.Errorf("tag %s exists already", t)
		}
		tags = append(tags, t)
		messages = append(messages, m.Path+" "+version)
	}
	for i, t := range tags {
		if _, err := git(root, "tag", "-a", t, "-m", messages[i]); err != nil {
			return nil, err
		}
	}
	return tags, nil
}
