//go:build unix

package conformance

import (
	"os"
	"syscall"
)

// stopProcess stops p (SIGSTOP), as a long pause would; a nil p only
// reports support.
func stopProcess(p *os.Process) error {
	if p == nil {
		return nil
	}
	return p.Signal(syscall.SIGSTOP)
}

// continueProcess resumes a stopped p (SIGCONT).
func continueProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
