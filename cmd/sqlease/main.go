// Command sqlease is the operator tool of the sqlease lock library: check,
// migrate, status, sweep, drop, version and chaos on PostgreSQL, SQLite and MySQL/MariaDB.
// The tool lives in package github.com/sqlease/sqlease/cli; see its
// documentation for the commands, and for building the tool with a
// dialect of your own. The chaos command (package chaos) is added here.
package main

import (
	"os"

	"github.com/sqlease/sqlease/chaos"
	"github.com/sqlease/sqlease/cli"
)

func main() {
	// sqlease chaos re-executes this binary for its worker processes.
	if chaos.IsWorker() {
		os.Exit(chaos.WorkerMain())
	}
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
