// Command sqlease is the operator tool of the sqlease lock library.
//
//	sqlease check   [--dsn DSN] [--dialect NAME] [--run REGEXP] [--full] [--parallel N] [--verbose]
//	sqlease migrate [up|status] [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P]
//	sqlease status  [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--key PREFIX] [--json]
//	sqlease sweep   [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--limit N]
//
// check runs the conformance suite (package conformance) against a database:
// without --dsn on a fresh embedded SQLite file, with a PostgreSQL DSN in a
// fresh schema per case that is dropped afterwards. migrate provisions the
// lock tables, status lists leases and pending writers, sweep deletes expired
// rows in one bounded batch.
//
// The DSN comes from --dsn or $SQLEASE_DSN. postgres:// and postgresql://
// DSNs use PostgreSQL through pgx; file:, sqlite: and paths ending in .db,
// .sqlite or .sqlite3 use SQLite through mattn/go-sqlite3; --dialect NAME
// overrides the guess.
//
// Exit codes: 0 success; 1 a conformance case failed or a database operation
// failed; 2 bad usage, an unreachable database or lock tables that are not
// migrated.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sqlease/sqlease/conformance"
)

func main() {
	// Multi-process conformance cases re-execute this binary with the same
	// arguments; such a child does its share of the work and exits.
	if conformance.IsChild() {
		os.Exit(conformance.ChildMain())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// exitError carries the exit code of a command's error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr is an error that exits with code 2: bad usage, an unreachable
// database, lock tables that are not migrated.
func usageErr(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// errFailed is an error that exits with code 1 without a message of its
// own (the command already printed what failed).
var errFailed = &exitError{code: exitFailed, err: errors.New("")}

// command is one subcommand: setup registers its flags on fs and returns
// the function that runs it with the positional arguments.
type command struct {
	name    string
	args    string // positional arguments, for the usage line
	summary string
	setup   func(fs *flag.FlagSet, out *output) func(ctx context.Context, args []string) error
}

// output is where a command writes.
type output struct {
	stdout, stderr io.Writer
}

func commands() []command {
	return []command{
		{name: "check", summary: "run the conformance suite against a database (default: a fresh embedded SQLite file)", setup: setupCheck},
		{name: "migrate", args: "[up|status]", summary: "apply the lock table migrations (up, the default) or list them (status)", setup: setupMigrate},
		{name: "status", summary: "list leases and pending-writer markers with their tokens and expiry", setup: setupStatus},
		{name: "sweep", summary: "delete expired lease rows, at most --limit, in one short transaction", setup: setupSweep},
		{name: "help", args: "[command]", summary: "show help for every command, or for one"},
	}
}

func lookupCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// run is the whole program: it runs the command in args and returns the
// exit code.
func run(args []string, stdout, stderr io.Writer) int {
	out := &output{stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if name == "help" && len(args) > 1 {
			c, ok := lookupCommand(args[1])
			if !ok || c.setup == nil {
				fmt.Fprintf(stderr, "sqlease: unknown command %q; run 'sqlease help'\n", args[1])
				return exitUsage
			}
			commandUsage(stdout, c)
			return exitOK
		}
		usage(stdout)
		return exitOK
	}
	c, ok := lookupCommand(name)
	if !ok || c.setup == nil {
		fmt.Fprintf(stderr, "sqlease: unknown command %q; run 'sqlease help'\n", name)
		return exitUsage
	}
	fs := flag.NewFlagSet("sqlease "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runCmd := c.setup(fs, out)
	pos, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		commandUsage(stdout, c)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "sqlease %s: %v; run 'sqlease help %s'\n", c.name, err, c.name)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = runCmd(ctx, pos)
	if err == nil {
		return exitOK
	}
	code := exitFailed
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if msg := oneLine(err.Error()); msg != "" {
		fmt.Fprintf(stderr, "sqlease %s: %s\n", c.name, msg)
	}
	return code
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments ("migrate status --dsn X" and "migrate --dsn X
// status") and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

const dsnHelp = `The DSN comes from --dsn or $SQLEASE_DSN. postgres:// and postgresql:// DSNs
use PostgreSQL (driver pgx); file:, sqlite: and paths ending in .db, .sqlite or
.sqlite3 use SQLite (driver sqlite3). --dialect NAME overrides the guess.`

func usage(w io.Writer) {
	fmt.Fprintf(w, "sqlease is the operator tool of the sqlease leased-lock library.\n\nUsage:\n  sqlease <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		if c.setup == nil {
			continue
		}
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.setup(fs, &output{stdout: io.Discard, stderr: io.Discard})
		var flags []string
		fs.VisitAll(func(f *flag.Flag) {
			name, _ := flag.UnquoteUsage(f)
			s := "--" + f.Name
			if name != "" {
				s += " " + name
			}
			flags = append(flags, "["+s+"]")
		})
		line := "sqlease " + c.name
		if c.args != "" {
			line += " " + c.args
		}
		fmt.Fprintf(w, "           %s %s\n", line, strings.Join(flags, " "))
	}
	fmt.Fprintf(w, "\n%s\n\nExit codes: 0 success; 1 a check case or a database operation failed;\n2 bad usage, unreachable database or lock tables not migrated.\n\nRun 'sqlease help <command>' for the meaning of each flag.\n", dsnHelp)
}

func commandUsage(w io.Writer, c command) {
	line := "sqlease " + c.name
	if c.args != "" {
		line += " " + c.args
	}
	fmt.Fprintf(w, "Usage: %s [flags]\n\n%s.\n\nFlags:\n", line, strings.ToUpper(c.summary[:1])+c.summary[1:])
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.setup(fs, &output{stdout: io.Discard, stderr: io.Discard})
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\n%s\n", dsnHelp)
}
