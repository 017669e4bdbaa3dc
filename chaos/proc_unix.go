//go:build unix

package chaos

import (
	"os"
	"syscall"
)

func stopProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func contProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// signalsSupported reports whether workers can be stopped and continued.
const signalsSupported = true
