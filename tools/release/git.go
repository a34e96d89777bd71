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
// be exactly a commit.
func requireClean(root string) error {
	out, err := git(root, "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return err
	}
	if out != "" {
		return fmt.Errorf("the working tree has changes; release from a clean checkout:\n%s", out)
	}
	return nil
}

// tagExists reports whether the repository has the tag.
func tagExists(root, tag string) bool {
	_, err := git(root, "rev-parse", "--verify", "--quiet", "refs/tags/"+tag)
	return err == nil
}
