package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// childCountingDB opens, in a child process, a pool on the parent's
// database (from the child environment) whose statements an Injector
// counts, and returns the environment its Lockers are built in.
func childCountingDB() (*env, *sql.DB, *faultdb.Injector, error) {
	d, drv := benchDialect(os.Getenv(childDialectEnv))
	dsn := os.Getenv(childDSNEnv)
	raw, err := sql.Open(drv, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		return nil, nil, nil, err
	}
	inj := faultdb.New()
	e := &env{d: d, ns: dialect.Namespace{Schema: os.Getenv(childSchemaEnv)}, quiet: quietLogger()}
	return e, sql.OpenDB(inj.Connector(conn)), inj, nil
}

// waiterTally counts the outcomes of acquireAll's waiters.
type waiterTally struct {
	wg           sync.WaitGroup
	mu           sync.Mutex
	grants, errs int
}

// acquireAll starts one exclusive Acquire of key per Locker (at most wait
// each); each granted waiter holds for hold, releases and calls onGrant
// (may be nil) with its grant time in Unix ns. Errors are counted and
// written to stderr after name. Wait on the tally's wg.
func acquireAll(ctx context.Context, name string, lockers []*lock.Locker, key string, wait, hold time.Duration, onGrant func(int64)) *waiterTally {
	t := &waiterTally{}
	for _, l := range lockers {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			le, err := l.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(wait))
			at := time.Now().UnixNano()
			if err == nil {
				time.Sleep(hold)
				err = le.Release(ctx)
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			if err != nil {
				t.errs++
				fmt.Fprintln(os.Stderr, name+":", err)
				return
			}
			t.grants++
			if onGrant != nil {
				onGrant(at)
			}
		}()
	}
	return t
}
