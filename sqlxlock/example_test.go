package sqlxlock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "github.com/mattn/go-sqlite3" // database/sql driver "sqlite3"

	_ "github.com/sqlease/sqlease/dialect/sqlitedialect" // sqlease dialect "sqlite"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/sqlxlock"
)

// Payout is the application's row, written under a lease.
type Payout struct {
	ID    int64 `db:"id"`
	Token int64 `db:"token"` // fencing token of the lease it was written under
}

// A sqlx application migrates the lock tables next to its own, takes an
// exclusive lease, and writes a row in a transaction fenced by the lease.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlxlock-example")
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite3", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		panic(err)
	}
	defer db.Close()

	if _, err := sqlxlock.Migrate(ctx, db); err != nil { // once per deployment; idempotent
		panic(err)
	}
	db.MustExecContext(ctx, `CREATE TABLE payouts (id INTEGER PRIMARY KEY, token INTEGER NOT NULL)`)
	locker, err := sqlxlock.New(ctx, db, lock.WithOwner("payout-worker"))
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	lease, err := locker.Acquire(ctx, "payouts/daily", lock.Exclusive)
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", lease.Key(), lease.Mode(), "as", lease.Owner())
	err = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := tx.NamedExecContext(ctx, `INSERT INTO payouts (id, token) VALUES (:id, :token)`, Payout{ID: 1, Token: lease.Token()})
		return err
	})
	if err != nil {
		panic(err)
	}
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	var n int
	_ = db.GetContext(ctx, &n, db.Rebind(`SELECT count(*) FROM payouts WHERE token = ?`), lease.Token())
	fmt.Println("payouts written under the lease:", n)
	fmt.Println("after release:", lease.Err())
	// Output:
	// holding payouts/daily exclusive as payout-worker
	// payouts written under the lease: 1
	// after release: lease released
}
