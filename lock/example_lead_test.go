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

// Only one replica runs the scheduler: each replica calls Lead, the leader
// runs the function until its context ends, and when it stops (here its
// context is cancelled; a crash or a lost lease works the same way) another
// replica takes over.
func ExampleLocker_Lead() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	a, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner("replica-a"), lock.WithTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := lock.New(ctx, db, nil, lock.WithOwner("replica-b"), lock.WithTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(ctx)

	// Replica a leads first.
	actx, stopA := context.WithCancel(ctx)
	aLeads, aDone := make(chan struct{}), make(chan error, 1)
	var aToken int64
	go func() {
		aDone <- a.Lead(actx, "jobs/scheduler", func(ctx context.Context, lease *lock.Lease) error {
			aToken = lease.Token()
			fmt.Println("replica-a leads")
			close(aLeads)
			<-ctx.Done() // schedule jobs until stopped or no longer leader
			return context.Cause(ctx)
		}, lock.OnStoppedLeading(func(err error) {
			fmt.Println("replica-a stopped leading, cancelled:", errors.Is(err, context.Canceled))
		}))
	}()
	<-aLeads

	// Replica b campaigns, sees a lead, and takes over once a stops.
	err = b.Lead(ctx, "jobs/scheduler", func(ctx context.Context, lease *lock.Lease) error {
		// Fencing tokens follow the database clock (SPEC S3, S7): the
		// new leader's is greater, so storage fenced by token refuses a's.
		fmt.Println("replica-b leads with a greater token:", lease.Token() > aToken)
		return nil // done: Lead releases the lease and returns nil
	}, lock.OnNewLeader(func(leader lock.Holder) {
		fmt.Println("leader is now", leader.Owner)
		if leader.Owner == "replica-a" {
			stopA()
			fmt.Println("replica-a Lead returned, cancelled:", errors.Is(<-aDone, context.Canceled))
		}
	}), lock.ObserveInterval(50*time.Millisecond))
	fmt.Println("replica-b Lead returned:", err)
	// Output:
	// replica-a leads
	// leader is now replica-a
	// replica-a stopped leading, cancelled: true
	// replica-a Lead returned, cancelled: true
	// leader is now replica-b
	// replica-b leads with a greater token: true
	// replica-b Lead returned: <nil>
}
