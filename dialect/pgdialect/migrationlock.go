package pgdialect

import (
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/pressly/goose/v3/lock"

	"github.com/sqlease/sqlease/dialect"
)

var (
	_ dialect.MigrationLocker     = Dialect{}
	_ dialect.MigrationLockTabler = Dialect{}
)

// MigrationLockTable names the migration lock's table without the
// namespace's prefix: "migration_lock" (migrate.Drop removes it).
func (Dialect) MigrationLockTable() string { return "migration_lock" }

// Migration lock timing: how often a waiting migrate run retries, how long
// it waits in all, and how long a crashed holder's lock blocks others.
const (
	migrationLockRetry     = 250 * time.Millisecond
	migrationLockWait      = 5 * time.Minute
	migrationLockLease     = 30 * time.Second
	migrationLockHeartbeat = 5 * time.Second
)

// MigrationLocker returns the lock that serializes concurrent migrate runs
// on ns (SPEC D1): goose's PostgreSQL table lock, one row in the table
// "<prefix>migration_lock" of the namespace's schema (created on first use),
// keyed by a hash of the namespace's version table. It is not session state:
// taking, renewing and releasing it are single autocommit statements, so it
// works through PgBouncer in transaction pooling mode, where goose's session
// advisory lock would be taken on one server connection and released on
// another. A waiting run retries every 250 ms for up to 5 minutes; the
// holder renews its row every 5 s, and a holder that crashed blocks others
// for at most its 30 s lease. Errors: a bad namespace (matches
// dialect.ErrInvalidName).
func (d Dialect) MigrationLocker(ns dialect.Namespace) (lock.Locker, error) {
	if err := ns.Validate(d); err != nil {
		return nil, err
	}
	version := ns.VersionTable() // "[schema.]<prefix>db_version", validated identifiers
	table := strings.TrimSuffix(version, "db_version") + d.MigrationLockTable()
	h := fnv.New64a()
	h.Write([]byte("sqlease:" + version))
	l, err := lock.NewPostgresTableLocker(
		lock.WithTableName(table),
		lock.WithTableLockID(int64(h.Sum64()>>1)),
		lock.WithTableLeaseDuration(migrationLockLease),
		lock.WithTableHeartbeatInterval(migrationLockHeartbeat),
		lock.WithTableLockTimeout(migrationLockRetry, uint64(migrationLockWait/migrationLockRetry)),
		lock.WithTableUnlockTimeout(migrationLockRetry, uint64(time.Minute/migrationLockRetry)),
	)
	if err != nil {
		return nil, fmt.Errorf("pgdialect: migration lock %s: %w", table, err)
	}
	return l, nil
}
