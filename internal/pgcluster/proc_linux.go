//go:build linux

package pgcluster

import (
	"os"
	"os/exec"
	"syscall"
)

// needRunuser: other users' programs are started by switching credentials
// directly.
const needRunuser = false

// asUserCmd runs path as uid:gid when switchUser (this process is root),
// in a process group of its own, and dies with this process, so a test
// binary killed by its timeout leaves no private server running.
func asUserCmd(path string, args []string, uid, gid int, switchUser bool) *exec.Cmd {
	cmd := exec.Command(path, args...)
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if switchUser {
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	cmd.SysProcAttr = attr
	return cmd
}

// killTree sends SIGKILL to p's process group: the postmaster and every
// backend it forked.
func killTree(p *os.Process) {
	if err := syscall.Kill(-p.Pid, syscall.SIGKILL); err != nil {
		_ = p.Kill()
	}
}
