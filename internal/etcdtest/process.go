package etcdtest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Process is one etcd 3.6 member running in a process of its own.
type Process struct {
	// ClientURL is where it serves clients.
	ClientURL string
	cmd       *exec.Cmd
}

// StartProcess builds ./cmd/etcd36 of this module without the race
// detector (the build is cached after the first), starts it as one member
// with timing t, waits until it serves, and stops it at the end of the
// test. An embedded server shares the test binary's race instrumentation,
// which makes it many times slower: under a burst of thousands of requests
// on a loaded machine it times requests out ("etcdserver: request timed
// out") and sheds them ("too many requests"). A server in its own process
// serves them as a deployed one does.
func StartProcess(tb testing.TB, t Timing) *Process {
	tb.Helper()
	if t.TickMs == 0 {
		t = Fast
	}
	bin := filepath.Join(tb.TempDir(), "etcd36")
	build := exec.Command(goTool(), "build", "-race=false", "-o", bin, "./cmd/etcd36")
	build.Dir = moduleDir(tb)
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("building the etcd 3.6 server (%s): %v\n%s", strings.Join(build.Args, " "), err, out)
	}
	clientURL, peerURL := freeURL(tb), freeURL(tb)
	cmd := exec.Command(bin, "-data-dir", tb.TempDir(), "-client-url", clientURL.String(), "-peer-url", peerURL.String(),
		"-tick-ms", fmt.Sprint(t.TickMs), "-election-ms", fmt.Sprint(t.ElectionMs))
	setParentDeathSignal(cmd)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting the etcd 3.6 server: %v", err)
	}
	p := &Process{ClientURL: clientURL.String(), cmd: cmd}
	tb.Cleanup(p.stop)
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- nil
				return
			}
		}
		ready <- errors.New("the etcd 3.6 server exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			tb.Fatal(err)
		}
	case <-time.After(time.Minute):
		tb.Fatal("the etcd 3.6 server was not ready after a minute")
	}
	return p
}

// Endpoints is the member's client address.
func (p *Process) Endpoints() []string { return []string{strings.TrimPrefix(p.ClientURL, "http://")} }

// Client returns a client of the member, closed at the end of the test.
func (p *Process) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return client(tb, p.Endpoints())
}

// stop asks the server to stop, and kills it if it has not within 10s.
func (p *Process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// goTool is the go command of the toolchain that runs the test: go test
// puts its GOROOT/bin first on the test's PATH.
func goTool() string { return "go" }

// moduleDir is this module's directory: the one with the go.mod above
// the test's working directory.
func moduleDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/exactlyonce/idempotency/internal/etcdtest\n") {
			return d
		}
		if filepath.Dir(d) == d {
			tb.Fatalf("no go.mod of github.com/exactlyonce/idempotency/internal/etcdtest above %s", dir)
		}
	}
}
