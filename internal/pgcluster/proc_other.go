//go:build !linux

package pgcluster

import (
	"os"
	"os/exec"
)

// needRunuser: other users' programs are started through runuser.
const needRunuser = true

// asUserCmd runs path as OS user postgres through runuser when switchUser.
func asUserCmd(path string, args []string, _, _ int, switchUser bool) *exec.Cmd {
	if switchUser {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// killTree kills p (its backends notice the postmaster is gone and exit).
func killTree(p *os.Process) { _ = p.Kill() }
