package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

// consumerProgram uses the root module and every published adapter, and
// imports the other published modules (grpcidem). The adapters are only
// compiled (their stores must satisfy the contract and
// offer New), so no server is needed; the memory store runs one call.
var consumerProgram = template.Must(template.New("main.go").Parse(`package main

import (
	"context"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
{{- range .}}
	{{if .Store}}{{.Name}}{{else}}_{{end}} "{{.Path}}"
{{- end}}
)

var (
{{- range .}}{{if .Store}}
	_ idempotency.Store = (*{{.Name}}.Store)(nil)
	_                   = {{.Name}}.New
{{- end}}{{end}}
)

func main() {
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	r, err := idempotency.New(store)
	if err != nil {
		panic(err)
	}
	req := idempotency.Request{Key: "release-check"}
	for range 2 {
		res, err := idempotency.Do(context.Background(), r, req, func(context.Context) (string, error) {
			return "fn ran", nil
		})
		fmt.Println(res.Value, res.Replayed, err)
	}
}
`))

// consumerOutput is what consumerProgram prints.
const consumerOutput = "fn ran false <nil>\nfn ran true <nil>\n"

// A consumer is a module outside the repository that depends on a release
// the way a user's module does: through a module proxy, with no go.work
// and no replace.
type consumer struct {
	Dir      string // the consumer module; created if missing
	Proxy    string // directory of the file proxy serving our modules
	ModCache string // a throw-away GOMODCACHE: test versions must not reach the user's
	Logf     func(format string, args ...any)
}

// env is the environment of every go command the consumer runs. Our
// modules can only come from c.Proxy; third-party modules come from the
// user's module download cache, or, if missing there, from the user's
// GOPROXY, into the throw-away cache either way.
func (c *consumer) env() ([]string, error) {
	out, err := exec.Command("go", "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		return nil, fmt.Errorf("go env: unexpected output %q", out)
	}
	proxies := []string{fileURL(c.Proxy), fileURL(filepath.Join(lines[0], "cache", "download"))}
	if p := lines[1]; p != "" && p != "off" {
		proxies = append(proxies, p)
	}
	return append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-modcacherw", // so that the throw-away cache can be deleted
		"GOPROXY="+strings.Join(proxies, ","),
		"GOSUMDB=off", // test versions are in no checksum database
		"GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=", "GOINSECURE=",
		"GOMODCACHE="+c.ModCache,
		"GOTOOLCHAIN=local",
	), nil
}

func fileURL(dir string) string {
	return "file://" + filepath.ToSlash(dir)
}

// run runs a go command (or the built program) in dir.
func (c *consumer) run(env []string, dir string, name string, args ...string) (string, error) {
	start := time.Now()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	label := name
	if name != "go" {
		label = "./" + filepath.Base(name)
	}
	c.Logf("%s %s (%.1fs)", label, strings.Join(args, " "), time.Since(start).Seconds())
	if err != nil {
		return out.String(), fmt.Errorf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String(), nil
}

// check go-gets every published module at version into a new consumer
// module, builds and runs a program that uses them all, confirms where
// each of our modules came from, and builds each published module that
// requires another on its own go.mod and go.sum, as shipped.
func (c *consumer) check(mods []*goModule, version, goVersion string) error {
	env, err := c.env()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	type adapter struct {
		Name, Path string
		Store      bool // a store adapter, with a Store type and New
	}
	var adapters []adapter
	var get []string
	for _, m := range mods {
		if !m.Published {
			continue
		}
		get = append(get, m.Path+"@"+version)
		if m.Dir != "." {
			adapters = append(adapters, adapter{path.Base(m.Dir), m.Path, strings.HasPrefix(m.Dir, "store/")})
		}
	}
	var src bytes.Buffer
	if err := consumerProgram.Execute(&src, adapters); err != nil {
		return err
	}
	gomod := fmt.Sprintf("module example.com/consumer\n\ngo %s\n", goVersion)
	if err := os.WriteFile(filepath.Join(c.Dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "main.go"), src.Bytes(), 0o644); err != nil {
		return err
	}

	if _, err := c.run(env, c.Dir, "go", append([]string{"get"}, get...)...); err != nil {
		return err
	}
	bin := filepath.Join(c.Dir, "consumer")
	if _, err := c.run(env, c.Dir, "go", "build", "-trimpath", "-o", bin, "."); err != nil {
		return err
	}
	out, err := c.run(env, c.Dir, bin)
	if err != nil {
		return err
	}
	if out != consumerOutput {
		return fmt.Errorf("the consumer printed %q, want %q", out, consumerOutput)
	}

	var paths []string
	for _, m := range mods {
		if m.Published {
			paths = append(paths, m.Path)
		}
	}
	// Only our modules: "all" would need every module's .info, which the
	// download cache lacks for modules whose go.mod alone was needed.
	list, err := c.run(env, c.Dir, "go", append([]string{"list", "-m", "-f", "{{.Path}}\t{{.Version}}\t{{.Dir}}\t{{if .Replace}}replaced{{else}}-{{end}}"}, paths...)...)
	if err != nil {
		return err
	}
	dirs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 || !ours(f[0]) {
			continue
		}
		if f[1] != version || f[3] != "-" || !strings.HasPrefix(f[2], c.ModCache+string(filepath.Separator)) {
			return fmt.Errorf("the consumer resolved %s as %q, not %s from the proxy", f[0], line, version)
		}
		dirs[f[0]] = f[2]
	}
	for _, m := range mods {
		if !m.Published {
			continue
		}
		dir, ok := dirs[m.Path]
		if !ok {
			return fmt.Errorf("%s is not in the consumer's build list", m.Path)
		}
		if m.Dir == "." || len(m.File.Require) == 0 {
			continue
		}
		// Built alone, the module as downloaded must find everything
		// through its own go.sum, which the go command checks against
		// what it downloads.
		alone := filepath.Join(c.Dir, "alone", path.Base(m.Dir))
		if err := os.CopyFS(alone, os.DirFS(dir)); err != nil {
			return err
		}
		aloneEnv := append(env[:len(env):len(env)], "GOFLAGS=-modcacherw -mod=readonly")
		if _, err := c.run(aloneEnv, alone, "go", "build", "-trimpath", "./..."); err != nil {
			return fmt.Errorf("%s at %s does not build on its own go.mod and go.sum: %w", m.Path, version, err)
		}
	}
	return nil
}
