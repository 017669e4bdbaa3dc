//go:build !linux

package sqlitedialect

import (
	"context"
	"errors"
	"fmt"
)

// notifyWatch: without inotify there is no safe way here to see other
// processes' commits without a statement (reading the database's files
// would mean opening, and later closing, descriptors of files SQLite
// locks), so waiters poll.
func notifyWatch(context.Context, string, func(), func()) error {
	return fmt.Errorf("sqlitedialect: watching the database file needs inotify (Linux): %w", errors.ErrUnsupported)
}
