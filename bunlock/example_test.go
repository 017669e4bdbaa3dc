package bunlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/mattn/go-sqlite3" // database/sql driver "sqlite3"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/sqlitedialect"

	"github.com/sqlease/sqlease/bunlock"
	_ "github.com/sqlease/sqlease/dialect/sqlitedialect" // sqlease dialect "sqlite"
	"github.com/sqlease/sqlease/lock"
)

// Invoice is the application's bun model.
type Invoice struct {
	ID    int64 `bun:",pk"`
	Token int64 // fencing token of the lease it was written under
}

// A bun application migrates the lock tables next to its own, takes an
// exclusive lease, and writes a row in a transaction fenced by the lease.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bunlock-example")
	defer os.RemoveAll(dir)
	sqldb, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		panic(err)
	}
	db := bun.NewDB(sqldb, sqlitedialect.New())
	defer db.Close()

	if _, err := bunlock.Migrate(ctx, db); err != nil { // once per deployment; idempotent
		panic(err)
	}
	if _, err := db.NewCreateTable().Model((*Invoice)(nil)).Exec(ctx); err != nil {
		panic(err)
	}
	locker, err := bunlock.New(ctx, db, lock.WithOwner("billing-worker"))
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	lease, err := locker.Acquire(ctx, "invoices/2024-06", lock.Exclusive)
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", lease.Key(), lease.Mode(), "as", lease.Owner())
	err = bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
		_, err := tx.NewInsert().Model(&Invoice{ID: 1, Token: lease.Token()}).Exec(ctx)
		return err
	})
	if err != nil {
		panic(err)
	}
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	n, _ := db.NewSelect().Model((*Invoice)(nil)).Where("token = ?", lease.Token()).Count(ctx)
	fmt.Println("invoices written under the lease:", n)
	fmt.Println("after release:", lease.Err())
	// Output:
	// holding invoices/2024-06 exclusive as billing-worker
	// invoices written under the lease: 1
	// after release: lease released
}
