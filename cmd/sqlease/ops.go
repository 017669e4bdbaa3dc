package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

func setupMigrate(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var db dbFlags
	var ns nsFlags
	db.register(fs)
	ns.register(fs)
	return func(ctx context.Context, args []string) error {
		action := "up"
		if len(args) > 0 {
			action = args[0]
		}
		if len(args) > 1 {
			return usageErr("unexpected argument %q", args[1])
		}
		if action != "up" && action != "status" {
			return usageErr("unknown action %q: want up or status", action)
		}
		// up may create a SQLite file; status only reads an existing one.
		conn, t, err := open(ctx, &db, action == "status")
		if err != nil {
			return err
		}
		defer conn.Close()
		n := ns.namespace()
		if err := n.Validate(t.dialect); err != nil {
			return usageErr("%v", err)
		}
		opt := migrate.WithNamespace(n)
		if action == "status" {
			st, err := migrate.Status(ctx, conn, t.dialect, opt)
			if err != nil {
				return err
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
			return tw.Flush()
		}
		applied, err := migrate.Up(ctx, conn, t.dialect, opt)
		for _, name := range applied {
			fmt.Fprintf(out.stdout, "applied %s\n", name)
		}
		if err != nil {
			return err
		}
		current, _, err := migrate.Version(ctx, conn, t.dialect, opt)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintf(out.stdout, "already up to date (version %d, table %s)\n", current, n.VersionTable())
		} else {
			fmt.Fprintf(out.stdout, "now at version %d (table %s)\n", current, n.VersionTable())
		}
		return nil
	}
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
}

func setupStatus(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var db dbFlags
	var ns nsFlags
	var keyPrefix string
	var asJSON bool
	db.register(fs)
	ns.register(fs)
	fs.StringVar(&keyPrefix, "key", "", "list only keys starting with `PREFIX`")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object per line instead of a table")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usageErr("unexpected argument %q", args[0])
		}
		conn, t, err := open(ctx, &db, true)
		if err != nil {
			return err
		}
		defer conn.Close()
		l, err := newLocker(ctx, conn, t, ns.namespace())
		if err != nil {
			return err
		}
		defer l.Close(context.WithoutCancel(ctx))
		holders, now, err := l.Holders(ctx, keyPrefix)
		if err != nil {
			return err
		}
		if asJSON {
			enc := json.NewEncoder(out.stdout)
			for _, h := range holders {
				in := h.Expiry.Sub(now)
				if err := enc.Encode(holderJSON{
					Key: h.Key, Mode: h.Mode.String(), Owner: h.Owner, LeaseID: h.LeaseID, Token: h.Token,
					ExpiresAt:   h.Expiry.UTC().Format(time.RFC3339Nano),
					ExpiresInMS: in.Milliseconds(), Expired: in <= 0,
					PendingWriter: h.Mode == lock.PendingWriter,
				}); err != nil {
					return err
				}
			}
			return nil
		}
		tw := tabwriter.NewWriter(out.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tMODE\tOWNER\tLEASE ID\tTOKEN\tEXPIRES IN")
		for _, h := range holders {
			token := fmt.Sprint(h.Token)
			if h.Mode == lock.PendingWriter {
				token = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", cell(h.Key), h.Mode, cell(h.Owner), h.LeaseID, token, expiresIn(h.Expiry.Sub(now)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(holders) == 0 {
			fmt.Fprintln(out.stdout, "(no leases or pending writers)")
		}
		return nil
	}
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

func setupSweep(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var db dbFlags
	var ns nsFlags
	var limit int
	db.register(fs)
	ns.register(fs)
	fs.IntVar(&limit, "limit", 1000, "delete at most `N` expired lease rows")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usageErr("unexpected argument %q", args[0])
		}
		if limit < 1 {
			return usageErr("--limit must be at least 1, got %d", limit)
		}
		conn, t, err := open(ctx, &db, true)
		if err != nil {
			return err
		}
		defer conn.Close()
		l, err := newLocker(ctx, conn, t, ns.namespace())
		if err != nil {
			return err
		}
		defer l.Close(context.WithoutCancel(ctx))
		n, err := l.Sweep(ctx, limit)
		if err != nil {
			return err
		}
		fmt.Fprintf(out.stdout, "swept %d expired lease rows (limit %d)\n", n, limit)
		return nil
	}
}
