// Command testserver starts and stops the throwaway servers of package
// testservers in Docker, for the scripts under scripts/servers.
//
//	testserver start NAME DIR   start NAME (mongo, postgres, redis, etcd), wait
//	                            until it is ready, remember its container in
//	                            DIR/NAME.container and print the shell lines
//	                            "export VAR='value'" that point the tests at it
//	testserver stop NAME DIR    remove the container start remembered
//
// When no Docker daemon answers, start prints why on stderr and exits
// with status 3 (NoDaemon), so that a script can tell "no Docker here"
// from a failure.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency/internal/testservers"
)

// NoDaemon is the exit status of start when no Docker daemon answers.
const NoDaemon = 3

// wait bounds the pull of the image and the server's start.
const wait = 5 * time.Minute

func main() {
	if len(os.Args) != 4 || (os.Args[1] != "start" && os.Args[1] != "stop") {
		fmt.Fprintf(os.Stderr, "usage: testserver start|stop NAME DIR (NAME: %s)\n", strings.Join(testservers.Names(), ", "))
		os.Exit(2)
	}
	cmd, name, dir := os.Args[1], os.Args[2], os.Args[3]
	file := filepath.Join(dir, name+".container")
	if cmd == "stop" {
		b, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if err == nil {
			err = testservers.Remove(strings.TrimSpace(string(b)))
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "testserver: removing the %s container: %v\n", name, err)
			os.Exit(1)
		}
		_ = os.Remove(file)
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		os.Exit(1)
	}
	if _, err := testservers.Daemon(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(NoDaemon)
	}
	fmt.Fprintf(os.Stderr, "testserver: starting %s in Docker (pulling the image the first time)\n", name)
	srv, err := testservers.Start(name, wait)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(file, []byte(srv.ID+"\n"), 0o644); err != nil {
		_ = srv.Close()
		fmt.Fprintln(os.Stderr, "testserver:", err)
		os.Exit(1)
	}
	fmt.Print(exports(srv.Exports))
}

// exports renders the variables as shell export lines, in name order,
// each value in single quotes.
func exports(vars map[string]string) string {
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, "export %s='%s'\n", k, strings.ReplaceAll(vars[k], "'", `'\''`))
	}
	return b.String()
}
