package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// revFor is the revision a module's content is taken from: rev if given,
// else the module's own tag for version, as the go command would use.
func revFor(m *goModule, version, rev string) string {
	if rev != "" {
		return rev
	}
	return tagName(m.Dir, version)
}

// moduleZip returns the zip of module m at rev as the go command makes it
// when it fetches a tag from the repository: git archive, without nested
// modules, with the root LICENSE copied into modules that lack one.
func moduleZip(root string, m *goModule, version, rev string) ([]byte, error) {
	subdir := m.Dir
	if subdir == "." {
		subdir = ""
	}
	var buf bytes.Buffer
	err := modzip.CreateFromVCS(&buf, module.Version{Path: m.Path, Version: version}, root, rev, subdir)
	return buf.Bytes(), err
}

// moduleGoMod returns the go.mod of module m at rev.
func moduleGoMod(root string, m *goModule, rev string) ([]byte, error) {
	out, err := git(root, "show", rev+":"+path.Join(m.Dir, "go.mod"))
	return []byte(out), err
}

// sumLines returns the go.sum lines of module m at version, with its
// content taken from rev: the lines a user's go command writes after
// downloading that version, and checks against the checksum database.
func sumLines(root string, m *goModule, version, rev string) ([]string, error) {
	zip, err := moduleZip(root, m, version, rev)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "release-*.zip")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(zip)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	zipHash, err := dirhash.HashZip(f.Name(), dirhash.Hash1)
	if err != nil {
		return nil, err
	}
	gomod, err := moduleGoMod(root, m, rev)
	if err != nil {
		return nil, err
	}
	modHash, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return nil, err
	}
	return []string{
		fmt.Sprintf("%s %s %s", m.Path, version, zipHash),
		fmt.Sprintf("%s %s/go.mod %s", m.Path, version, modHash),
	}, nil
}

// buildProxy writes a module proxy in the GOPROXY file layout to out,
// serving every published module at version, each taken from rev (or, if
// rev is empty, from its own tag). Point GOPROXY at "file://" + out.
func buildProxy(root string, mods []*goModule, version, rev, out string) error {
	if rev == "" {
		var missing []string
		for _, m := range mods {
			if t := tagName(m.Dir, version); m.Published && !tagExists(root, t) {
				missing = append(missing, t)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no tag %s (not tagged yet?): pass -rev HEAD (or another revision) to serve the modules from a commit instead of their tags", strings.Join(missing, ", "))
		}
	}
	for _, m := range mods {
		if !m.Published {
			continue
		}
		r := revFor(m, version, rev)
		zip, err := moduleZip(root, m, version, r)
		if err != nil {
			return fmt.Errorf("%s: %w", m.Path, err)
		}
		gomod, err := moduleGoMod(root, m, r)
		if err != nil {
			return err
		}
		when, err := git(root, "show", "-s", "--format=%cI", r+"^{commit}")
		if err != nil {
			return err
		}
		info, err := json.Marshal(struct{ Version, Time string }{version, strings.TrimSpace(when)})
		if err != nil {
			return err
		}
		escPath, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		escVersion, err := module.EscapeVersion(version)
		if err != nil {
			return err
		}
		dir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		files := map[string][]byte{
			escVersion + ".zip":  zip,
			escVersion + ".mod":  gomod,
			escVersion + ".info": info,
			"list":               []byte(version + "\n"),
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// rehearsalEnv is the environment in which a go command outside the
// repository takes our modules at a version that is not public yet from
// the file proxy in dir, and every other module from goproxy (the user's
// GOPROXY): the file proxy first (the go command goes on to the next
// proxy when a module is not found in one), and no checksum database for
// our modules, which has never seen the version (it answers "not found",
// which the go command takes as an error). The other modules are still
// checked against it.
func rehearsalEnv(dir, goproxy string) []string {
	proxies := fileURL(dir)
	if goproxy != "" && goproxy != "off" {
		proxies += "," + goproxy
	}
	return []string{"GOPROXY=" + proxies, "GONOSUMDB=" + rootPath}
}
