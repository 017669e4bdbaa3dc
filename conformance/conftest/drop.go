package conftest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"time"
)

// DropNamespace runs drop (for example "DROP SCHEMA IF EXISTS ... CASCADE")
// on the database at dsn through driverName, retrying for up to a minute:
// on a loaded server a drop can fail with a deadlock or a lock timeout
// against a connection that is still closing, and a test's clean-up must
// not leave its schema behind for that. Each attempt has 20 s. The last
// error is also printed to stderr, so a run that leaves a schema says why.
func DropNamespace(driverName, dsn, drop string) error {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(time.Minute)
	wait := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err = db.ExecContext(ctx, drop)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().Add(wait).After(deadline) {
			fmt.Fprintf(os.Stderr, "conftest: %s: %v\n", drop, err)
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 5*time.Second)
	}
}
