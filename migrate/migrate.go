// Package migrate provisions the sqlease lock tables with goose
// (github.com/pressly/goose/v3), from migrations embedded in each dialect
// (SPEC D1).
//
// The migrations are recorded in a version table of their own,
// "<prefix>db_version" ("sqlease_db_version" by default, in the configured
// schema), never in an application's goose_db_version, and goose's global
// registry is disabled, so an application's own goose migrations never mix
// with these. Up is safe to call from several processes at the same moment:
// on PostgreSQL goose's session advisory lock (one lock ID per version table)
// queues them; on SQLite the database write lock serializes them and a lost
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
	"hash/fnv"
	"io/fs"
	"log/slog"
	"path"
	"strings"
	"testing/fstest"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/sqlease/sqlease/dialect"
)

// Option configures Up, Status, Version and FS.
type Option func(*config)

type config struct {
	ns     dialect.Namespace
	logger *slog.Logger
}

// WithNamespace puts the lock tables and their version table in ns (schema
// and prefix); it must match the namespace the lock.Locker uses (SPEC D3).
func WithNamespace(ns dialect.Namespace) Option { return func(c *config) { c.ns = ns } }

// WithLogger makes goose log applied migrations through l (silent by default).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

func build(d dialect.Dialect, opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if d == nil {
		return c, errors.New("migrate: dialect is nil; pass one, e.g. pgdialect.New() or sqlitedialect.New()")
	}
	if err := c.ns.Validate(d); err != nil {
		return c, fmt.Errorf("migrate: %w", err)
	}
	return c, nil
}

// FS returns d's migrations rendered for the namespace, as goose SQL files
// (NNNNN_name.sql with -- +goose Up/Down annotations), for applications that
// run migrations with their own tool. Errors: a bad namespace (matches
// dialect.ErrInvalidName) or a template marker that does not render.
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

func provider(db *sql.DB, d dialect.Dialect, c config) (*goose.Provider, error) {
	if db == nil {
		return nil, errors.New("migrate: db is nil")
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
	if d.Capabilities().Has(dialect.CapSessionLockedMigrations) {
		h := fnv.New64a()
		h.Write([]byte("sqlease:" + c.ns.VersionTable()))
		sl, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64()>>1)), lock.WithLockTimeout(1, 300))
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		opts = append(opts, goose.WithSessionLocker(sl))
	}
	p, err := goose.NewProvider("", db, fsys, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return p, nil
}

// Up applies every pending migration of d (SPEC D1). With a schema in the
// namespace it first creates the schema if missing. It returns the names of
// the migrations it applied. Errors wrap the database's error; a nil db or
// dialect and a bad namespace are rejected before anything is written.
func Up(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) ([]string, error) {
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, errors.New("migrate: db is nil")
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
		p, err := provider(db, d, c)
		if err != nil {
			return nil, err
		}
		res, err := p.Up(ctx)
		for _, r := range res {
			if r != nil && r.Error == nil && r.Source != nil {
				applied = append(applied, path.Base(r.Source.Path))
			}
		}
		if err == nil {
			return applied, nil
		}
		// Without a session lock (SQLite), a process that lost the race to
		// create the version table or apply a version sees a conflict or
		// "already exists"; by then the winner has done the work.
		if attempt == 0 && !d.Capabilities().Has(dialect.CapSessionLockedMigrations) && lostRace(d, err) {
			continue
		}
		return applied, fmt.Errorf("migrate: up %s: %w", d.Name(), err)
	}
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

// Status lists every migration of d and whether it is applied. A database
// without the version table reports every migration as pending.
func Status(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) ([]MigrationStatus, error) {
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	p, err := provider(db, d, c)
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
func Version(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) (current, want int64, err error) {
	c, err := build(d, opts)
	if err != nil {
		return 0, 0, err
	}
	p, err := provider(db, d, c)
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
