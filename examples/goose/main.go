// Command goose applies two goose migrations through a gooselock.Locker:
// two replicas start at the same moment, one applies the migrations under
// the sqlease lease "goose/migrations" while the other waits, then finds
// nothing left to apply. Lock creates the sqlease lock tables on first use.
//
//	go run ./examples/goose                       # a SQLite file in a temporary directory
//	go run ./examples/goose -dsn 'postgres://user@host:5432/db?sslmode=disable'
//
// The DSN comes from -dsn or $GOOSE_EXAMPLE_DSN; one starting with
// postgres:// or postgresql:// selects PostgreSQL (driver pgx, also through
// PgBouncer in transaction pooling mode), anything else is a SQLite DSN
// (modernc.org/sqlite, pure Go). It exits 0 when both replicas succeed and
// the migrations were applied once.
package main

import (
	"context"
	"database/sql"
	"embed"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", pure Go

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/gooselock"
)

//go:embed migrations/*.sql
var embedded embed.FS

func main() {
	dsn := flag.String("dsn", os.Getenv("GOOSE_EXAMPLE_DSN"), "database DSN (default: a SQLite file in a temporary directory)")
	flag.Parse()
	if err := run(*dsn); err != nil {
		log.Fatal(err)
	}
}

func run(dsn string) error {
	driver, d, gooseDialect := "sqlite", dialect.Dialect(sqlitedialect.New()), goose.DialectSQLite3
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		driver, d, gooseDialect = "pgx", pgdialect.New(), goose.DialectPostgres
	case dsn == "":
		dir, err := os.MkdirTemp("", "sqlease-goose-example")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dsn = "file:" + filepath.Join(dir, "app.db") + "?_journal_mode=WAL&_busy_timeout=5000"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// Open the first connection before the replicas start. On a new SQLite
	// file it switches the journal to WAL, and SQLite fails a second
	// connection doing the same at the same instant with SQLITE_BUSY,
	// whatever the busy timeout (goose opens its connection before Lock).
	if err := db.PingContext(context.Background()); err != nil {
		return err
	}
	migrations, err := fs.Sub(embedded, "migrations")
	if err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	applied := make([][]string, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = replica(ctx, db, d, gooseDialect, migrations)
		}()
	}
	wg.Wait()
	total := 0
	for i := range 2 {
		if errs[i] != nil {
			return fmt.Errorf("replica %d: %w", i+1, errs[i])
		}
		fmt.Printf("replica %d applied %d migration(s) %v\n", i+1, len(applied[i]), applied[i])
		total += len(applied[i])
	}
	if total > 2 {
		return fmt.Errorf("the replicas applied %d migrations in all; there are 2", total)
	}
	return nil
}

// replica is one application instance migrating at start-up: its own
// Locker and goose Provider, as a separate process would have.
func replica(ctx context.Context, db *sql.DB, d dialect.Dialect, gooseDialect goose.Dialect, migrations fs.FS) ([]string, error) {
	// If the lease is lost while goose migrates (a stall longer than the
	// TTL), stop goose at its next statement: another replica may be
	// migrating by then.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	locker, err := gooselock.New(d, gooselock.WithTTL(10*time.Second), gooselock.WithOnLost(stop))
	if err != nil {
		return nil, err
	}
	provider, err := goose.NewProvider(gooseDialect, db, migrations, goose.WithLocker(locker))
	if err != nil {
		return nil, err
	}
	results, err := provider.Up(ctx) // matches lock.ErrLeaseLost if the lease was lost
	var names []string
	for _, r := range results {
		names = append(names, r.Source.Path)
	}
	return names, err
}
