package etcdtest

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the server if the test process
// dies without stopping it (a timeout's panic, a SIGKILL).
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
