//go:build !unix

package conformance

import (
	"errors"
	"os"
)

func stopProcess(*os.Process) error { return errors.ErrUnsupported }

func continueProcess(*os.Process) error { return errors.ErrUnsupported }
