package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// testVersion is the version the release rehearsal tags in a throw-away
// copy of the repository. No real release will use it, and it only ever
// reaches a temporary module cache.
const testVersion = "v0.99.0-releasetest"

// repoRoot is the repository this test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("not the repository root: %v", err)
	}
	return root
}

// isolateGit keeps the user's git configuration (signing, hooks, identity)
// out of the git commands that the test and the code under test run.
func isolateGit(t *testing.T) {
	t.Setenv("GIT_CONFIG_GLOBAL", os.DevNull)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	for _, who := range []string{"AUTHOR", "COMMITTER"} {
		t.Setenv("GIT_"+who+"_NAME", "release test")
		t.Setenv("GIT_"+who+"_EMAIL", "release-test@example.com")
	}
}

// newRepo makes a git repository in dir holding files and commits them.
func newRepo(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	commitAll(t, dir, "snapshot")
}

func commitAll(t *testing.T, dir, msg string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		mustGit(t, dir, "init", "--quiet")
	}
	mustGit(t, dir, "add", "--all")
	mustGit(t, dir, "commit", "--quiet", "--allow-empty", "-m", msg)
}

func mustGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := git(dir, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// copyWorkingTree copies the files git would commit from the repository
// (tracked ones as they are now, and untracked ones it does not ignore)
// into dst, so that the rehearsal releases exactly what a commit would.
func copyWorkingTree(t *testing.T, root, dst string) {
	t.Helper()
	list := mustGit(t, root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	for _, name := range strings.Split(strings.TrimRight(list, "\x00"), "\x00") {
		src := filepath.Join(root, filepath.FromSlash(name))
		info, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		to := filepath.Join(dst, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyFile(src, to, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// The go.mod files as committed are releasable: no replace in a published
// module, one version of the root required everywhere, every module in
// go.work, a LICENSE.
func TestRepositoryIsReleasable(t *testing.T) {
	root := repoRoot(t)
	mods, err := loadModules(root)
	if err != nil {
		t.Fatal(err)
	}
	version, problems := check(root, mods)
	for _, p := range problems {
		t.Error(p)
	}
	if version == "" {
		t.Error("no module requires the root at a version")
	}
	var published []string
	for _, m := range mods {
		if m.Published {
			published = append(published, m.Dir)
		}
	}
	for _, want := range []string{".", "store/postgres", "store/redis"} {
		if !slices.Contains(published, want) {
			t.Errorf("%s is not published; published: %v", want, published)
		}
	}
}

// The rehearsal: release a copy of the working tree at testVersion with
// the documented commands (prepare, commit, tag), serve the tags from a
// file-based module proxy, and have a module outside the repository, with
// no workspace, go-get the root and every adapter from it alone and build
// and run a program that uses them.
func TestReleaseThroughFileProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a consumer of every module; about 10 s")
	}
	isolateGit(t)
	start := time.Now()
	root := repoRoot(t)
	tmp := t.TempDir()
	repo := filepath.Join(tmp, "repo")
	copyWorkingTree(t, root, repo)
	commitAll(t, repo, "snapshot of the working tree")

	changed, err := prepare(repo, testVersion)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	for _, want := range []string{"store/postgres/go.mod", "store/postgres/go.sum", "store/redis/go.mod", "store/redis/go.sum"} {
		if !slices.Contains(changed, want) {
			t.Errorf("prepare changed %v, not %s", changed, want)
		}
	}
	if _, err := tag(repo, testVersion); err == nil {
		t.Fatal("tag accepted a working tree with uncommitted changes")
	}
	if err := verify(repo, testVersion, "HEAD"); err == nil || !strings.Contains(err.Error(), "the working tree has changes") {
		t.Fatalf("verify before the commit of prepare: %v; want it to refuse the changes at once", err)
	}
	commitAll(t, repo, "release "+testVersion)

	tags, err := tag(repo, testVersion)
	if err != nil {
		t.Fatalf("tag: %v", err)
	}
	for _, want := range []string{testVersion, "store/postgres/" + testVersion, "store/redis/" + testVersion} {
		if !slices.Contains(tags, want) {
			t.Errorf("tags %v lack %s", tags, want)
		}
	}
	if _, err := tag(repo, testVersion); err == nil {
		t.Error("tag accepted a version that is tagged already")
	}
	t.Logf("prepared and tagged %v (%.1fs)", tags, time.Since(start).Seconds())

	mods, err := loadModules(repo)
	if err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(tmp, "proxy")
	if err := buildProxy(repo, mods, testVersion, "", proxy); err != nil {
		t.Fatal(err)
	}
	c := &consumer{
		Dir:      filepath.Join(tmp, "consumer"),
		Proxy:    proxy,
		ModCache: filepath.Join(tmp, "modcache"),
		Logf:     t.Logf,
	}
	if err := c.check(mods, testVersion, rootModule(mods).File.Go.Version); err != nil {
		t.Fatal(err)
	}
	t.Logf("release rehearsal took %.1fs", time.Since(start).Seconds())
}

func TestCheckVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"v0.1.0":                             true,
		"v1.2.3":                             true,
		"v1.0.0-rc.1":                        true,
		testVersion:                          true,
		"v2.0.0":                             false, // the paths have no /v2
		"v1.2":                               false, // not canonical
		"1.2.3":                              false,
		"v0.0.0-20260101000000-abcdefabcdef": false, // pseudo-version
	} {
		if err := checkVersion(v); (err == nil) != ok {
			t.Errorf("checkVersion(%q) = %v, want ok=%v", v, err, ok)
		}
	}
}

func TestTagName(t *testing.T) {
	if got := tagName(".", "v1.2.3"); got != "v1.2.3" {
		t.Errorf("root: %s", got)
	}
	if got := tagName("store/postgres", "v1.2.3"); got != "store/postgres/v1.2.3" {
		t.Errorf("adapter: %s", got)
	}
}

// check must find each way a repository could publish go.mod files that
// users cannot resolve.
func TestCheckFindsProblems(t *testing.T) {
	isolateGit(t)
	good := tinyRepo()
	cases := []struct {
		name    string
		edit    map[string]string // files replaced or, if "", removed
		problem string            // "" for none
	}{
		{"good", nil, ""},
		{"replace in an adapter", map[string]string{
			"store/kv/go.mod": good["store/kv/go.mod"] + "\nreplace " + rootPath + " => ../..\n",
		}, "must not use replace"},
		{"a module with a replace that does not say it is unpublished", map[string]string{
			"examples/go.mod": strings.Replace(good["examples/go.mod"], unpublishedMarker, "// Examples.", 1),
		}, "examples/go.mod: replace " + rootPath + ": published modules must not use replace (users' go commands ignore it); if examples is not meant to be published, say so in its go.mod with a comment line \"" + unpublishedMarker},
		{"zero pseudo-version", map[string]string{
			"store/kv/go.mod": strings.Replace(good["store/kv/go.mod"], "v0.3.0", "v0.0.0-00010101000000-000000000000", 1),
		}, "pseudo-version"},
		{"two versions", map[string]string{
			"store/kv/go.mod": strings.Replace(good["store/kv/go.mod"], "v0.3.0", "v0.2.0", 1),
		}, "at one version"},
		{"requires an unpublished module", map[string]string{
			"store/kv/go.mod": good["store/kv/go.mod"] + "require " + rootPath + "/examples v0.3.0\n",
		}, "never published"},
		{"an unpublished module requires another without a replace", map[string]string{
			"go.work":                strings.Replace(good["go.work"], "./examples\n", "./examples\n\t./internal/kvtest\n", 1),
			"internal/kvtest/go.mod": "module " + rootPath + "/internal/kvtest\n\ngo 1.26.0\n",
			"examples/go.mod":        good["examples/go.mod"] + "require " + rootPath + "/internal/kvtest v0.3.0\n",
		}, "never published"},
		{"an unpublished module requires another through a replace", map[string]string{
			"go.work":                strings.Replace(good["go.work"], "./examples\n", "./examples\n\t./internal/kvtest\n", 1),
			"internal/kvtest/go.mod": "module " + rootPath + "/internal/kvtest\n\ngo 1.26.0\n",
			"examples/go.mod": good["examples/go.mod"] + "require " + rootPath + "/internal/kvtest v0.3.0\n" +
				"replace " + rootPath + "/internal/kvtest => ../internal/kvtest\n",
		}, ""},
		{"module missing from go.work", map[string]string{
			"store/other/go.mod": "module " + rootPath + "/store/other\n\ngo 1.26.0\n",
		}, "not listed in go.work"},
		{"wrong module path", map[string]string{
			"store/kv/go.mod": "module example.com/kv\n\ngo 1.26.0\n",
		}, "module path must be"},
		{"no license", map[string]string{"LICENSE": ""}, "LICENSE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{}
			for k, v := range good {
				files[k] = v
			}
			for k, v := range tc.edit {
				if v == "" {
					delete(files, k)
				} else {
					files[k] = v
				}
			}
			dir := t.TempDir()
			newRepo(t, dir, files)
			mods, err := loadModules(dir)
			var problems []string
			if err != nil {
				problems = []string{err.Error()}
			} else {
				_, problems = check(dir, mods)
			}
			all := strings.Join(problems, "\n")
			switch {
			case tc.problem == "" && all != "":
				t.Errorf("problems in a good repository:\n%s", all)
			case tc.problem != "" && !strings.Contains(all, tc.problem):
				t.Errorf("problems %q do not mention %q", all, tc.problem)
			}
		})
	}
}

// tinyRepo is a small releasable repository: the root, an adapter that
// requires it and examples that say they are not published.
func tinyRepo() map[string]string {
	return map[string]string{
		"LICENSE": "MIT\n",
		"go.work": "go 1.26.0\n\nuse (\n\t.\n\t./store/kv\n\t./examples\n)\n",
		"go.mod":  "module " + rootPath + "\n\ngo 1.26.0\n",
		"root.go": "package idempotency\n\nconst X = 1\n",
		"store/kv/go.mod": "module " + rootPath + "/store/kv\n\ngo 1.26.0\n\n" +
			"require " + rootPath + " v0.3.0\n",
		"store/kv/kv.go": "package kv\n\nimport \"" + rootPath + "\"\n\nvar Y = idempotency.X\n",
		"examples/go.mod": "module " + rootPath + "/examples\n\ngo 1.26.0\n\n" +
			"require (\n\t" + rootPath + " v0.3.0\n\t" + rootPath + "/store/kv v0.3.0\n)\n\n" +
			unpublishedMarker + ".\nreplace " + rootPath + " => ../\n",
	}
}

// Which modules are published comes from go.work and the go.mod files: a
// new module is, with no edit of the tool; one under internal/ is not;
// one whose go.mod says so in a comment line is not.
func TestPublishedFromGoMod(t *testing.T) {
	for _, c := range []struct {
		dir, gomod string
		want       bool
	}{
		{".", "module " + rootPath + "\n", true},
		{"mcpidem", "module " + rootPath + "/mcpidem\n\ngo 1.26.0\n", true},
		{"queue", "module " + rootPath + "/queue\n// A client queue.\n", true},
		{"internal/kvtest", "module " + rootPath + "/internal/kvtest\n", false},
		{"examples", "module " + rootPath + "/examples\n\n" + unpublishedMarker + ". The replaces...\nreplace x => ../\n", false},
		{"cmd/tool", "module " + rootPath + "/cmd/tool\n\n// This module is not published yet: build it from a checkout.\n", false},
		{"tools/x", "module " + rootPath + "/tools/x\n\n//This module is never tagged or published\n", false},
		// The marker starts a comment line; mentioning it is not saying it.
		{"otel", "module " + rootPath + "/otel\n\n// Unlike examples, where \"This module is never tagged or published\"...\n", true},
	} {
		if got := isPublished(c.dir, []byte(c.gomod)); got != c.want {
			t.Errorf("isPublished(%q, %q) = %v, want %v", c.dir, c.gomod, got, c.want)
		}
	}
}

// verify takes the modules from HEAD: before a commit (right after
// prepare) it refuses at once, saying that the tree has changes; on a HEAD
// whose go.sum lines do not match its root, it says to run prepare, before
// building anything. (It used to build a consumer for minutes and then
// fail on a go.sum line.)
func TestVerifyRefusesWhatItCannotVerify(t *testing.T) {
	isolateGit(t)
	dir := t.TempDir()
	newRepo(t, dir, tinyRepo())
	if _, err := prepare(dir, "v0.3.0"); err != nil {
		t.Fatal(err)
	}
	err := verify(dir, "v0.3.0", "HEAD")
	if err == nil || !strings.Contains(err.Error(), "the working tree has changes; verify builds the modules from HEAD, not from the working tree: commit") {
		t.Fatalf("verify before the commit of prepare: %v; want it to say the tree has changes", err)
	}
	commitAll(t, dir, "release v0.3.0")
	// The root changes after prepare: the adapter's go.sum lines are stale.
	if err := os.WriteFile(filepath.Join(dir, "root.go"), []byte("package idempotency\n\nconst X = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	commitAll(t, dir, "change the root")
	err = verify(dir, "v0.3.0", "HEAD")
	if err == nil || !strings.Contains(err.Error(), "store/kv/go.sum at HEAD has") || !strings.Contains(err.Error(), "run prepare v0.3.0 and commit first") {
		t.Fatalf("verify of a HEAD with stale go.sum lines: %v; want it to say so and to run prepare", err)
	}
	if err := verify(dir, "v0.3.0", "HEAD~1"); err == nil || !strings.Contains(err.Error(), "check out HEAD~1 first") {
		t.Fatalf("verify of another revision: %v; want it to ask for a checkout of it", err)
	}
}

// proxy serves the modules from their tags; before they exist it says to
// pass -rev HEAD (it used to fail with a git archive error), and with it
// serves the commit. It prints the environment of a rehearsal.
func TestProxyBeforeTagging(t *testing.T) {
	isolateGit(t)
	dir := t.TempDir()
	newRepo(t, dir, tinyRepo())
	mods, err := loadModules(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "proxy")
	err = buildProxy(dir, mods, "v0.3.0", "", out)
	if err == nil || !strings.Contains(err.Error(), "no tag v0.3.0, store/kv/v0.3.0 (not tagged yet?): pass -rev HEAD") {
		t.Fatalf("proxy before tagging: %v; want it to name the missing tags and suggest -rev HEAD", err)
	}
	if err := buildProxy(dir, mods, "v0.3.0", "HEAD", out); err != nil {
		t.Fatalf("proxy -rev HEAD: %v", err)
	}
	for _, f := range []string{"github.com/exactlyonce/idempotency/@v/v0.3.0.zip", "github.com/exactlyonce/idempotency/store/kv/@v/v0.3.0.mod"} {
		if _, err := os.Stat(filepath.Join(out, filepath.FromSlash(f))); err != nil {
			t.Errorf("the proxy lacks %s: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "github.com/exactlyonce/idempotency/examples")); !os.IsNotExist(err) {
		t.Errorf("the proxy serves the unpublished examples (%v)", err)
	}
	env := rehearsalEnv("/tmp/p", "https://proxy.golang.org,direct")
	if want := []string{"GOPROXY=file:///tmp/p,https://proxy.golang.org,direct", "GONOSUMDB=" + rootPath}; !slices.Equal(env, want) {
		t.Errorf("rehearsal environment %q, want %q", env, want)
	}
}

// tidy works in a published module before its root version is tagged, and
// leaves no replace behind, while a plain go mod tidy cannot resolve the
// root at all.
func TestTidyAgainstCheckout(t *testing.T) {
	isolateGit(t)
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "")
	dir := t.TempDir()
	kvMod := "module " + rootPath + "/store/kv\n\ngo 1.26.0\n\nrequire " + rootPath + " v0.3.0\n"
	kvSum := rootPath + " v0.3.0 h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n" +
		rootPath + " v0.3.0/go.mod h1:BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB=\n"
	newRepo(t, dir, map[string]string{
		"LICENSE":         "MIT\n",
		"go.work":         "go 1.26.0\n\nuse (\n\t.\n\t./store/kv\n)\n",
		"go.mod":          "module " + rootPath + "\n\ngo 1.26.0\n",
		"root.go":         "package idempotency\n\nconst X = 1\n",
		"store/kv/go.mod": kvMod,
		"store/kv/go.sum": kvSum,
		"store/kv/kv.go":  "package kv\n\nimport \"" + rootPath + "\"\n\nvar Y = idempotency.X\n",
	})
	plain := exec.Command("go", "mod", "tidy")
	plain.Dir = filepath.Join(dir, "store", "kv")
	plain.Env = append(os.Environ(), "GOWORK=off")
	if out, err := plain.CombinedOutput(); err == nil {
		t.Fatalf("plain go mod tidy resolved an untagged root:\n%s", out)
	}
	mods, err := loadModules(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := tidy(dir, mods, "store/kv"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"store/kv/go.mod": kvMod, "store/kv/go.sum": kvSum} {
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s after tidy:\n%s\nwant:\n%s", name, got, want)
		}
	}
}
