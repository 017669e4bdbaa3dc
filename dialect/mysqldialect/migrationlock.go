package mysqldialect

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pressly/goose/v3/lock"

	"github.com/sqlease/sqlease/dialect"
)

// Migration lock timing: how often a waiting migrate run retries, how long
// it waits in all, how long a crashed holder's lock blocks others, and how
// often the holder renews it.
const (
	migrationLockRetry     = 100 * time.Millisecond
	migrationLockWait      = 5 * time.Minute
	migrationLockLease     = 10 * time.Second
	migrationLockHeartbeat = 2 * time.Second
)

// MigrationLocker returns the lock that serializes concurrent migrate.Up
// runs on ns (SPEC D1): a row, keyed by a hash of the table's name, in the
// table "<prefix>migrate_lock" of ns (created on first use), since MySQL
// runs DDL outside transactions. The row holds a lease (10 s, renewed every
// 2 s), not session state: a crashed migrator's lock is taken over after
// the lease. Waiting for it gives up after 5 minutes.
//
// The table, the row and the statements are those of goose's MySQL table
// locker (lock.NewMySQLTableLocker), so runs of earlier sqlease versions,
// which use goose's, and of this one exclude each other; unlike goose's it
// reads no DATETIME column into Go, so it needs no parseTime=true in the
// DSN. Errors: a bad namespace (matches dialect.ErrInvalidName).
func (d Dialect) MigrationLocker(ns dialect.Namespace) (lock.Locker, error) {
	if err := ns.Validate(d); err != nil {
		return nil, err
	}
	table := strings.TrimSuffix(ns.VersionTable(), "db_version") + d.MigrationLockTable()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown-hostname"
	}
	return &tableLocker{
		table:    ns.Object(d, d.MigrationLockTable()),
		id:       int64(crc32.ChecksumIEEE([]byte("sqlease:" + table))),
		instance: fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(rnd[:])),
	}, nil
}

// MigrationLockTable names the migration lock's table without the
// namespace's prefix: "migrate_lock" (migrate.Drop removes it).
func (Dialect) MigrationLockTable() string { return "migrate_lock" }

// tableLocker takes the row id of table for instance, keeps its lease
// while it holds it, and clears it on Unlock.
type tableLocker struct {
	table    string // quoted, schema-qualified
	id       int64
	instance string

	mu        sync.Mutex
	stop      context.CancelFunc
	heartbeat chan struct{} // closed when the heartbeat goroutine ends
}

// leaseSQL is the lease's end as goose writes it: whole seconds after the
// session's clock.
var leaseSQL = fmt.Sprintf("now(6) + INTERVAL %d SECOND", int(migrationLockLease/time.Second))

// Lock creates the table when missing and takes the row: a new row, or one
// unlocked or whose lease has ended. It retries every 100 ms for up to 5
// minutes while another run holds it, and ends early with ctx.
func (l *tableLocker) Lock(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+l.table+` (
		lock_id BIGINT NOT NULL PRIMARY KEY,
		locked BOOLEAN NOT NULL DEFAULT 0,
		locked_at DATETIME(6) NULL,
		locked_by TEXT NULL,
		lease_expires_at DATETIME(6) NULL,
		updated_at DATETIME(6) NULL
	)`); err != nil {
		return fmt.Errorf("mysqldialect: migration lock: create table %s: %w", l.table, err)
	}
	deadline := time.Now().Add(migrationLockWait)
	for {
		ok, err := l.take(ctx, db)
		if ok {
			break
		}
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("held by another migrate run for %v", migrationLockWait)
		}
		if err != nil {
			return fmt.Errorf("mysqldialect: migration lock %s: %w", l.table, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("mysqldialect: migration lock %s: %w", l.table, ctx.Err())
		case <-time.After(migrationLockRetry):
		}
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	l.mu.Lock()
	l.stop, l.heartbeat = stop, done
	l.mu.Unlock()
	go l.renew(hctx, db, done)
	return nil
}

// take tries once to take the row; false with a nil error means another
// run holds it.
func (l *tableLocker) take(ctx context.Context, db *sql.DB) (bool, error) {
	res, err := db.ExecContext(ctx, `INSERT IGNORE INTO `+l.table+`
		(lock_id, locked, locked_at, locked_by, lease_expires_at, updated_at)
		VALUES (?, true, now(6), ?, `+leaseSQL+`, now(6))`, l.id, l.instance)
	if err == nil {
		if n, _ := res.RowsAffected(); n == 1 {
			return true, nil
		}
		res, err = db.ExecContext(ctx, `UPDATE `+l.table+`
			SET locked = true, locked_at = now(6), locked_by = ?, lease_expires_at = `+leaseSQL+`, updated_at = now(6)
			WHERE lock_id = ? AND (locked = false OR lease_expires_at < now(6))`, l.instance, l.id)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		// A deadlock or lock wait timeout between two takers: try again.
		if (Dialect{}).Classify(err) == dialect.ErrorRetryable {
			return false, nil
		}
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// renew extends the lease every 2 s until ctx ends; a failed renewal is
// tried again at the next beat (the lease outlasts four missed beats).
func (l *tableLocker) renew(ctx context.Context, db *sql.DB, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(migrationLockHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = db.ExecContext(ctx, `UPDATE `+l.table+`
				SET lease_expires_at = `+leaseSQL+`, updated_at = now(6)
				WHERE lock_id = ? AND locked_by = ? AND locked = true`, l.id, l.instance)
		}
	}
}

// errMigrationLockLost: Unlock found the row taken by another run, whose
// migrations may have overlapped with this one's.
var errMigrationLockLost = errors.New("the lease ended and another migrate run took the lock")

// Unlock stops the renewals and clears the row, retrying failed attempts
// every 100 ms for up to a minute (ctx's cancellation is ignored: the row
// must be cleared, or the next run waits out the lease).
func (l *tableLocker) Unlock(ctx context.Context, db *sql.DB) error {
	l.mu.Lock()
	stop, done := l.stop, l.heartbeat
	l.stop, l.heartbeat = nil, nil
	l.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := db.ExecContext(ctx, `UPDATE `+l.table+`
			SET locked = false, locked_at = NULL, locked_by = NULL, lease_expires_at = NULL, updated_at = now(6)
			WHERE lock_id = ? AND locked_by = ?`, l.id, l.instance)
		if err == nil {
			if n, _ := res.RowsAffected(); n == 0 {
				return fmt.Errorf("mysqldialect: migration lock %s: %w", l.table, errMigrationLockLost)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mysqldialect: migration lock %s: release: %w", l.table, err)
		}
		time.Sleep(migrationLockRetry)
	}
}
