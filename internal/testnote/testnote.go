// Package testnote prints, from a test package's TestMain, one line saying
// which database tests the run skips and how to enable them. go test shows
// a passing package's output only with -v, so the line goes to the go
// command's own standard error when the test binary runs under it (Linux)
// and that is a terminal or a pipe, and to the binary's standard error
// otherwise (for example when the go command's output goes to a file): a first `go test ./...`
// without a DSN says that PostgreSQL (or MySQL) was skipped.
package testnote

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Database names a database whose tests a package runs when its DSN
// variable is set.
type Database struct {
	Name    string // "PostgreSQL"
	DSNVar  string // "SQLEASE_POSTGRES_DSN"
	Example string // an example DSN
	Require string // the variable that turns a skip into a failure
}

// PostgreSQL is the database of the PostgreSQL tests.
var PostgreSQL = Database{
	Name: "PostgreSQL", DSNVar: "SQLEASE_POSTGRES_DSN",
	Example: "postgres://root@127.0.0.1:5432/test?sslmode=disable", Require: "SQLEASE_REQUIRE_POSTGRES",
}

// MySQL is the database of the MySQL/MariaDB tests.
var MySQL = Database{
	Name: "MySQL", DSNVar: "SQLEASE_MYSQL_DSN",
	Example: "root@tcp(127.0.0.1:3306)/test", Require: "SQLEASE_REQUIRE_MYSQL",
}

// SkipLine returns the line for pkg, or "" when every database's DSN is set.
func SkipLine(pkg string, dbs ...Database) string {
	var parts []string
	for _, d := range dbs {
		if os.Getenv(d.DSNVar) != "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s tests skipped: %s is not set (e.g. %s='%s'; %s=1 makes a missing database fail)",
			d.Name, d.DSNVar, d.DSNVar, d.Example, d.Require))
	}
	if len(parts) == 0 {
		return ""
	}
	return pkg + ": " + strings.Join(parts, "; ")
}

// Skipped prints SkipLine(pkg, dbs...) once, where a plain go test run
// shows it. Child processes started by multi-process conformance cases
// print nothing.
func Skipped(pkg string, dbs ...Database) {
	if os.Getenv("SQLEASE_CONFORMANCE_CHILD") != "" {
		return
	}
	line := SkipLine(pkg, dbs...)
	if line == "" {
		return
	}
	w, closeW := goStderr()
	defer closeW()
	fmt.Fprintln(w, line)
}

// goStderr returns the go command's standard error when the parent process
// is the go command (Linux) and that is a terminal or a pipe, else
// os.Stderr.
func goStderr() (io.Writer, func()) {
	if runtime.GOOS == "linux" {
		ppid := os.Getppid()
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppid)); err == nil && filepath.Base(exe) == "go" {
			if f := openShared(fmt.Sprintf("/proc/%d/fd/2", ppid)); f != nil {
				return f, func() { f.Close() }
			}
		}
	}
	return os.Stderr, func() {}
}

// openShared opens path (another process's descriptor under /proc) for
// writing when it is a terminal (a character device) or a pipe, and returns
// nil otherwise. A regular file is refused: opened anew it has an offset
// of its own, so the go command's writes through its descriptor (as in
// `go test ./... > file 2>&1`) would overwrite our line.
func openShared(path string) *os.File {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&(os.ModeNamedPipe|os.ModeCharDevice) == 0 {
		f.Close()
		return nil
	}
	return f
}
