package migrate_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Up with a nil dialect detects it from the driver, as lock.New does.
func TestUpDetectsDialect(t *testing.T) {
	db := openSQLite(t)
	applied, err := migrate.Up(t.Context(), db, nil)
	if err != nil || len(applied) == 0 {
		t.Fatalf("Up(ctx, db, nil) = %v, %v; want the migrations applied", applied, err)
	}
	current, want, err := migrate.Version(t.Context(), db, nil)
	if err != nil || current != want {
		t.Fatalf("Version(ctx, db, nil) = %d, %d, %v; want current == want", current, want, err)
	}
}

// Bad input to migrate is the same error as bad input to lock: one
// *InputError, matching lock.ErrInvalidInput, dialect.ErrInvalidInput and
// (for names) dialect.ErrInvalidName, with one "migrate:" prefix (SPEC I1).
func TestBadInputMatchesEverywhere(t *testing.T) {
	db := openSQLite(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		run    func() error
		isName bool
		wants  []string
	}{
		{"nil db", func() error { _, err := migrate.Up(ctx, nil, sqlitedialect.New()); return err }, false, []string{"database nil"}},
		{"bad schema name", func() error {
			_, err := migrate.Up(ctx, db, sqlitedialect.New(), migrate.WithNamespace(dialect.Namespace{Prefix: "Bad;Prefix"}))
			return err
		}, true, []string{`prefix "Bad;Prefix"`, "lower-case letters"}},
		{"schema on sqlite", func() error {
			_, err := migrate.Status(ctx, db, nil, migrate.WithNamespace(dialect.Namespace{Schema: "locks"}))
			return err
		}, true, []string{`schema "locks"`, "no schemas"}},
		{"nil dialect for FS", func() error { _, err := migrate.FS(nil); return err }, false, []string{"dialect nil"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil {
				t.Fatal("want an error")
			}
			var ie *lock.InputError
			if !errors.Is(err, lock.ErrInvalidInput) || !errors.Is(err, dialect.ErrInvalidInput) || !errors.As(err, &ie) {
				t.Errorf("%v: want a *lock.InputError matching lock.ErrInvalidInput and dialect.ErrInvalidInput", err)
			}
			if got := errors.Is(err, dialect.ErrInvalidName); got != tc.isName {
				t.Errorf("%v: errors.Is(err, dialect.ErrInvalidName) = %v, want %v", err, got, tc.isName)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "migrate: invalid ") || strings.Count(msg, "migrate:")+strings.Count(msg, "dialect:") != 1 {
				t.Errorf("message %q: want one prefix, migrate:", msg)
			}
			for _, w := range tc.wants {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q: want it to mention %q", msg, w)
				}
			}
		})
	}
	// Nothing was written: the database has no version table yet, and a
	// correct call still works.
	if current, _, err := migrate.Version(ctx, db, nil); err != nil || current != 0 {
		t.Fatalf("Version after bad input = %d, %v; want 0, nil", current, err)
	}
	if _, err := migrate.Up(ctx, db, nil); err != nil {
		t.Fatalf("Up after bad input: %v", err)
	}
}

// Replicas starting at once on a new SQLite file race to switch its journal
// to WAL when they open their first connection, and SQLite fails the loser
// with SQLITE_BUSY whatever the busy timeout. Up counts that as a lost race
// and runs again, so every replica's Up succeeds and the migrations are
// applied once (SPEC D1).
func TestConcurrentUpOnNewSQLiteFile(t *testing.T) {
	for round := range 3 {
		dsn := "file:" + filepath.Join(t.TempDir(), "app.db") + "?_journal_mode=WAL&_busy_timeout=5000"
		const replicas = 4
		errs := make(chan error, replicas)
		applied := make(chan int, replicas)
		for range replicas {
			go func() {
				db, err := sql.Open("sqlite3", dsn)
				if err != nil {
					errs <- err
					return
				}
				defer db.Close()
				names, err := migrate.Up(t.Context(), db, nil)
				applied <- len(names)
				errs <- err
			}()
		}
		total := 0
		for range replicas {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: Up: %v", round, err)
			}
			total += <-applied
		}
		if want := len(mustStatus(t, dsn)); total != want {
			t.Fatalf("round %d: the replicas applied %d migrations in all; want %d, once each", round, total, want)
		}
	}
}

func mustStatus(t *testing.T, dsn string) []migrate.MigrationStatus {
	t.Helper()
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := migrate.Status(t.Context(), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Applied {
			t.Fatalf("migration %d %s not applied", s.Version, s.Name)
		}
	}
	return st
}
