package chaos_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sqlease/sqlease/chaos"
)

// A program that runs the suite must let its worker processes through
// first (in a test binary: in TestMain), then call Run and read the
// report's figures.
func ExampleRun() {
	if chaos.IsWorker() {
		os.Exit(chaos.WorkerMain())
	}
	rep, err := chaos.Run(context.Background(), chaos.Config{
		Dialect:  "postgres", // a private cluster: needs the server binaries and OS user postgres
		Duration: 10 * time.Minute,
		Log:      os.Stderr,
	})
	if err != nil {
		fmt.Println("setup failed:", err)
		return
	}
	fmt.Print(rep) // run length, grants checked, faults by kind, violations, stuck keys
	if !rep.OK() {
		os.Exit(1)
	}
}
