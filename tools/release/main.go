// Command release checks, prepares, verifies and tags a release of this
// repository's published modules, all tagged together at one version. The
// modules are those of go.work; every one is published but those under
// internal/ and those whose go.mod says it is not, in a comment line
// "// This module is never tagged or published" (or "... is not
// published"), so a new module needs no edit here. RELEASING.md gives the
// procedure; run it from anywhere in the repository:
//
//	go run ./tools/release check [vX.Y.Z]
//	go run ./tools/release prepare vX.Y.Z
//	go run ./tools/release verify vX.Y.Z
//	go run ./tools/release tag vX.Y.Z
//	go run ./tools/release proxy -o DIR [-rev REV] vX.Y.Z
//	go run ./tools/release tidy [DIR...]
//	go run ./tools/release docs
//
// check lists the modules and reports what would stop a release: a
// replace directive or a missing requirement version in a published
// go.mod, modules that require each other at different versions, a go.mod
// missing from go.work, no LICENSE. prepare rewrites every requirement on
// our modules to vX.Y.Z and writes the root's go.sum lines into the
// adapters. verify, on a clean checkout whose HEAD is prepared (it says at
// once when not), serves the published modules at HEAD from a temporary
// file-based module proxy and, in a consumer module outside the
// repository, go-gets them all and builds and runs a program that uses
// them. tag creates the tags after the same checks. proxy only writes the
// proxy, from the tags (or -rev REV, before tagging), and prints the
// environment in which a go command uses it. tidy runs go mod tidy in
// published modules (all by default) against this checkout: a plain go mod
// tidy or go get there would fetch the required version of the root from
// the module proxy. docs rewrites the module lists of RELEASING.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const usage = `usage: go run ./tools/release COMMAND [ARGS]

  check [vX.Y.Z]                  report what would stop a release (at vX.Y.Z)
  prepare vX.Y.Z                  require vX.Y.Z everywhere; write the root's go.sum lines
  verify vX.Y.Z                   build a consumer from a temporary proxy of HEAD (committed, clean)
  tag vX.Y.Z                      check that HEAD is prepared; create the tags
  proxy -o DIR [-rev REV] vX.Y.Z  write a file-based module proxy of REV (the tags) to DIR
  tidy [DIR...]                   go mod tidy published modules (all) against this checkout
  docs                            rewrite the module lists of RELEASING.md from go.work
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("no command")
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	rev := fs.String("rev", "", "revision to take the modules from")
	out := fs.String("o", "", "directory to write the proxy to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := git(".", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	root = strings.TrimSpace(root)
	switch cmd {
	case "tidy":
		return tidyAll(root, fs.Args())
	case "docs":
		changed, err := writeDocs(root)
		if err != nil {
			return err
		}
		if changed {
			fmt.Printf("rewrote the module lists of %s\n", releasingDoc)
		} else {
			fmt.Printf("%s lists the modules already\n", releasingDoc)
		}
		return nil
	}
	version := fs.Arg(0)
	if fs.NArg() > 1 || (version == "" && cmd != "check") {
		fs.Usage()
		return errors.New("want one version argument")
	}
	if version != "" {
		if err := checkVersion(version); err != nil {
			return err
		}
	}
	switch cmd {
	case "check":
		mods, required, err := loadChecked(root)
		if err != nil {
			return err
		}
		if version != "" && required != "" && required != version {
			return fmt.Errorf("the go.mod files require %s, not %s", required, version)
		}
		for _, m := range mods {
			state := "unpublished"
			if m.Published {
				state = "published as " + tagName(m.Dir, "vX.Y.Z")
			}
			fmt.Printf("%-20s %s\n", m.Dir, state)
		}
		fmt.Printf("ok: modules require each other at %s\n", required)
	case "prepare":
		changed, err := prepare(root, version)
		if err != nil {
			return err
		}
		fmt.Printf("changed: %s\nnext: run the tests, commit, then: go run ./tools/release verify %s\n", strings.Join(changed, " "), version)
	case "verify":
		if *rev == "" {
			*rev = "HEAD"
		}
		return verify(root, version, *rev)
	case "tag":
		tags, err := tag(root, version)
		if err != nil {
			return err
		}
		fmt.Printf("tagged HEAD: %s\nnext: git push origin %s\n", strings.Join(tags, " "), strings.Join(tags, " "))
	case "proxy":
		if *out == "" {
			return errors.New("proxy needs -o DIR")
		}
		mods, _, err := loadChecked(root)
		if err != nil {
			return err
		}
		if err := buildProxy(root, mods, version, *rev, *out); err != nil {
			return err
		}
		abs, err := filepath.Abs(*out)
		if err != nil {
			return err
		}
		goproxy, err := exec.Command("go", "env", "GOPROXY").Output()
		if err != nil {
			return fmt.Errorf("go env GOPROXY: %v", err)
		}
		// The rehearsal's environment (see RELEASING.md), one variable a
		// line, to export.
		for _, v := range rehearsalEnv(abs, strings.TrimSpace(string(goproxy))) {
			fmt.Println(v)
		}
	default:
		fs.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
	return nil
}

// verify builds a consumer of version, taken from rev, in a temporary
// directory that it removes afterwards.
func verify(root, version, rev string) error {
	start := time.Now()
	// The modules come from rev, their list from the working tree: they
	// must be the same commit.
	head, err := isHead(root, rev)
	if err != nil {
		return err
	}
	if !head {
		return fmt.Errorf("verify takes the list of modules from the working tree: check out %s first", rev)
	}
	if err := requireClean(root, "verify builds the modules from "+rev+", not from the working tree: commit the changes (prepare's included) first"); err != nil {
		return err
	}
	mods, err := preparedAt(root, version, rev)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "release-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	proxy := filepath.Join(tmp, "proxy")
	if err := buildProxy(root, mods, version, rev, proxy); err != nil {
		return err
	}
	c := &consumer{
		Dir:      filepath.Join(tmp, "consumer"),
		Proxy:    proxy,
		ModCache: filepath.Join(tmp, "modcache"),
		Logf:     func(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) },
	}
	if err := c.check(mods, version, rootModule(mods).File.Go.Version); err != nil {
		return err
	}
	fmt.Printf("ok: a consumer built and ran %s of every published module from %s (%.1fs)\n", version, rev, time.Since(start).Seconds())
	return nil
}

// tidyAll tidies the published modules in dirs, or all of them.
func tidyAll(root string, dirs []string) error {
	mods, err := loadModules(root)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		for _, m := range mods {
			if m.Published {
				dirs = append(dirs, m.Dir)
			}
		}
	}
	for _, d := range dirs {
		d = filepath.ToSlash(filepath.Clean(d))
		fmt.Println("tidy", d)
		if err := tidy(root, mods, d); err != nil {
			return err
		}
	}
	return nil
}
