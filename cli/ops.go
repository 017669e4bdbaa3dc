package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/advice"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// migrationJSON is one migration in `sqlease migrate --json` output.
type migrationJSON struct {
	Version    int64   `json:"version"`
	Name       string  `json:"name"`
	Applied    *bool   `json:"applied,omitempty"`     // migrate status
	DurationMS float64 `json:"duration_ms,omitempty"` // migrate up and down
	Empty      bool    `json:"empty,omitempty"`
}

// migrateJSON is the object `sqlease migrate [up|status|down] --json`
// prints.
type migrateJSON struct {
	Action       string          `json:"action"`  // up, status or down
	Version      int64           `json:"version"` // the applied version afterwards
	Latest       int64           `json:"latest"`  // the newest migration known
	VersionTable string          `json:"version_table"`
	Migrations   []migrationJSON `json:"migrations"` // applied, reverted, or all (status)
	DurationMS   float64         `json:"duration_ms"`
}

// migrateStatusExit documents the exit code of migrate status, in
// `sqlease help migrate`.
const migrateStatusExit = `migrate status only reports: it exits 0 whether the database is up to
date, has migrations pending or is newer than this build, and its last line
says which (with --json: pending when "version" < "latest"). The commands
that use the lock tables (status, sweep) exit 2 while they are not migrated.`

func setupMigrate(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var c dbCmd
	var yes bool
	c.register(fs, "print one JSON object instead of text")
	fs.BoolVar(&yes, "yes", false, "down: revert without asking (required when stdin is not a terminal)")
	return func(ctx context.Context, args []string) error {
		action := "up"
		if len(args) > 0 {
			action = args[0]
		}
		if len(args) > 1 {
			return argErr("unexpected argument %q", args[1])
		}
		if action != "up" && action != "status" && action != "down" {
			return argErr("unknown action %q: want up, status or down", action)
		}
		// up may create a SQLite file; status and down only use an
		// existing one.
		conn, t, ns, err := c.open(ctx, action != "up")
		if err != nil {
			return err
		}
		defer conn.Close()
		opt := migrate.WithNamespace(ns)
		res := migrateJSON{Action: action, VersionTable: ns.VersionTable(), Migrations: []migrationJSON{}}
		switch action {
		case "status":
			st, err := migrate.Status(ctx, conn, t.dialect, opt)
			if err != nil {
				return err
			}
			if res.Version, res.Latest, err = migrate.Version(ctx, conn, t.dialect, opt); err != nil {
				return err
			}
			if c.asJSON {
				for _, s := range st {
					res.Migrations = append(res.Migrations, migrationJSON{Version: s.Version, Name: s.Name, Applied: &s.Applied})
				}
				return writeJSON(out.stdout, res)
			}
			tw := tabwriter.NewWriter(out.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED")
			for _, s := range st {
				applied := "no"
				if s.Applied {
					applied = "yes"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Version, s.Name, applied)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			switch {
			case res.Version == res.Latest:
				fmt.Fprintf(out.stdout, "database at version %d of %d: up to date (table %s)\n", res.Version, res.Latest, res.VersionTable)
			case res.Version < res.Latest:
				caution, elsewhere := "", ""
				if res.Version == 0 {
					found := lockTablesElsewhere(ctx, conn, t.dialect, ns)
					if found != "" {
						elsewhere = found + " If not, "
					}
					caution = advice.Caution(ns, found != "")
				}
				fmt.Fprintf(out.stdout, "database at version %d of %d: %s%s (table %s)%s\n", res.Version, res.Latest, elsewhere, advice.MigrateUpWith(ns, c.db.connAdvice()), res.VersionTable, caution)
			default:
				fmt.Fprintf(out.stdout, "database at version %d, newer than this build's %d: upgrade sqlease (table %s)\n", res.Version, res.Latest, res.VersionTable)
			}
			return nil
		case "down":
			applied, err := appliedMigrations(ctx, conn, t.dialect, opt)
			if err != nil {
				return err
			}
			if len(applied) > 0 {
				what := fmt.Sprintf("revert %s, dropping the lock tables of %s with every lease in them", listNewestFirst(applied), nsWhere(t, ns))
				if err := confirm(out, what, yes); err != nil {
					return err
				}
			}
		}
		progress := func(r migrate.MigrationResult) {
			res.Migrations = append(res.Migrations, migrationJSON{Version: r.Version, Name: r.Name, DurationMS: ms(r.Duration), Empty: r.Empty})
			if !c.asJSON {
				fmt.Fprintln(out.stdout, resultLine(r))
			}
		}
		start := time.Now()
		var done []string
		if action == "up" {
			done, err = migrate.Up(ctx, conn, t.dialect, opt, migrate.WithProgress(progress))
		} else {
			done, err = migrate.Down(ctx, conn, t.dialect, opt, migrate.WithProgress(progress))
		}
		res.DurationMS = ms(time.Since(start))
		if err != nil {
			return err
		}
		if res.Version, res.Latest, err = migrate.Version(ctx, conn, t.dialect, opt); err != nil {
			return err
		}
		if c.asJSON {
			return writeJSON(out.stdout, res)
		}
		switch {
		case action == "down" && len(done) == 0:
			fmt.Fprintf(out.stdout, "nothing to revert (version 0, table %s)\n", res.VersionTable)
		case action == "down":
			fmt.Fprintf(out.stdout, "reverted %d migrations in %s: now at version %d (table %s kept; `sqlease drop` removes it too)\n", len(done), round(time.Since(start)), res.Version, res.VersionTable)
		case len(done) == 0:
			fmt.Fprintf(out.stdout, "already up to date (version %d, table %s)\n", res.Version, res.VersionTable)
		default:
			fmt.Fprintf(out.stdout, "migrated to version %d in %s (table %s)\n", res.Version, round(time.Since(start)), res.VersionTable)
		}
		return nil
	}
}

// resultLine renders one migration result as goose does:
// "OK   00001_lock_tables.sql (12.34ms)".
func resultLine(r migrate.MigrationResult) string {
	state := "OK"
	if r.Empty {
		state = "EMPTY"
	}
	return fmt.Sprintf("%-4s %s (%s)", state, r.Name, round(r.Duration))
}

// round shortens a duration for display as goose does: 12.34ms, 1.2s.
func round(d time.Duration) time.Duration {
	for _, v := range []time.Duration{time.Second, time.Millisecond, time.Microsecond} {
		if d > v {
			return d.Round(v / 100)
		}
	}
	return d
}

// ms is d in milliseconds, for JSON.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// writeJSON prints v as one JSON object on a line.
func writeJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// appliedMigrations lists the names of the applied migrations, oldest
// first.
func appliedMigrations(ctx context.Context, db *sql.DB, d dialect.Dialect, opt migrate.Option) ([]string, error) {
	st, err := migrate.Status(ctx, db, d, opt)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range st {
		if s.Applied {
			names = append(names, s.Name)
		}
	}
	return names, nil
}

// listNewestFirst renders migration names newest first, as they are
// reverted.
func listNewestFirst(names []string) string {
	rev := make([]string, len(names))
	for i, n := range names {
		rev[len(names)-1-i] = n
	}
	return "migrations " + strings.Join(rev, ", ")
}

// nsWhere names a namespace for a message: "schema locks (prefix
// sqlease_) of the postgres database".
func nsWhere(t target, ns dialect.Namespace) string {
	prefix := ns.Prefix
	if prefix == "" {
		prefix = dialect.DefaultPrefix
	}
	s := "prefix " + prefix
	if ns.Schema != "" {
		s = "schema " + ns.Schema + ", " + s
	}
	where := t.dialect.Name() + " database"
	if t.file != "" {
		where += " " + t.file
	}
	return s + " in the " + where
}

// holderJSON is one line of `sqlease status --json`.
type holderJSON struct {
	Key           string `json:"key"`
	Mode          string `json:"mode"`
	Owner         string `json:"owner"`
	LeaseID       string `json:"lease_id"`
	Token         int64  `json:"token"`
	ExpiresAt     string `json:"expires_at"`
	ExpiresInMS   int64  `json:"expires_in_ms"`
	Expired       bool   `json:"expired"`
	PendingWriter bool   `json:"pending_writer"`
	// QueuePosition is a live FIFO ticket's place in its key's queue (1 is
	// next); 0 for every other row, an expired ticket included.
	QueuePosition int `json:"queue_position"`
}

// statusModes documents the MODE column of `sqlease status`, in `sqlease
// help status`.
const statusModes = `MODE is exclusive or shared for a lease, pending-writer for a waiting
writer's marker (it holds nothing and has no token), or queued for a FIFO
waiter's ticket (lock.FIFO): it holds nothing, its TOKEN is "-" and QUEUE
is its place in the key's queue (1 is next; "-" for every other row and
for an expired ticket). With --json, "token" of a queued row is the
ticket's sequence number, which orders the queue, and "queue_position"
its place.`

// queuePositions returns the place (1 is next) of each live FIFO ticket
// in its key's queue, by index into hs: tickets are ordered by their
// sequence number (Holder.Token).
func queuePositions(hs []lock.Holder, now time.Time) map[int]int {
	byKey := map[string][]int{}
	for i, h := range hs {
		if h.Mode == lock.Queued && h.Expiry.After(now) {
			byKey[h.Key] = append(byKey[h.Key], i)
		}
	}
	pos := map[int]int{}
	for _, idx := range byKey {
		sort.Slice(idx, func(a, b int) bool { return hs[idx[a]].Token < hs[idx[b]].Token })
		for p, i := range idx {
			pos[i] = p + 1
		}
	}
	return pos
}

func setupStatus(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var c dbCmd
	var keyPrefix string
	c.register(fs, "print one JSON object per lease or marker, one a line, instead of a table")
	fs.StringVar(&keyPrefix, "key", "", "list only keys starting with `PREFIX` (valid UTF-8 without NUL, at most 512 bytes)")
	return func(ctx context.Context, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if err := lock.CheckKeyPrefix(keyPrefix); err != nil {
			return inputUsageErr(err)
		}
		l, closeAll, err := c.locker(ctx)
		if err != nil {
			return err
		}
		defer closeAll()
		holders, now, err := l.Holders(ctx, keyPrefix)
		if err != nil {
			return err
		}
		pos := queuePositions(holders, now)
		if c.asJSON {
			enc := json.NewEncoder(out.stdout)
			for i, h := range holders {
				if err := enc.Encode(newHolderJSON(h, now, pos[i])); err != nil {
					return err
				}
			}
			return nil
		}
		if err := holdersTable(out.stdout, holders, now, pos); err != nil {
			return err
		}
		if len(holders) == 0 {
			fmt.Fprintln(out.stdout, "(no leases or pending writers)")
		}
		return nil
	}
}

// newHolderJSON is h as `sqlease status --json` prints it, at the
// database time now, with its place pos in its key's FIFO queue (0: none).
func newHolderJSON(h lock.Holder, now time.Time, pos int) holderJSON {
	in := h.Expiry.Sub(now)
	return holderJSON{
		Key: h.Key, Mode: h.Mode.String(), Owner: h.Owner, LeaseID: h.LeaseID, Token: h.Token,
		ExpiresAt:   h.Expiry.UTC().Format(time.RFC3339Nano),
		ExpiresInMS: in.Milliseconds(), Expired: in <= 0,
		PendingWriter: h.Mode == lock.PendingWriter,
		QueuePosition: pos,
	}
}

// holdersTable writes the table of `sqlease status`: holders at the
// database time now, with their places in FIFO queues by index (pos, nil
// for none).
func holdersTable(w io.Writer, holders []lock.Holder, now time.Time, pos map[int]int) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODE\tOWNER\tLEASE ID\tTOKEN\tQUEUE\tEXPIRES IN")
	for i, h := range holders {
		token, queue := fmt.Sprint(h.Token), "-"
		if h.Mode == lock.PendingWriter || h.Mode == lock.Queued {
			// Neither holds a lease: no fencing token. A ticket's
			// Token only orders the queue; its place is QUEUE.
			token = "-"
		}
		if p := pos[i]; p > 0 {
			queue = fmt.Sprint(p)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(h.Key), h.Mode, cell(h.Owner), h.LeaseID, token, queue, expiresIn(h.Expiry.Sub(now)))
	}
	return tw.Flush()
}

// cell returns s as is when it prints plainly in a table cell, else
// Go-quoted (spaces, tabs, control characters, quotes).
func cell(s string) string {
	if q := strconv.Quote(s); s != "" && q == `"`+s+`"` && !strings.ContainsAny(s, " ") {
		return s
	}
	return strconv.Quote(s)
}

// expiresIn renders the time left of a lease; expired rows (not yet swept)
// show a negative duration.
func expiresIn(d time.Duration) string {
	d = d.Round(time.Millisecond)
	if d <= 0 {
		return d.String() + " (expired)"
	}
	return d.String()
}

// sweepJSON is the object `sqlease sweep --json` prints.
type sweepJSON struct {
	Swept int64 `json:"swept"`
	Limit int   `json:"limit"`
	// RowsBefore and RowsAfter count every row of the lock tables
	// (Locker.RowCount): the sweep also removes expired markers, FIFO
	// tickets and idle per-key rows, which Swept leaves out. Other
	// replicas' work between the counts moves them too.
	// Both are 0 when the dialect cannot count its rows.
	RowsBefore int64 `json:"rows_before"`
	RowsAfter  int64 `json:"rows_after"`
}

// rowCount is l.RowCount, with ok false when the dialect cannot count.
func rowCount(ctx context.Context, l *lock.Locker) (n int64, ok bool, err error) {
	n, err = l.RowCount(ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		return 0, false, nil
	}
	return n, err == nil, err
}

func setupSweep(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var c dbCmd
	var limit int
	c.register(fs, "print one JSON object instead of text")
	fs.IntVar(&limit, "limit", 1000, "delete at most `N` expired lease rows")
	return func(ctx context.Context, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if limit < 1 {
			return usageErr("--limit must be at least 1, got %d", limit)
		}
		l, closeAll, err := c.locker(ctx)
		if err != nil {
			return err
		}
		defer closeAll()
		before, counted, err := rowCount(ctx, l)
		if err != nil {
			return err
		}
		n, err := l.Sweep(ctx, limit)
		if err != nil {
			return err
		}
		after, _, err := rowCount(ctx, l)
		if err != nil {
			return err
		}
		if c.asJSON {
			return writeJSON(out.stdout, sweepJSON{Swept: n, Limit: limit, RowsBefore: before, RowsAfter: after})
		}
		fmt.Fprintf(out.stdout, "swept %d expired lease rows (limit %d)", n, limit)
		if counted {
			fmt.Fprintf(out.stdout, "; the lock tables went from %d to %d rows (expired markers, FIFO tickets and idle per-key rows go too)", before, after)
		}
		fmt.Fprintln(out.stdout)
		return nil
	}
}
