package k8slock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection"
	_ "modernc.org/sqlite" // database/sql driver "sqlite" (pure Go)

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/k8slock"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// A replica runs client-go's leader election over the database it already
// has: the Locker's owner is the replica's identity and its TTL is the
// LeaseDuration. While it leads, it fences its writes with the lease the
// Lock holds; on shutdown (ReleaseOnCancel) it releases the lease, so
// another replica leads at once.
func Example() {
	dir, _ := os.MkdirTemp("", "k8slock-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE reconciled (id INTEGER PRIMARY KEY, token BIGINT NOT NULL)`); err != nil {
		panic(err)
	}

	const identity = "replica-1" // in Kubernetes, the pod name
	locker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner(identity), lock.WithTTL(15*time.Second))
	if err != nil {
		panic(err)
	}
	defer locker.Close(context.Background())
	rl, err := k8slock.New(locker, "controllers/leader", identity)
	if err != nil {
		panic(err)
	}

	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            rl,
		LeaseDuration:   15 * time.Second, // the Locker's TTL
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				fmt.Println("leading as", rl.Identity())
				// A write that commits only while this replica's lease is
				// live (SPEC F1, F2); ask the Lock for the lease at each one.
				lease, ok := rl.Lease()
				if !ok {
					return
				}
				err := lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO reconciled (id, token) VALUES (1, ?)`, lease.Token())
					return err
				})
				fmt.Println("fenced write:", err)
				cancel() // shut down: RunOrDie releases the lease and returns
			},
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
		},
	})

	_, _, err = rl.Get(context.Background())
	fmt.Println("released:", apierrors.IsNotFound(err))
	// Output:
	// leading as replica-1
	// fenced write: <nil>
	// stopped leading
	// released: true
}
