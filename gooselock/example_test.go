package gooselock_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing/fstest"
	"time"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", pure Go

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/gooselock"
)

// goose applies two migrations while the Locker holds the lease
// "goose/migrations": another replica running the same code at the same
// moment waits, then finds nothing left to apply. Lock creates the sqlease
// lock tables on first use.
func Example() {
	dir, err := os.MkdirTemp("", "gooselock-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	migrations := fstest.MapFS{
		"00001_users.sql":      {Data: []byte("-- +goose Up\nCREATE TABLE users (id INTEGER PRIMARY KEY);\n-- +goose Down\nDROP TABLE users;\n")},
		"00002_user_email.sql": {Data: []byte("-- +goose Up\nALTER TABLE users ADD COLUMN email TEXT;\n-- +goose Down\nALTER TABLE users DROP COLUMN email;\n")},
	}
	locker, err := gooselock.New(sqlitedialect.New(), gooselock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, migrations, goose.WithLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	results, err := provider.Up(context.Background())
	if err != nil {
		log.Fatal(err) // matches lock.ErrLeaseLost if the lease was lost meanwhile
	}
	for _, r := range results {
		fmt.Println("applied", r.Source.Path)
	}
	// Output:
	// applied 00001_users.sql
	// applied 00002_user_email.sql
}
