package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
)

// tidy runs go mod tidy in a module as if it had replace directives to this
// checkout for the modules of ours that it requires, and writes back the
// result without them. A published module requires the root at a tagged
// version and has no replace, so a plain go mod tidy (or go get) in it
// fetches that version from the module proxy: before it is tagged that
// fails, and after, it tidies against the release instead of the code
// next to it. Requirements on our modules and their go.sum lines are kept.
func tidy(root string, mods []*goModule, dir string) error {
	var m *goModule
	for _, c := range mods {
		if c.Dir == dir {
			m = c
		}
	}
	if m == nil {
		return fmt.Errorf("%s is not a module of go.work", dir)
	}
	if !m.Published {
		return fmt.Errorf("%s has its own replace directives: run go mod tidy in it", dir)
	}
	modDir := filepath.Join(root, filepath.FromSlash(dir))
	tmp, err := os.MkdirTemp("", "release-tidy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// The same file with our modules replaced by their directories.
	f, err := readModFile(root, dir)
	if err != nil {
		return err
	}
	added := map[string]bool{}
	for _, o := range mods {
		if o.Published && o.Dir != dir {
			if err := f.AddReplace(o.Path, "", filepath.Join(root, filepath.FromSlash(o.Dir)), ""); err != nil {
				return err
			}
			added[o.Path] = true
		}
	}
	data, err := f.Format()
	if err != nil {
		return err
	}
	tmpMod := filepath.Join(tmp, "go.mod")
	if err := os.WriteFile(tmpMod, data, 0o644); err != nil {
		return err
	}
	sums, err := os.ReadFile(filepath.Join(modDir, "go.sum"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "go.sum"), sums, 0o644); err != nil {
		return err
	}

	args := []string{"mod", "tidy", "-modfile=" + tmpMod}
	cmd := exec.Command("go", args...)
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: go %s: %w", dir, strings.Join(args, " "), err)
	}

	data, err = os.ReadFile(tmpMod)
	if err != nil {
		return err
	}
	f, err = modfile.Parse(tmpMod, data, nil)
	if err != nil {
		return err
	}
	for p := range added {
		if err := f.DropReplace(p, ""); err != nil {
			return err
		}
	}
	if err := writeModFile(root, dir, f); err != nil {
		return err
	}

	// Tidy wrote no go.sum lines for the replaced modules; keep ours.
	tidied, err := os.ReadFile(filepath.Join(tmp, "go.sum"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var lines []string
	for _, l := range strings.Split(string(tidied), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	for _, l := range strings.Split(string(sums), "\n") {
		if fs := strings.Fields(l); len(fs) == 3 && added[fs[0]] && strings.TrimSuffix(fs[1], "/go.mod") == required(f, fs[0]) {
			lines = append(lines, l)
		}
	}
	lines = sortSums(lines)
	out := ""
	if len(lines) > 0 {
		out = strings.Join(lines, "\n") + "\n"
	}
	return os.WriteFile(filepath.Join(modDir, "go.sum"), []byte(out), 0o644)
}

// required returns the version at which f requires the module path, or "".
func required(f *modfile.File, path string) string {
	for _, r := range f.Require {
		if r.Mod.Path == path {
			return r.Mod.Version
		}
	}
	return ""
}
