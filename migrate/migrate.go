// Package migrate provisions the sqlease lock tables with goose
// (github.com/pressly/goose/v3), from migrations embedded in each dialect
// (SPEC D1; rules are those of docs/contract.md in the repository).
//
// The migrations are recorded in a version table of their own,
// "<prefix>db_version" ("sqlease_db_version" by default, in the configured
// schema), never in an application's goose_db_version, and goose's global
// registry is disabled, so an application's own goose migrations never mix
// with these. Up is safe to call from several processes at the same moment:
// a dialect that implements dialect.MigrationLocker queues them through
// goose.WithLocker (PostgreSQL: a row in the namespace's
// "<prefix>migration_lock" table, which works through PgBouncer in
// transaction pooling mode; MySQL: goose's table locker, one lock table per
// namespace); on SQLite the database write lock serializes them and a lost
// creation race is retried once.
//
//	applied, err := migrate.Up(ctx, db, pgdialect.New(),
//		migrate.WithNamespace(dialect.Namespace{Schema: "locks"})) // as lock.WithSchema("locks")
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"strings"
	"testing/fstest"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/sqlease/sqlease/dialect"
)

// Option configures Up, Status, Version and FS.
type Option func(*config)

type config struct {
	ns       dialect.Namespace
	logger   *slog.Logger
	progress func(MigrationResult)
}

// WithNamespace puts the lock tables and their version table in ns (schema
// and prefix); it must match the namespace the lock.Locker uses (SPEC D3).
func WithNamespace(ns dialect.Namespace) Option { return func(c *config) { c.ns = ns } }

// WithLogger makes goose log applied migrations through l (silent by default).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithProgress makes Up, Down and Drop call f once for every migration they
// applied or reverted, in the order goose ran them, after the run (goose
// reports the results together). The sqlease tool prints goose-style
// "OK   00001_lock_tables.sql (12.3ms)" lines from them.
func WithProgress(f func(MigrationResult)) Option { return func(c *config) { c.progress = f } }

// MigrationResult is the outcome of one migration that Up applied or Down
// reverted, as goose reports it.
type MigrationResult struct {
	// Version is the migration's version number (1 for 00001_...).
	Version int64
	// Name is the migration's file name, e.g. "00001_lock_tables.sql".
	Name string
	// Direction is "up" (applied) or "down" (reverted).
	Direction string
	// Duration is how long the migration's statements ran.
	Duration time.Duration
	// Empty is true when the migration had no statements to run in this
	// direction (it was still recorded).
	Empty bool
}

// collect turns goose's results into names (of the migrations that
// succeeded) and reports each to the WithProgress function.
func (c config) collect(res []*goose.MigrationResult) []string {
	var names []string
	for _, r := range res {
		if r == nil || r.Error != nil || r.Source == nil {
			continue
		}
		name := path.Base(r.Source.Path)
		names = append(names, name)
		if c.progress != nil {
			c.progress(MigrationResult{Version: r.Source.Version, Name: name, Direction: r.Direction, Duration: r.Duration, Empty: r.Empty})
		}
	}
	return names
}

func build(d dialect.Dialect, opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if d == nil {
		return c, &dialect.InputError{Pkg: "migrate", Field: "dialect", Value: "nil", Allowed: "pass one, e.g. pgdialect.New() or sqlitedialect.New()"}
	}
	if err := c.ns.Validate(d); err != nil {
		return c, dialect.Relabel(err, "migrate")
	}
	return c, nil
}

// resolve returns d, or when d is nil the registered dialect that claims
// db's driver (dialect.Detect), as lock.New does.
func resolve(db *sql.DB, d dialect.Dialect) (dialect.Dialect, error) {
	if db == nil {
		return nil, errNilDB
	}
	if d != nil {
		return d, nil
	}
	d, err := dialect.Detect(db)
	if err != nil {
		return nil, dialect.Relabel(err, "migrate")
	}
	return d, nil
}

var errNilDB = &dialect.InputError{Pkg: "migrate", Field: "database", Value: "nil", Allowed: "pass an open *sql.DB"}

// FS returns d's migrations rendered for the namespace, as goose SQL files
// (NNNNN_name.sql with -- +goose Up/Down annotations), for applications that
// run migrations with their own tool. Errors: a nil d or a bad namespace
// (an *dialect.InputError matching dialect.ErrInvalidInput, and
// dialect.ErrInvalidName for the namespace) or a template marker that does
// not render.
func FS(d dialect.Dialect, opts ...Option) (fs.FS, error) {
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	return render(d, c.ns)
}

func render(d dialect.Dialect, ns dialect.Namespace) (fs.FS, error) {
	out := fstest.MapFS{}
	src := d.Migrations()
	err := fs.WalkDir(src, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || path.Ext(p) != ".sql" {
			return err
		}
		b, err := fs.ReadFile(src, p)
		if err != nil {
			return err
		}
		text, err := ns.RenderNames(d, string(b))
		if err != nil {
			return fmt.Errorf("migrate: %s: %w", p, err)
		}
		out[path.Base(p)] = &fstest.MapFile{Data: []byte(text), Mode: 0o444}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("migrate: dialect %q has no migrations", d.Name())
	}
	return out, nil
}

// versionTableExists probes the version table with a query that reads no
// row, so reading a version never creates it (goose would). The dialect
// classifies the error of a missing table.
func versionTableExists(ctx context.Context, db *sql.DB, d dialect.Dialect, c config) (bool, error) {
	q := "SELECT 1 FROM " + c.ns.Object(d, "db_version") + " WHERE 1 = 0"
	rows, err := db.QueryContext(ctx, q)
	if err == nil {
		return true, rows.Close()
	}
	if d.Classify(err) == dialect.ErrorUndefinedTable {
		return false, nil
	}
	return false, fmt.Errorf("migrate: look for version table %s: %w", c.ns.VersionTable(), err)
}

// provider builds the goose provider. With locked, concurrent runs are
// serialized (Up); reads (Status, Version) take no lock, so they write
// nothing and never wait for a running Up.
func provider(db *sql.DB, d dialect.Dialect, c config, locked bool) (*goose.Provider, error) {
	if db == nil {
		return nil, errNilDB
	}
	fsys, err := render(d, c.ns)
	if err != nil {
		return nil, err
	}
	store, err := database.NewStore(database.Dialect(d.GooseDialect()), c.ns.VersionTable())
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	opts := []goose.ProviderOption{
		goose.WithStore(store),
		goose.WithDisableGlobalRegistry(true),
	}
	if c.logger != nil {
		opts = append(opts, goose.WithSlog(c.logger), goose.WithVerbose(true))
	}
	ml, hasLocker := d.(dialect.MigrationLocker)
	switch {
	case !locked:
	case hasLocker:
		l, err := ml.MigrationLocker(c.ns)
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		opts = append(opts, goose.WithLocker(l))
	}
	p, err := goose.NewProvider("", db, fsys, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return p, nil
}

// Up applies every pending migration of d (SPEC D1); a nil d is detected
// from db's driver among registered dialects, as lock.New does. With a
// schema in the namespace it first creates the schema if missing. It
// returns the names of the migrations it applied. Errors wrap the
// database's error; a nil db, a driver no registered dialect claims, a bad
// namespace, and a pool limited to one connection for a dialect with a
// dialect.MigrationLocker (the lock needs a second one) are rejected before
// anything is written, with an *dialect.InputError matching
// dialect.ErrInvalidInput (= lock.ErrInvalidInput; rule I1). A read-only
// replica is refused before anything is written too, with a
// *dialect.ServerError matching dialect.ErrReadOnly (rule S7).
func Up(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) ([]string, error) {
	d, err := resolve(db, d)
	if err != nil {
		return nil, err
	}
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	// Every check comes before the first write.
	if err := checkPool(db, d, "Up"); err != nil {
		return nil, err
	}
	if err := dialect.CheckPrimary(ctx, db, d, "migrate"); err != nil {
		return nil, err
	}
	if pc, ok := d.(dialect.MigrationPoolChecker); ok {
		if err := pc.CheckMigrationPool(ctx, db); err != nil {
			if errors.Is(err, dialect.ErrInvalidInput) {
				return nil, dialect.Relabel(err, "migrate")
			}
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	if c.ns.Schema != "" {
		q := "CREATE SCHEMA IF NOT EXISTS " + d.QuoteIdent(c.ns.Schema)
		if _, err := db.ExecContext(ctx, q); err != nil {
			// Two sessions racing on CREATE SCHEMA IF NOT EXISTS can still
			// collide on the catalog's unique index; the loser retries.
			if d.Classify(err) != dialect.ErrorConflict {
				return nil, fmt.Errorf("migrate: create schema %q: %w", c.ns.Schema, err)
			}
			if _, err := db.ExecContext(ctx, q); err != nil {
				return nil, fmt.Errorf("migrate: create schema %q: %w", c.ns.Schema, err)
			}
		}
	}
	var applied []string
	for attempt := 0; ; attempt++ {
		p, err := provider(db, d, c, true)
		if err != nil {
			return nil, err
		}
		res, err := p.Up(ctx)
		if pe := (*goose.PartialError)(nil); errors.As(err, &pe) {
			res = pe.Applied // goose returns no results with a failure
		}
		applied = append(applied, c.collect(res)...)
		if err == nil {
			return applied, nil
		}
		// Without a migration lock (SQLite), a process that lost the race
		// to create the version table or apply a version sees a conflict or
		// "already exists"; by then the winner has done that version, and
		// the next run goes on from it. It can lose once per version, so
		// the retries are bounded by the number of migrations (each lost
		// race means another process made progress).
		if attempt < maxLostRaces && !locked(d) && lostRace(d, err) {
			continue
		}
		// goose read the version table of a concurrent creator before its
		// zero version row was visible (seen once on MariaDB under the
		// migration lock); a second run reads it again.
		if attempt == 0 && strings.Contains(err.Error(), "missing zero version") {
			continue
		}
		return applied, fmt.Errorf("migrate: up %s: %w", d.Name(), err)
	}
}

// maxLostRaces bounds Up's reruns after losing a race to a concurrent Up
// on a dialect without a migration lock: one per migration, with room.
const maxLostRaces = 32

// locked reports whether concurrent Up calls on d queue behind a lock.
func locked(d dialect.Dialect) bool {
	_, ok := d.(dialect.MigrationLocker)
	return ok
}

func lostRace(d dialect.Dialect, err error) bool {
	if c := d.Classify(err); c == dialect.ErrorConflict || c == dialect.ErrorRetryable {
		return true
	}
	return strings.Contains(err.Error(), "already exists")
}

// MigrationStatus is the state of one migration.
type MigrationStatus struct {
	Version int64
	Name    string
	Applied bool
}

// Status lists every migration of d (nil: detected from db, as Up) and
// whether it is applied. A database without the version table reports
// every migration as pending. Errors as Up.
func Status(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) ([]MigrationStatus, error) {
	d, err := resolve(db, d)
	if err != nil {
		return nil, err
	}
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	p, err := provider(db, d, c, false)
	if err != nil {
		return nil, err
	}
	current, _, err := versions(ctx, db, p, d, c)
	if err != nil {
		return nil, err
	}
	var out []MigrationStatus
	for _, s := range p.ListSources() {
		out = append(out, MigrationStatus{Version: s.Version, Name: path.Base(s.Path), Applied: s.Version <= current})
	}
	return out, nil
}

// Version returns the applied (current) and the latest known (want)
// migration versions; current is 0 when the version table does not exist.
// A nil d is detected from db, as Up. Errors as Up.
func Version(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) (current, want int64, err error) {
	d, err = resolve(db, d)
	if err != nil {
		return 0, 0, err
	}
	c, err := build(d, opts)
	if err != nil {
		return 0, 0, err
	}
	p, err := provider(db, d, c, false)
	if err != nil {
		return 0, 0, err
	}
	return versions(ctx, db, p, d, c)
}

// versions reads the applied and latest versions without writing: a
// missing version table means version 0.
func versions(ctx context.Context, db *sql.DB, p *goose.Provider, d dialect.Dialect, c config) (int64, int64, error) {
	var want int64
	for _, s := range p.ListSources() {
		want = max(want, s.Version)
	}
	if exists, err := versionTableExists(ctx, db, d, c); err != nil {
		return 0, want, err
	} else if !exists {
		return 0, want, nil
	}
	current, err := p.GetDBVersion(ctx)
	if err != nil {
		if d.Classify(err) == dialect.ErrorUndefinedTable || strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "no such table") {
			return 0, want, nil
		}
		return 0, want, fmt.Errorf("migrate: read version: %w", err)
	}
	return current, want, nil
}

// checkPool rejects, with an *dialect.InputError matching ErrInvalidInput,
// a pool of one connection for a dialect whose migration lock needs a
// second one; callers run it before their first write.
func checkPool(db *sql.DB, d dialect.Dialect, op string) error {
	if _, ok := d.(dialect.MigrationLocker); ok && db.Stats().MaxOpenConnections == 1 {
		// goose keeps one connection for the migrations while the lock's
		// statements need another: with one, the call would wait forever.
		return &dialect.InputError{Pkg: "migrate", Field: "pool size", Value: "1 open connection (SetMaxOpenConns(1))",
			Allowed: fmt.Sprintf("%s on dialect %q needs 2 (one runs the migrations, one holds the migration lock): allow at least 2 for the call", op, d.Name())}
	}
	return nil
}

// Down reverts every applied migration of d (goose's DownTo(0)), newest
// first, under the same migration lock as Up (SPEC D1), and returns the
// names of the migrations it reverted. It removes the lock tables and
// everything in them: every lease and pending writer of the namespace is
// gone, so run it only when no process uses the namespace. The version
// table (now at version 0) and the migration lock table are kept; Drop
// removes them too. A namespace never migrated (no version table) is left
// as it is, without error. A nil d is detected from db, as Up. Errors as
// Up; a migration that fails to revert stops the run, wrapped in the error,
// after the names of those reverted before it.
func Down(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) ([]string, error) {
	d, err := resolve(db, d)
	if err != nil {
		return nil, err
	}
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	return down(ctx, db, d, c)
}

func down(ctx context.Context, db *sql.DB, d dialect.Dialect, c config) ([]string, error) {
	if err := checkPool(db, d, "Down"); err != nil {
		return nil, err
	}
	// goose would create the version table to find nothing to revert.
	if exists, err := versionTableExists(ctx, db, d, c); err != nil || !exists {
		return nil, err
	}
	p, err := provider(db, d, c, true)
	if err != nil {
		return nil, err
	}
	res, err := p.DownTo(ctx, 0)
	reverted := c.collect(res)
	if err != nil {
		return reverted, fmt.Errorf("migrate: down %s: %w", d.Name(), err)
	}
	return reverted, nil
}

// Drop uninstalls sqlease from the namespace: it reverts every applied
// migration as Down does, then drops the version table and, for a dialect
// whose migration lock lives in a table of the namespace
// (dialect.MigrationLockTabler: PostgreSQL's "<prefix>migration_lock",
// MySQL's "<prefix>migrate_lock"), that table. Afterwards nothing of the
// namespace is left and Up installs it afresh (SPEC D1). It returns the
// names of the reverted migrations. The schema itself is kept: Up creates
// it only when missing, and it may hold other objects; drop it yourself
// when it is empty. Every lease in the namespace is lost: run Drop only
// when no process uses it, and not while another process runs Up (the
// version table is dropped after the migration lock is released). Calling
// it on a namespace already dropped or never migrated does nothing. A nil
// d is detected from db, as Up. Errors as Down, and the database's error
// when a table cannot be dropped.
func Drop(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) ([]string, error) {
	d, err := resolve(db, d)
	if err != nil {
		return nil, err
	}
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	reverted, err := down(ctx, db, d, c)
	if err != nil {
		return reverted, err
	}
	for _, name := range DropTables(d) {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+c.ns.Object(d, name)); err != nil {
			return reverted, fmt.Errorf("migrate: drop table %s: %w", c.ns.Object(d, name), err)
		}
	}
	return reverted, nil
}

// DropTables names the tables Drop removes after reverting the
// migrations, without the namespace's prefix and schema: "db_version" (the
// version table) and the migration lock's table of a dialect that
// implements dialect.MigrationLockTabler. Render a name with
// ns.Object(d, name). For d nil it returns only "db_version".
func DropTables(d dialect.Dialect) []string {
	names := []string{"db_version"}
	if lt, ok := d.(dialect.MigrationLockTabler); ok {
		if name := lt.MigrationLockTable(); name != "" {
			names = append(names, name)
		}
	}
	return names
}
