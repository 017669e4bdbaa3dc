package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	gooselock "github.com/pressly/goose/v3/lock"
)

// The baselines sqlease is compared against, implemented here so that they
// run in the same process, on the same pool settings, in the same run.

// rawLease is the hand-rolled single-statement lease: an upsert that takes
// the key when its row is missing or expired, and a delete by key and
// owner. It has no fencing token, no shared mode, no writer preference and
// no renewal loop; it is the floor of what a leased lock over SQL costs.
type rawLease struct {
	db                           *sql.DB
	acquireSQL, renewSQL, relSQL string
	notifySQL                    string // PostgreSQL: release that also notifies, as sqlease's does
	channel                      string // PostgreSQL: the channel notifySQL notifies, one per run
	mysql                        bool   // MySQL: acquire reports by rows affected, renew binds the TTL first
	owners                       atomic.Int64
	ttlUS                        int64
}

// newRawLease creates the raw table in e's namespace.
func newRawLease(ctx context.Context, e *env, db *sql.DB, name string) (*rawLease, error) {
	t := e.table(name)
	r := &rawLease{db: db, ttlUS: (30 * time.Second).Microseconds()}
	var create string
	switch {
	case e.isMySQL():
		// ON DUPLICATE KEY UPDATE assigns left to right: the owner is
		// replaced only when the row expired, and the expiry only when
		// the owner is now the caller (owners are fresh per acquire).
		// Rows affected: 1 inserted, 2 taken over, 0 held by another.
		const now = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`
		r.mysql = true
		create = `CREATE TABLE ` + t + ` (k VARBINARY(512) NOT NULL PRIMARY KEY, owner VARBINARY(64) NOT NULL, expires_us BIGINT NOT NULL) ENGINE = InnoDB`
		r.acquireSQL = `INSERT INTO ` + t + ` (k, owner, expires_us) VALUES (?, ?, ` + now + ` + ?)
ON DUPLICATE KEY UPDATE owner = IF(expires_us < ` + now + `, VALUES(owner), owner),
  expires_us = IF(owner = VALUES(owner), VALUES(expires_us), expires_us)`
		r.renewSQL = `UPDATE ` + t + ` SET expires_us = ` + now + ` + ? WHERE k = ? AND owner = ? AND expires_us > ` + now
		r.relSQL = `DELETE FROM ` + t + ` WHERE k = ? AND owner = ?`
	case e.isPG():
		create = `CREATE TABLE ` + t + ` (key text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL)`
		r.acquireSQL = `INSERT INTO ` + t + ` AS raw (key, owner, expires_at)
VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond')
ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
WHERE raw.expires_at < clock_timestamp()
RETURNING raw.owner`
		r.renewSQL = `UPDATE ` + t + ` SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()`
		r.relSQL = `DELETE FROM ` + t + ` WHERE key = $1 AND owner = $2`
		// The run's schema names the channel: other runs on the server
		// neither wake this run's listener nor are woken by it.
		r.channel = e.schema + "_raw"
		r.notifySQL = `WITH gone AS (DELETE FROM ` + t + ` WHERE key = $1 AND owner = $2 RETURNING key)
SELECT key, pg_notify('` + r.channel + `', key) FROM gone`
	default:
		const now = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`
		create = `CREATE TABLE ` + t + ` (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_us INTEGER NOT NULL)`
		r.acquireSQL = `INSERT INTO ` + t + ` AS raw (key, owner, expires_us)
VALUES (?1, ?2, ` + now + ` + ?3)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_us = excluded.expires_us
WHERE raw.expires_us < ` + now + `
RETURNING owner`
		r.renewSQL = `UPDATE ` + t + ` SET expires_us = ` + now + ` + ?3
WHERE key = ?1 AND owner = ?2 AND expires_us > ` + now
		r.relSQL = `DELETE FROM ` + t + ` WHERE key = ?1 AND owner = ?2`
	}
	if _, err := db.ExecContext(ctx, create); err != nil {
		return nil, fmt.Errorf("create raw table: %w", err)
	}
	return r, nil
}

// newOwner returns a fresh owner value, as sqlease draws a fresh lease ID.
func (r *rawLease) newOwner() string { return "o" + strconv.FormatInt(r.owners.Add(1), 36) }

// tryAcquire runs the upsert; ok is false when the key is held.
func (r *rawLease) tryAcquire(ctx context.Context, db *sql.DB, key, owner string) (bool, error) {
	if r.mysql {
		res, err := db.ExecContext(ctx, r.acquireSQL, key, owner, r.ttlUS)
		if err != nil {
			return false, err
		}
		n, err := res.RowsAffected()
		return n > 0, err
	}
	var got string
	err := db.QueryRowContext(ctx, r.acquireSQL, key, owner, r.ttlUS).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// renew extends the lease by the TTL.
func (r *rawLease) renew(ctx context.Context, db *sql.DB, key, owner string) error {
	if r.mysql {
		_, err := db.ExecContext(ctx, r.renewSQL, r.ttlUS, key, owner)
		return err
	}
	_, err := db.ExecContext(ctx, r.renewSQL, key, owner, r.ttlUS)
	return err
}

// release deletes the lease.
func (r *rawLease) release(ctx context.Context, db *sql.DB, key, owner string) error {
	_, err := db.ExecContext(ctx, r.relSQL, key, owner)
	return err
}

// releaseNotify deletes the lease and notifies (PostgreSQL), like sqlease's
// release. A lease that was not there to delete is an error: nothing was
// notified.
func (r *rawLease) releaseNotify(ctx context.Context, db *sql.DB, key, owner string) error {
	rows, err := db.QueryContext(ctx, r.notifySQL, key, owner)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("raw release of %s by %s deleted %d rows, want 1 (nothing was notified)", key, owner, n)
	}
	return nil
}

// workload returns the raw acquire+release as a workload on per-client
// keys prefix/<client>.
func (r *rawLease) workload(name, prefix string, notify bool) workload {
	return workload{name: name, op: func(ctx context.Context, c int) error {
		key, owner := prefix+strconv.Itoa(c), r.newOwner()
		ok, err := r.tryAcquire(ctx, r.db, key, owner)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("raw: key %s unexpectedly held", key)
		}
		if notify {
			return r.releaseNotify(ctx, r.db, key, owner)
		}
		return r.release(ctx, r.db, key, owner)
	}}
}

// pinnedConns takes n connections of db for the session-lock baselines,
// and a function that closes them.
func pinnedConns(ctx context.Context, db *sql.DB, n int) ([]*sql.Conn, func(), error) {
	conns := make([]*sql.Conn, n)
	closeAll := func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns, closeAll, nil
}

// advisoryWorkload is PostgreSQL's session advisory lock: try-lock and
// unlock on one pinned connection per client (no lease, no expiry: the
// lock lives as long as the session). shared selects the shared variants.
func advisoryWorkload(ctx context.Context, db *sql.DB, clients int, keyBase int64, shared bool) (workload, error) {
	conns, closeAll, err := pinnedConns(ctx, db, clients)
	if err != nil {
		return workload{}, err
	}
	lockSQL, unlockSQL, name := `SELECT pg_try_advisory_lock($1)`, `SELECT pg_advisory_unlock($1)`, "advisory"
	if shared {
		lockSQL, unlockSQL, name = `SELECT pg_try_advisory_lock_shared($1)`, `SELECT pg_advisory_unlock_shared($1)`, "advisory-shared"
	}
	return workload{name: name, close: closeAll, op: func(ctx context.Context, c int) error {
		key := keyBase + int64(c)
		var ok bool
		if err := conns[c].QueryRowContext(ctx, lockSQL, key).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("advisory lock %d unexpectedly held", key)
		}
		return conns[c].QueryRowContext(ctx, unlockSQL, key).Scan(&ok)
	}}, nil
}

// getLockWorkload is MySQL's named lock: GET_LOCK(name, 0) and
// RELEASE_LOCK on one pinned connection per client (no lease, no expiry,
// one mode: the lock lives as long as the session). Names are prefixed
// with the run's database, as they are server-wide.
func getLockWorkload(ctx context.Context, e *env, clients int, prefix string) (workload, error) {
	conns, closeAll, err := pinnedConns(ctx, e.db, clients)
	if err != nil {
		return workload{}, err
	}
	return workload{name: "get_lock", close: closeAll, op: func(ctx context.Context, c int) error {
		name := e.schema + "/" + prefix + strconv.Itoa(c)
		var ok sql.NullInt64
		if err := conns[c].QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, name).Scan(&ok); err != nil {
			return err
		}
		if ok.Int64 != 1 {
			return fmt.Errorf("GET_LOCK(%s) unexpectedly held", name)
		}
		return conns[c].QueryRowContext(ctx, `SELECT RELEASE_LOCK(?)`, name).Scan(&ok)
	}}, nil
}

// gooseWorkload is goose's PostgreSQL table locker (lock.NewPostgresTableLocker):
// one locker per client, each with its own lock ID in one table of the
// bench schema. Its Lock checks that the table exists, upserts the lock row
// and starts a heartbeat goroutine; Unlock stops the heartbeat and clears
// the row.
func gooseWorkload(e *env, clients int) (workload, error) {
	lockers := make([]gooselock.Locker, clients)
	for i := range lockers {
		l, err := gooselock.NewPostgresTableLocker(
			gooselock.WithTableName(e.schema+".goose_lock"),
			gooselock.WithTableLockID(int64(i+1)),
			gooselock.WithTableLogger(e.quiet),
		)
		if err != nil {
			return workload{}, err
		}
		lockers[i] = l
	}
	return workload{name: "goose", op: func(ctx context.Context, c int) error {
		if err := lockers[c].Lock(ctx, e.db); err != nil {
			return err
		}
		return lockers[c].Unlock(ctx, e.db)
	}}, nil
}
