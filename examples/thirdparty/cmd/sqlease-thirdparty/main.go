// Command sqlease-thirdparty is the sqlease tool built with the example
// dialect: the built-in dialects plus "thirdparty", whose DSNs end in .tpdb
// (or any SQLite path with --dialect thirdparty).
//
//	sqlease-thirdparty check --dialect thirdparty --dsn /tmp/locks.tpdb
package main

import (
	"os"

	"github.com/sqlease/sqlease/cli"

	"github.com/sqlease/sqlease/examples/thirdparty"
)

func init() { thirdparty.RegisterBackend() }

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
