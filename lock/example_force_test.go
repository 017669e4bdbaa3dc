package lock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
)

// An operator ends a hung worker's lease (what `sqlease release KEY` does).
// The worker's fenced write is refused at once, it learns of the loss at
// its next renewal, and the next grant has a greater token.
func ExampleLocker_ForceRelease() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	worker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner("worker"), lock.WithTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close(ctx)
	operator, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner("operator"))
	if err != nil {
		log.Fatal(err)
	}
	defer operator.Close(ctx)

	lease, err := worker.TryAcquire(ctx, "jobs/import", lock.Exclusive)
	if err != nil {
		log.Fatal(err)
	}
	removed, err := operator.ForceRelease(ctx, "jobs/import")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("released:", len(removed), removed[0].Owner, removed[0].Token == lease.Token())

	err = lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error { return nil })
	fmt.Println("worker's fenced write refused:", errors.Is(err, lock.ErrLeaseLost))

	next, err := operator.TryAcquire(ctx, "jobs/import", lock.Exclusive)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next token is greater:", next.Token() > lease.Token())
	_ = next.Release(ctx)
	// Output:
	// released: 1 worker true
	// worker's fenced write refused: true
	// next token is greater: true
}
