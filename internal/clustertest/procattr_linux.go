package clustertest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel SIGKILL cmd when the test process dies, so
// that a test binary that panics or is killed leaves no replica behind.
// (Linux sends it when the thread that started cmd exits; Go keeps its
// threads unless a goroutine locked to one exits locked, which nothing here
// does.)
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
