//go:build !linux

package etcdtest

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal: the test's cleanup stops the server.
func setParentDeathSignal(*exec.Cmd) {}
