package sqlitedialect_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// TestRestoreTokensNeverGoBack (SPEC S7): a database file restored from an
// older copy has an older token counter, yet every grant after the restore
// takes a token greater than every token granted before it, the ones the
// restore lost included, because tokens follow the database clock.
func TestRestoreTokensNeverGoBack(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, copyPath := filepath.Join(dir, "app.db"), filepath.Join(dir, "backup.db")
	open := func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	grant := func(l *lock.Locker, n int) (least, greatest int64) {
		t.Helper()
		for i := 0; i < n; i++ {
			le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			if least == 0 {
				least = le.Token()
			}
			greatest = le.Token()
			if err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return least, greatest
	}

	db := open()
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	l, err := lock.New(ctx, db, sqlitedialect.New())
	if err != nil {
		t.Fatal(err)
	}
	grant(l, 5)
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", copyPath); err != nil {
		t.Fatal(err)
	}
	// Grants the restore will lose; then the file is replaced by its copy.
	_, lost := grant(l, 200)
	l.Close(ctx)
	db.Close()
	for _, suffix := range []string{"", "-wal", "-shm"} {
		_ = os.Remove(path + suffix)
	}
	if err := os.Rename(copyPath, path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // SQLite's clock has millisecond resolution

	db = open()
	defer db.Close()
	l, err = lock.New(ctx, db, sqlitedialect.New())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if first, _ := grant(l, 1); first <= lost {
		t.Fatalf("first token after the restore %d does not exceed %d, granted before it and lost by the restore", first, lost)
	}
}
