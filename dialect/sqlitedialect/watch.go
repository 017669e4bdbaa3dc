package sqlitedialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

var _ dialect.ChangeWatcher = Dialect{}

// followUps are the delays, after the last write event of a burst, at
// which WatchChanges reports a change again: a commit's write event can
// come before the commit is visible (in WAL mode the frames are written,
// then synced, then published in the shared wal-index, which no file event
// reports), so a waiter woken by the event alone could look too early.
var followUps = []time.Duration{25 * time.Millisecond, 250 * time.Millisecond}

// WatchChanges reports writes to db's main database file by any process,
// without a statement and without opening the database's files
// (dialect.ChangeWatcher).
//
// On Linux it asks inotify for writes to, and creation of, the database
// file and its "-wal" and "-journal" files (every commit writes one of
// them) in their directory, and calls changed at once for each burst of
// events, then again after each of followUps. It costs nothing while the
// database is idle. It never opens the database or its "-shm" file: a
// process that closes any descriptor of a file loses every POSIX lock it
// holds on that file, SQLite's included.
//
// Elsewhere it returns an error matching errors.ErrUnsupported (waiters
// then poll), as for an in-memory or temporary database. It borrows one
// connection of db once, to read the file's path (PRAGMA database_list).
// It returns ctx's error when ctx ends.
func (Dialect) WatchChanges(ctx context.Context, db *sql.DB, changed func(), ready func()) error {
	path, err := mainFile(ctx, db)
	if err != nil {
		return err
	}
	return notifyWatch(ctx, path, changed, ready)
}

// mainFile returns the path of db's main database file.
func mainFile(ctx context.Context, db *sql.DB) (string, error) {
	var path string
	err := db.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&path)
	if err != nil {
		return "", fmt.Errorf("sqlitedialect: find the database file: %w", err)
	}
	if path == "" || strings.HasPrefix(path, ":memory:") {
		return "", fmt.Errorf("sqlitedialect: an in-memory or temporary database has no file to watch: %w", errors.ErrUnsupported)
	}
	return path, nil
}
