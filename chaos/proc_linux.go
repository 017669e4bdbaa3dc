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

// needRunuser: other users' programs are started by switching credentials
// directly.
const needRunuser = false

// asUserCmd runs path as uid:gid when switchUser (this process is root),
// and dies with the driver, so a driver killed by a test timeout leaves no
// private server running.
func asUserCmd(path string, args []string, uid, gid int, switchUser bool) *exec.Cmd {
	cmd := exec.Command(path, args...)
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if switchUser {
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	cmd.SysProcAttr = attr
	return cmd
}
