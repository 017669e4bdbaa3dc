//go:build linux

package chaos

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a worker die when the driver dies, and puts it in a
// process group of its own so a Ctrl-C meant for the driver does not reach
// it (the driver stops the run in order).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
