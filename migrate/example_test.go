package migrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/migrate"
)

// Up creates the lock tables once per database (and namespace); running it
// again applies nothing. A nil dialect is detected from the driver.
func ExampleUp() {
	dir, err := os.MkdirTemp("", "sqlease-migrate")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	applied, err := migrate.Up(ctx, db, nil)
	fmt.Println("applied:", applied, err)
	applied, err = migrate.Up(ctx, db, nil)
	fmt.Println("again:", applied, err)

	current, want, err := migrate.Version(ctx, db, nil)
	fmt.Println("version:", current, "of", want, err)

	// The namespace must match the Locker's (lock.WithTablePrefix("app_")).
	_, err = migrate.Up(ctx, db, nil, migrate.WithNamespace(dialect.Namespace{Prefix: "app_"}))
	fmt.Println("app_ namespace:", err)
	_, err = migrate.Up(ctx, db, nil, migrate.WithNamespace(dialect.Namespace{Schema: "locks"}))
	fmt.Println(err)
	// Output:
	// applied: [00001_lock_tables.sql 00002_fifo_tickets.sql 00003_takeover_trigger.sql 00004_holders_without_rowid.sql] <nil>
	// again: [] <nil>
	// version: 4 of 4 <nil>
	// app_ namespace: <nil>
	// migrate: invalid schema "locks": dialect "sqlite" has no schemas (only dialects with CapSchemas, such as postgres, do); use a table prefix instead
}

// Drop uninstalls sqlease from a namespace: the migrations are reverted and
// the version table dropped, so a later Up starts afresh. WithProgress
// reports each migration with its duration.
func ExampleDrop() {
	dir, err := os.MkdirTemp("", "sqlease-migrate")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	if _, err := migrate.Up(ctx, db, nil); err != nil {
		log.Fatal(err)
	}
	progress := migrate.WithProgress(func(r migrate.MigrationResult) {
		fmt.Println(r.Direction, r.Name, r.Duration > 0)
	})
	reverted, err := migrate.Drop(ctx, db, nil, progress)
	fmt.Println("reverted:", reverted, err)
	current, _, err := migrate.Version(ctx, db, nil)
	fmt.Println("version:", current, err)
	applied, err := migrate.Up(ctx, db, nil)
	fmt.Println("applied again:", applied, err)
	// Output:
	// down 00004_holders_without_rowid.sql true
	// down 00003_takeover_trigger.sql true
	// down 00002_fifo_tickets.sql true
	// down 00001_lock_tables.sql true
	// reverted: [00004_holders_without_rowid.sql 00003_takeover_trigger.sql 00002_fifo_tickets.sql 00001_lock_tables.sql] <nil>
	// version: 0 <nil>
	// applied again: [00001_lock_tables.sql 00002_fifo_tickets.sql 00003_takeover_trigger.sql 00004_holders_without_rowid.sql] <nil>
}
