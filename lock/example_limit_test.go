package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
)

// At most two workers call a rate-limited partner API at once, across every
// process: a shared acquire with Limit is a semaphore (SPEC W7). The third
// is refused while two hold the key, and granted once one releases.
func ExampleLimit() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()

	var lockers []*lock.Locker
	for range 3 {
		l, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithTTL(10*time.Second))
		if err != nil {
			log.Fatal(err)
		}
		defer l.Close(ctx)
		lockers = append(lockers, l)
	}
	a, err := lockers[0].TryAcquire(ctx, "api/partner", lock.Shared, lock.Limit(2))
	if err != nil {
		log.Fatal(err)
	}
	b, err := lockers[1].TryAcquire(ctx, "api/partner", lock.Shared, lock.Limit(2))
	if err != nil {
		log.Fatal(err)
	}
	_, err = lockers[2].TryAcquire(ctx, "api/partner", lock.Shared, lock.Limit(2))
	var locked *lock.LockedError
	if errors.As(err, &locked) {
		fmt.Println("third refused; holders:", len(locked.Holders))
	}
	if err := a.Release(ctx); err != nil {
		log.Fatal(err)
	}
	c, err := lockers[2].TryAcquire(ctx, "api/partner", lock.Shared, lock.Limit(2))
	fmt.Println("third after a release:", err == nil, "tokens increase:", b.Token() < c.Token())
	// Output:
	// third refused; holders: 2
	// third after a release: true tokens increase: true
}
