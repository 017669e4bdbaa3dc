package cli

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/migrate"
)

// stdin is where confirm reads the answer; stdinIsTerminal reports whether
// it is a terminal (tests replace both).
var (
	stdin           io.Reader = os.Stdin
	stdinIsTerminal           = func() bool { return term.IsTerminal(int(os.Stdin.Fd())) }
)

// confirm asks before a destructive step described by what ("drop ...").
// With yes it goes on. When stdin is not a terminal it refuses with a
// usage error (exit 2) saying what would happen; on a terminal it asks and
// goes on only when the answer is "yes".
func confirm(out *output, what string, yes bool) error {
	if yes {
		return nil
	}
	if !stdinIsTerminal() {
		return usageErr("would %s; pass --yes to confirm (stdin is not a terminal)", what)
	}
	fmt.Fprintf(out.stderr, "This will %s.\nType yes to go on: ", what)
	line, _ := bufio.NewReader(stdin).ReadString('\n')
	if strings.TrimSpace(line) != "yes" {
		return &exitError{code: exitFailed, err: fmt.Errorf("not confirmed: nothing was changed")}
	}
	return nil
}

// dropJSON is the object `sqlease drop --json` prints.
type dropJSON struct {
	Reverted   []migrationJSON `json:"reverted"`
	Dropped    []string        `json:"dropped"` // tables dropped after reverting (those that existed)
	DurationMS float64         `json:"duration_ms"`
}

func setupDrop(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var c dbCmd
	var yes bool
	c.register(fs, "print one JSON object instead of text")
	fs.BoolVar(&yes, "yes", false, "drop without asking (required when stdin is not a terminal)")
	return func(ctx context.Context, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		conn, t, ns, err := c.open(ctx, true)
		if err != nil {
			return err
		}
		defer conn.Close()
		opt := migrate.WithNamespace(ns)
		applied, err := appliedMigrations(ctx, conn, t.dialect, opt)
		if err != nil {
			return err
		}
		var tables []string
		for _, name := range migrate.DropTables(t.dialect) {
			tables = append(tables, ns.Object(t.dialect, name))
		}
		what := "drop tables " + strings.Join(tables, ", ")
		if len(applied) > 0 {
			what = fmt.Sprintf("revert %s (dropping the lock tables with every lease in them) and %s", listNewestFirst(applied), what)
		}
		what += " of " + nsWhere(t, ns)
		// With nothing applied only empty bookkeeping tables can be left.
		if len(applied) > 0 {
			if err := confirm(out, what, yes); err != nil {
				return err
			}
		}
		// Only the tables that exist are dropped and reported: a mistyped
		// --schema or --prefix finds none, and must not read as success.
		var existing []string
		for _, tb := range tables {
			if rows, err := conn.QueryContext(ctx, "SELECT 1 FROM "+tb+" WHERE 1 = 0"); err == nil {
				rows.Close()
				existing = append(existing, tb)
			}
		}
		res := dropJSON{Reverted: []migrationJSON{}, Dropped: append([]string{}, existing...)}
		start := time.Now()
		_, err = migrate.Drop(ctx, conn, t.dialect, opt, migrate.WithProgress(func(r migrate.MigrationResult) {
			res.Reverted = append(res.Reverted, migrationJSON{Version: r.Version, Name: r.Name, DurationMS: ms(r.Duration), Empty: r.Empty})
			if !c.asJSON {
				fmt.Fprintln(out.stdout, resultLine(r))
			}
		}))
		res.DurationMS = ms(time.Since(start))
		if err != nil {
			return err
		}
		if c.asJSON {
			return writeJSON(out.stdout, res)
		}
		if len(applied) == 0 && len(existing) == 0 {
			fmt.Fprintf(out.stdout, "nothing to uninstall: no lock tables of %s (check --schema and --prefix)\n", nsWhere(t, ns))
			return nil
		}
		dropped := "no bookkeeping table"
		if len(existing) > 0 {
			dropped = strings.Join(existing, ", ")
		}
		fmt.Fprintf(out.stdout, "uninstalled in %s: reverted %d migrations and dropped %s (%s); `%s` installs it afresh\n",
			round(time.Since(start)), len(res.Reverted), dropped, nsWhere(t, ns), commandLine("migrate up", c.db.connAdvice(), ns))
		if ns.Schema != "" {
			fmt.Fprintf(out.stdout, "schema %s is kept (it may hold other objects)\n", ns.Schema)
		}
		return nil
	}
}

// commandLine is the sqlease command line to run cmd on the same database
// and namespace: the connection flags as connAdvice gives them (the DSN
// as the placeholder DSN), then --schema and --prefix when given, in the
// order of the advice to migrate (advice.MigrateUpWith).
func commandLine(cmd, connFlags string, ns dialect.Namespace) string {
	line := "sqlease " + cmd
	if connFlags != "" {
		line += " " + connFlags
	}
	if ns.Schema != "" {
		line += " --schema " + ns.Schema
	}
	if ns.Prefix != "" {
		line += " --prefix " + ns.Prefix
	}
	return line
}
