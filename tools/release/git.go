package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// requireClean refuses a working tree with changes: what is released must
// be exactly a commit. advice says what to do instead.
func requireClean(root, advice string) error {
	out, err := git(root, "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return err
	}
	if out != "" {
		return fmt.Errorf("the working tree has changes; %s:\n%s", advice, out)
	}
	return nil
}

// isHead reports whether rev names the commit HEAD is at.
func isHead(root, rev string) (bool, error) {
	revs, err := git(root, "rev-parse", "HEAD^{commit}", rev+"^{commit}")
	if err != nil {
		return false, fmt.Errorf("revision %q: %w", rev, err)
	}
	f := strings.Fields(revs)
	return len(f) == 2 && f[0] == f[1], nil
}

// tagExists reports whether the repository has the tag.
func tagExists(root, tag string) bool {
	_, err := git(root, "rev-parse", "--verify", "--quiet", "refs/tags/"+tag)
	return err == nil
}

// gitHas reports whether the repository has the object name (such as
// "HEAD:dir/go.sum").
func gitHas(root, name string) bool {
	_, err := git(root, "cat-file", "-e", name)
	return err == nil
}
