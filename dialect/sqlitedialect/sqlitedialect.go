// Package sqlitedialect is the SQLite dialect of sqlease.
//
// SQLite serializes writers, so fencing tokens come from one counter row and
// acquire is a short script inside BEGIN IMMEDIATE: the transaction holds the
// database write lock from its first statement (SPEC S1, S3). Times are
// unixepoch('subsec'), millisecond resolution, which SQLite evaluates once
// per statement (SPEC S2). A fenced write's first statement is a write on
// the holder row, so the caller's transaction holds the write lock until it
// ends and no takeover can commit meanwhile (SPEC F1); every renewal waits
// too, so keep fenced transactions much shorter than the TTL.
//
// Importing the package registers the dialect as "sqlite"; it is detected
// for github.com/mattn/go-sqlite3 and modernc.org/sqlite. Use a DSN with a
// busy timeout (mattn: _busy_timeout=5000, the default) and WAL journal mode
// (_journal_mode=WAL) for concurrent readers. Errors are classified with
// mattn's sqlite3.Error, or the Code() method of modernc's error type.
package sqlitedialect

import (
	"database/sql/driver"
	"embed"
	"errors"
	"io/fs"
	"strconv"
	"strings"

	"github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Name is the registry name of this dialect.
const Name = "sqlite"

// Dialect is the SQLite dialect. Its zero value is ready to use.
type Dialect struct{}

var (
	_ dialect.Dialect       = Dialect{}
	_ dialect.DriverMatcher = Dialect{}
)

func init() { dialect.Register(Dialect{}) }

// New returns the SQLite dialect.
func New() Dialect { return Dialect{} }

// Name returns "sqlite".
func (Dialect) Name() string { return Name }

// Capabilities: write-lock fences only (no schemas, one writer at a time).
func (Dialect) Capabilities() dialect.Capabilities { return dialect.CapWriteLockFence }

// QuoteIdent double-quotes name, doubling embedded quotes.
func (Dialect) QuoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Placeholder returns "?n".
func (Dialect) Placeholder(n int) string { return "?" + strconv.Itoa(n) }

// GooseDialect returns "sqlite3".
func (Dialect) GooseDialect() string { return "sqlite3" }

// Migrations returns the embedded migration templates.
func (Dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// MatchesDriver claims mattn/go-sqlite3 and modernc.org/sqlite.
func (Dialect) MatchesDriver(d driver.Driver) bool {
	p := dialect.DriverPackage(d)
	return p == "github.com/mattn/go-sqlite3" || p == "modernc.org/sqlite"
}

// SQLite result codes used by Classify.
const (
	codeBusy       = 5
	codeLocked     = 6
	codeConstraint = 19
)

// Classify: SQLITE_BUSY and SQLITE_LOCKED (and a lost connection) are
// retryable, SQLITE_CONSTRAINT is a conflict, "no such table" means the
// schema is not migrated.
func (Dialect) Classify(err error) dialect.ErrorClass {
	if err == nil {
		return dialect.ErrorOther
	}
	code := -1
	var me sqlite3.Error
	var pe *sqlite3.Error
	var coder interface{ Code() int }
	switch {
	case errors.As(err, &me):
		code = int(me.Code)
	case errors.As(err, &pe) && pe != nil:
		code = int(pe.Code)
	case errors.As(err, &coder):
		code = coder.Code() & 0xff
	}
	switch code {
	case codeBusy, codeLocked:
		return dialect.ErrorRetryable
	case codeConstraint:
		return dialect.ErrorConflict
	}
	if strings.Contains(err.Error(), "no such table") {
		return dialect.ErrorUndefinedTable
	}
	if errors.Is(err, driver.ErrBadConn) {
		return dialect.ErrorRetryable
	}
	return dialect.ErrorOther
}

// now is the database clock in integer microseconds (millisecond resolution).
const now = `(CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000)`

// Statements returns the SQLite statement templates.
func (Dialect) Statements() dialect.Statements {
	return dialect.Statements{
		// A refused poll is one read, without the write lock.
		Probe: `WITH b AS (
    SELECT 0 AS granted, h.lease_id, h.mode, h.owner, h.token, h.expires_us, ` + now + ` AS now_us
    FROM {holders} h
    WHERE h.lock_key = @key AND h.expires_us > ` + now + ` AND (h.mode = 'x' OR @mode = 'x')
    UNION ALL
    SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
    FROM {markers} m
    WHERE m.lock_key = @key AND m.expires_us > ` + now + ` AND m.waiter_id <> @lease_id
)
SELECT * FROM b
UNION ALL
SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
FROM {markers} m
WHERE m.lock_key = @key AND m.waiter_id = @lease_id AND m.expires_us > ` + now + ` AND EXISTS (SELECT 1 FROM b)`,
		BeginWrite: "BEGIN IMMEDIATE",
		Acquire: []string{
			// Takeover of expired holders and markers of this key.
			`DELETE FROM {holders} WHERE lock_key = @key AND expires_us <= ` + now,
			`DELETE FROM {markers} WHERE lock_key = @key AND expires_us <= ` + now,
			// Grant when nothing blocks; the token_bump trigger advances
			// the counter row to the new token.
			`INSERT INTO {holders} (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
SELECT @lease_id, @key, @mode, @owner, c.value + 1, ` + now + `, ` + now + ` + @ttl_us
FROM {counter} c
WHERE c.id = 1
  AND @mode IN ('x', 's')
  AND NOT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x'))
  AND NOT EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = @key AND m.waiter_id <> @lease_id)`,
			// Refused exclusive request: set or refresh our marker unless
			// another waiter's live marker holds the claim.
			`INSERT INTO {markers} (lock_key, waiter_id, owner, expires_us)
SELECT @key, @lease_id, @owner, ` + now + ` + @marker_us
WHERE @mode = 'x' AND @marker_us > 0 AND NOT EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)
ON CONFLICT (lock_key) DO UPDATE SET expires_us = excluded.expires_us
WHERE waiter_id = excluded.waiter_id`,
			// Granted: clear our own marker.
			`DELETE FROM {markers} WHERE lock_key = @key AND waiter_id = @lease_id
  AND EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)`,
			`SELECT 1 AS granted, lease_id, mode, owner, token, expires_us, ` + now + ` AS now_us
FROM {holders} WHERE lease_id = @lease_id
UNION ALL
SELECT 0, h.lease_id, h.mode, h.owner, h.token, h.expires_us, ` + now + `
FROM {holders} h
WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x')
  AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)
UNION ALL
SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
FROM {markers} m
WHERE m.lock_key = @key AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)`,
		},
		Renew: `UPDATE {holders} SET expires_us = ` + now + ` + @ttl_us
WHERE lease_id = @lease_id AND token = @token AND expires_us > ` + now + `
RETURNING expires_us, ` + now + ` AS now_us`,
		RenewBatch: `UPDATE {holders} SET expires_us = ` + now + ` + @ttl_us
WHERE lease_id IN (SELECT substr(value, 1, instr(value, ':') - 1) FROM json_each(@leases))
  AND (lease_id || ':' || token) IN (SELECT value FROM json_each(@leases))
  AND expires_us > ` + now + `
RETURNING lease_id, expires_us, ` + now + ` AS now_us`,
		Release:     `DELETE FROM {holders} WHERE lease_id = @lease_id AND (token = @token OR @token = 0) RETURNING lock_key`,
		ClearMarker: `DELETE FROM {markers} WHERE lock_key = @key AND waiter_id = @lease_id`,
		// A write as the first statement takes the write lock for the rest
		// of the caller's transaction.
		Fence: `UPDATE {holders} SET expires_us = expires_us
WHERE lease_id = @lease_id AND token = @token AND expires_us > ` + now + `
RETURNING expires_us, ` + now + ` AS now_us`,
		Holders: `SELECT lock_key, mode, lease_id, owner, token, expires_us, ` + now + ` AS now_us
FROM {holders} WHERE substr(lock_key, 1, length(@key_prefix)) = @key_prefix
UNION ALL
SELECT lock_key, 'w', waiter_id, owner, 0, expires_us, ` + now + `
FROM {markers} WHERE substr(lock_key, 1, length(@key_prefix)) = @key_prefix
ORDER BY 1, 5`,
		Sweep: []string{
			`DELETE FROM {markers} WHERE rowid IN (SELECT rowid FROM {markers} WHERE expires_us <= ` + now + ` LIMIT @limit)`,
			`DELETE FROM {holders} WHERE rowid IN (SELECT rowid FROM {holders} WHERE expires_us <= ` + now + ` ORDER BY expires_us LIMIT @limit)`,
		},
		CountRows: `SELECT (SELECT count(*) FROM {holders}) + (SELECT count(*) FROM {markers})`,
	}
}
