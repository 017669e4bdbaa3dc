//go:build !unix

package chaos

import (
	"errors"
	"os"
)

func stopProcess(*os.Process) error { return errors.ErrUnsupported }
func contProcess(*os.Process) error { return errors.ErrUnsupported }

const signalsSupported = false
