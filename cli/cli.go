// Package cli is the sqlease operator tool as an importable package: the
// sqlease command (cmd/sqlease) is a few lines calling Main, and a third
// party builds the same tool with its own dialect by registering it:
//
//	package main
//
//	import (
//		"os"
//
//		"github.com/sqlease/sqlease/cli"
//		_ "example.com/mydialect" // dialect.Register + sql.Register
//	)
//
//	func init() {
//		cli.RegisterBackend(cli.Backend{Dialect: "mydb", Driver: "mydriver", Check: ...})
//	}
//
//	func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
//
// Commands:
//
//	sqlease check   [--dsn DSN] [--dialect NAME] [--schema S] [--run REGEXP] [--full] [--parallel N] [--verbose] [--timeout D] [--json]
//	sqlease migrate [up|status|down] [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--yes] [--json]
//	sqlease status  [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--key PREFIX] [--json]
//	sqlease sweep   [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--limit N] [--json]
//	sqlease release KEY [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--yes] [--json]
//	sqlease drop    [--dsn DSN] [--dialect NAME] [--schema S] [--prefix P] [--yes] [--json]
//	sqlease version [--json]
//
// check runs the conformance suite (package conformance) against a database:
// without --dsn on a fresh embedded SQLite file, with a PostgreSQL or MySQL
// DSN in a fresh schema (MySQL: database) per case that is dropped
// afterwards, or with --schema in that existing schema under a fresh table
// prefix per case, everything under which is dropped afterwards. It prints the cases sorted and grouped by rule in the
// contract's order (a "== S1" line, then "S1_Name  PASS  0.12s" lines, S1
// before S2 before S10, then H, W, F, D, I), a failing or skipped case's log
// indented under it, and last "N passed, N failed, N skipped". migrate up
// provisions the lock tables, printing one goose-style line per migration
// ("OK   00001_lock_tables.sql (3.41ms)") and the version reached; migrate
// status lists the migrations and says whether any are pending (it exits
// 0 either way: it reports); migrate down reverts them all (goose's
// DownTo(0), through migrate.Down), keeping the version table. status lists
// leases and pending writers, sweep deletes expired rows in one bounded
// batch. release ends every lease of exactly KEY, whoever holds it
// (lock.Locker.ForceRelease; waiters' markers and FIFO tickets are left
// alone): its holder finds the lease gone at its next renewal, its fenced
// transactions commit nothing meanwhile, and the next grant has a greater
// token. Without --yes it lists the leases it would release and asks, or,
// when stdin is not a terminal, exits 2; it exits 1 when nothing holds
// KEY. drop uninstalls (migrate.Drop): it reverts every migration and
// drops the version table and the migration lock's table, so nothing of the
// namespace is left; the schema itself is kept. migrate down and drop
// delete every lease: they ask for "yes" on a terminal, and when stdin is
// not a terminal they need --yes (without it they exit 2 saying what would
// be dropped). version prints the module version and the VCS commit, commit
// time and modified flag that go build recorded ("(devel)" and "unknown"
// when none was recorded, as with go run).
//
// # JSON output
//
// With --json a command prints JSON instead of text, with these field names
// (stable: fields may be added, never renamed or removed; an unknown value
// is empty, not left out; only a field that does not apply to the action is
// left out, as noted). Durations are milliseconds as numbers.
//
//   - check: one object {"dialect", "cases": [{"name", "rule", "result"
//     (PASS, FAIL or SKIP), "duration_ms", "message" (the case's log for a
//     failure or skip, or with --verbose)}], "summary": {"passed", "failed",
//     "skipped"}, "running" (cases still running at --timeout, counted as
//     failed)}, cases in the order of the text output.
//   - migrate up, status, down: one object {"action" (up, status or down),
//     "version" (applied afterwards), "latest" (newest known),
//     "version_table", "migrations": [{"version", "name", "applied" (status
//     only), "duration_ms" and "empty" (up and down only)}], "duration_ms"}.
//     For up and down, migrations lists those applied or reverted.
//   - status: one object per line {"key", "mode" (exclusive, shared,
//     pending-writer or queued: a FIFO waiter's ticket), "owner",
//     "lease_id" (the ticket ID for queued), "token" (for queued, the
//     ticket's sequence number, which orders the queue), "expires_at" (RFC
//     3339, UTC), "expires_in_ms" (negative once expired), "expired",
//     "pending_writer", "queue_position" (a live ticket's place in its
//     key's queue, 1 next; 0 otherwise)}.
//   - sweep: one object {"swept", "limit"}.
//   - release: one object {"key", "released": [leases as status prints
//     them, read just before the release]}; "released" is empty when
//     nothing held the key (exit 1).
//   - drop: one object {"reverted": [as migrations above], "dropped" (the
//     tables dropped, quoted as in SQL), "duration_ms"}.
//   - version: one object {"module", "version", "commit", "commit_time",
//     "modified", "go", "main" (the main module of the binary)}.
//
// Errors still go to stderr as one line, with the exit code below.
//
// The DSN comes from --dsn or $SQLEASE_DSN; which dialect and driver serve
// it comes from the registered Backends (RegisterBackend): built in are
// postgres:// and postgresql:// (PostgreSQL through pgx); file:, sqlite: and
// paths ending in .db, .sqlite or .sqlite3 (SQLite through
// modernc.org/sqlite, pure Go); mysql:// and mariadb:// URLs and go-sql-driver DSNs
// (MySQL/MariaDB through go-sql-driver/mysql). --dialect NAME overrides the
// guess. Commands are registered too (RegisterCommand), so a build can add
// its own.
//
// Exit codes: 0 success; 1 a conformance case failed, a database operation
// failed, a confirmation was declined or release found nothing held under
// its key; 2 bad usage (every bad input: an
// unknown flag or argument, an unknown --dialect, a malformed DSN, a key
// prefix that is not valid UTF-8, has a NUL or is over 512 bytes, a bad or
// reserved schema such as pg_catalog, a missing --yes or KEY, an in-memory
// SQLite DSN such as file::memory: for migrate, status, sweep, release or drop,
// whose database would vanish when the command exits), an unreachable
// database or lock tables that are not migrated (status, sweep, release;
// when lock tables exist under another prefix or schema, the message, like
// migrate status's, names them before it advises to migrate: "found
// nc_db_version: did you mean --prefix nc_?"). A DSN its
// driver cannot parse is reported as `malformed postgres DSN "..."`, with
// the parser's reason and no connection tried; one that parses but whose
// server does not answer as "cannot reach"; a server that refuses the role
// or has no such database as `role "x" was refused ...` or `database "y"
// does not exist ...` (exit 2, the DSN named without its password). migrate status exits 0 with migrations pending,
// or with a database newer than the build: it lists them and says what to
// do; a script compares the "version" and "latest" of its --json output.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
)

// Main runs the sqlease tool with args (without the program name), writing
// to stdout and stderr, and returns the process exit code (0 success, 1 a
// failed check or database operation, 2 bad usage). A process started as a
// child by a multi-process conformance case (conformance.IsChild) does the
// child's work instead: call Main before any other set-up in main.
func Main(args []string, stdout, stderr io.Writer) int {
	// Multi-process conformance cases re-execute this binary with the same
	// arguments; such a child does its share of the work and exits.
	if conformance.IsChild() {
		return conformance.ChildMain()
	}
	return run(args, stdout, stderr)
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
	// hint: the message ends with "; run 'sqlease help <command>'" (a
	// bad argument, as for a bad flag).
	hint bool
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr is an error that exits with code 2: bad usage, an unreachable
// database, lock tables that are not migrated.
func usageErr(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// argErr is a usage error about a positional argument: its message ends
// with the command's help hint, as a flag error's does.
func argErr(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...), hint: true}
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
	// more is printed after the summary by `sqlease help <command>`:
	// behaviour the one-line summary leaves out, such as an exit code.
	more  string
	setup func(fs *flag.FlagSet, out *output) func(ctx context.Context, args []string) error
}

// output is where a command writes.
type output struct {
	stdout, stderr io.Writer
}

// Command is one subcommand of the tool. Setup registers the command's
// flags on fs and returns the function that runs it with the positional
// arguments; an error from it is printed and exits 1, or 2 when made with
// UsageError.
type Command struct {
	Name    string
	Args    string // positional arguments, for the usage line
	Summary string
	Setup   func(fs *flag.FlagSet, stdout, stderr io.Writer) func(ctx context.Context, args []string) error
}

var (
	extraMu       sync.Mutex
	extraCommands []Command
)

// RegisterCommand adds a command to the tool, listed after the built-in
// ones. It panics when the name or Setup is empty or the name is taken.
// Call it from an init function.
func RegisterCommand(c Command) {
	if c.Name == "" || c.Setup == nil {
		panic("cli: RegisterCommand needs a Name and a Setup")
	}
	if _, ok := lookupCommand(c.Name); ok {
		panic("cli: RegisterCommand called twice for command " + c.Name)
	}
	extraMu.Lock()
	defer extraMu.Unlock()
	extraCommands = append(extraCommands, c)
}

// UsageError returns an error that makes a command exit with code 2 (bad
// usage, an unreachable database).
func UsageError(format string, args ...any) error { return usageErr(format, args...) }

// commands lists the built-in commands, then the registered ones, then
// help.
func commands() []command {
	cs := []command{
		{name: "check", summary: "run the conformance suite against a database (default: a fresh embedded SQLite file)", more: checkMore, setup: setupCheck},
		{name: "migrate", args: "[up|status|down]", summary: "apply the lock table migrations (up, the default), list them (status) or revert them all (down, asks first)", more: migrateStatusExit, setup: setupMigrate},
		{name: "status", summary: "list leases, pending-writer markers and FIFO tickets with their tokens and expiry", more: statusModes, setup: setupStatus},
		{name: "sweep", summary: "delete expired lease rows, at most --limit, in one short transaction", setup: setupSweep},
		{name: "release", args: "KEY", summary: "end every lease of exactly KEY now, whoever holds it (asks first); its holder finds it gone at its next renewal", more: releaseMore, setup: setupRelease},
		{name: "drop", summary: "uninstall: revert every migration and drop the version and migration lock tables (asks first)", setup: setupDrop},
		{name: "version", summary: "print the sqlease module version and the commit it was built from", setup: setupVersion},
	}
	extraMu.Lock()
	for _, c := range extraCommands {
		setup := c.Setup
		cs = append(cs, command{name: c.Name, args: c.Args, summary: c.Summary,
			setup: func(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
				return setup(fs, out.stdout, out.stderr)
			}})
	}
	extraMu.Unlock()
	return append(cs, command{name: "help", args: "[command]", summary: "show help for every command, or for one"})
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
		if name == "help" && len(args) > 2 {
			fmt.Fprintf(stderr, "sqlease help: unexpected argument %q; run 'sqlease help'\n", args[2])
			return exitUsage
		}
		if name == "help" && len(args) > 1 && args[1] == "help" {
			fmt.Fprintf(stdout, "Usage: sqlease help [command]\n\nShow help for every command, or for one.\n")
			return exitOK
		}
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
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.Is(err, dialect.ErrInvalidInput):
		// Bad input caught by lock, migrate or dialect is bad usage too.
		code = exitUsage
	}
	if msg := oneLine(err.Error()); msg != "" {
		if ee != nil && ee.hint {
			msg += "; run 'sqlease help " + c.name + "'"
		}
		fmt.Fprintf(stderr, "sqlease %s: %s\n", c.name, msg)
	}
	return code
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments ("migrate status --dsn X" and "migrate --dsn X
// status") and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := flagTakenAsValue(fs, args); err != nil {
		return nil, err
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, dashDashFlags(fs, err)
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

// flagTakenAsValue reports a flag followed by another flag where its value
// should be ("--schema --run X"): the flag package would take "--run" as
// the schema, and the mistake would surface later as a confusing
// "unexpected argument".
func flagTakenAsValue(fs *flag.FlagSet, args []string) error {
	for i := 0; i+1 < len(args) && args[i] != "--"; i++ {
		f := fs.Lookup(strings.TrimLeft(args[i], "-"))
		if f == nil || !strings.HasPrefix(args[i], "-") || isBoolFlag(f) {
			continue
		}
		next := args[i+1]
		name, _, _ := strings.Cut(strings.TrimLeft(next, "-"), "=")
		if strings.HasPrefix(next, "-") && fs.Lookup(name) != nil {
			return fmt.Errorf("flag needs an argument: --%s (it is followed by the flag %q)", f.Name, next)
		}
		i++ // args[i+1] is f's value
	}
	return nil
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// The flag package's parse errors name the flag with one dash, after the
// value the user gave (quoted with %q) where there is one.
var (
	flagUndefined = regexp.MustCompile(`^flag provided but not defined: -(\S+)$`)
	flagNoArg     = regexp.MustCompile(`^flag needs an argument: -(\S+)$`)
	flagBadValue  = regexp.MustCompile(`^invalid (boolean )?value ("(?:[^"\\]|\\.)*") for (flag )?-([^\s:]+): (.*)$`)
)

// dashDashFlags rewrites the flag package's "-name" to "--name", the
// spelling of sqlease's usage text and docs, without touching the value
// the user gave, and replaces its "parse error" with the kind of value the
// flag takes.
func dashDashFlags(fs *flag.FlagSet, err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if m := flagUndefined.FindStringSubmatch(msg); m != nil {
		return errors.New("unknown flag --" + m[1])
	}
	if m := flagNoArg.FindStringSubmatch(msg); m != nil {
		return errors.New("flag needs an argument: --" + m[1])
	}
	m := flagBadValue.FindStringSubmatch(msg)
	if m == nil {
		return err
	}
	why := m[5]
	if f := fs.Lookup(m[4]); f != nil && why == "parse error" {
		if g, ok := f.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case int, int64, uint, uint64:
				why = "want a whole number"
			case float64:
				why = "want a number"
			case time.Duration:
				why = "want a duration: a number with a unit (ms, s, m, h), such as 30s or 2m"
			case bool:
				why = "want true or false"
			}
		}
	}
	return fmt.Errorf("invalid %svalue %s for %s--%s: %s", m[1], m[2], m[3], m[4], why)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

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
	fmt.Fprintf(w, "\n%s\n\nExit codes: 0 success; 1 a check case or a database operation failed, or a\nconfirmation was declined; 2 bad usage (any bad input), unreachable database\nor lock tables not migrated (status, sweep, release). release exits 1 when\nnothing holds its key. migrate status exits 0 with migrations pending: it\nreports, it does not refuse.\n\nRun 'sqlease help <command>' for the meaning of each flag.\n", dsnHelp())
}

func commandUsage(w io.Writer, c command) {
	line := "sqlease " + c.name
	if c.args != "" {
		line += " " + c.args
	}
	fmt.Fprintf(w, "Usage: %s [flags]\n\n%s.\n", line, strings.ToUpper(c.summary[:1])+c.summary[1:])
	if c.more != "" {
		fmt.Fprintf(w, "\n%s\n", c.more)
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.setup(fs, &output{stdout: io.Discard, stderr: io.Discard})
	printFlags(w, fs)
	fmt.Fprintf(w, "\n%s\n", dsnHelp())
}

// printFlags lists fs's flags as flag.PrintDefaults does, but spelled
// --flag, as in the top-level help.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		s := "  --" + f.Name
		if name != "" {
			s += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", s, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if !zeroDefault(f) {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// zeroDefault reports whether f's default is its type's zero value, which
// PrintDefaults leaves out.
func zeroDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return true
	}
	return false
}
