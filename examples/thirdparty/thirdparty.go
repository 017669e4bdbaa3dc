// Package thirdparty is an example of a sqlease dialect written outside the
// sqlease module, against its public API only (package dialect): a small
// SQLite dialect over github.com/mattn/go-sqlite3 with tables and SQL of its
// own (a token counter bumped by the acquire script instead of a trigger,
// plain "?" placeholders, no Probe and no RenewBatch). Its tests prove it
// with conformance.Run, and cmd/sqlease-thirdparty builds the sqlease tool
// with it, so `sqlease-thirdparty check --dialect thirdparty` runs the same
// suite. See docs/writing-a-dialect.md in the sqlease repository.
package thirdparty

import (
	"database/sql/driver"
	"embed"
	"errors"
	"io/fs"
	"strings"

	"github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Name is the registry name of the example dialect.
const Name = "thirdparty"

// Dialect is the example dialect; its zero value is ready to use.
type Dialect struct{}

var _ dialect.Dialect = Dialect{}

func init() { dialect.Register(Dialect{}) }

// Name returns "thirdparty".
func (Dialect) Name() string { return Name }

// Capabilities: the fence is a write, which holds SQLite's database write
// lock until the fenced transaction ends.
func (Dialect) Capabilities() dialect.Capabilities { return dialect.CapWriteLockFence }

// QuoteIdent double-quotes name.
func (Dialect) QuoteIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// Placeholder returns "?": every use of a parameter is bound on its own.
func (Dialect) Placeholder(int) string { return "?" }

// GooseDialect returns "sqlite3".
func (Dialect) GooseDialect() string { return "sqlite3" }

// Migrations returns the embedded migrations.
func (Dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// Classify: busy and locked are retryable, constraint violations are
// conflicts, "no such table" means not migrated.
func (Dialect) Classify(err error) dialect.ErrorClass {
	var se sqlite3.Error
	switch {
	case err == nil:
		return dialect.ErrorOther
	case errors.As(err, &se) && (se.Code == sqlite3.ErrBusy || se.Code == sqlite3.ErrLocked):
		return dialect.ErrorRetryable
	case errors.As(err, &se) && se.Code == sqlite3.ErrConstraint:
		return dialect.ErrorConflict
	case strings.Contains(err.Error(), "no such table"):
		return dialect.ErrorUndefinedTable
	case errors.Is(err, driver.ErrBadConn):
		return dialect.ErrorRetryable
	}
	return dialect.ErrorOther
}

// now is the database clock in integer microseconds, read once per
// statement.
const now = `(CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000)`

// blocked is true when a holder or another waiter's marker of @key blocks
// a request in @mode (expired ones were deleted before).
const blocked = `(EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x'))
  OR EXISTS (SELECT 1 FROM {waiters} w WHERE w.lock_key = @key AND w.waiter_id <> @lease_id))`

// Statements returns the example's statement templates.
func (Dialect) Statements() dialect.Statements {
	return dialect.Statements{
		BeginWrite: "BEGIN IMMEDIATE",
		Acquire: []string{
			`DELETE FROM {holders} WHERE lock_key = @key AND expires_us <= ` + now,
			`DELETE FROM {waiters} WHERE lock_key = @key AND expires_us <= ` + now,
			// The counter moves only for a grant; the insert below sees
			// the same condition in the same transaction.
			// A token is the greater of the last one plus one and the
			// clock in microseconds, so a database restored from an older
			// copy never reissues one (SPEC S7).
			`UPDATE {tokens} SET last = max(last + 1, ` + now + `) WHERE id = 1 AND @mode IN ('x', 's') AND NOT ` + blocked,
			`INSERT INTO {holders} (lease_id, lock_key, mode, owner, token, expires_us)
SELECT @lease_id, @key, @mode, @owner, t.last, ` + now + ` + @ttl_us FROM {tokens} t
WHERE t.id = 1 AND @mode IN ('x', 's') AND NOT ` + blocked,
			`DELETE FROM {waiters} WHERE lock_key = @key AND waiter_id = @lease_id
  AND EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)`,
			`INSERT INTO {waiters} (lock_key, waiter_id, owner, expires_us)
SELECT @key, @lease_id, @owner, ` + now + ` + @marker_us
WHERE @mode = 'x' AND @marker_us > 0 AND NOT EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)
ON CONFLICT (lock_key) DO UPDATE SET expires_us = excluded.expires_us WHERE waiter_id = excluded.waiter_id`,
			`SELECT 1, lease_id, mode, owner, token, expires_us, ` + now + ` FROM {holders} WHERE lease_id = @lease_id
UNION ALL
SELECT 0, h.lease_id, h.mode, h.owner, h.token, h.expires_us, ` + now + ` FROM {holders} h
WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x')
  AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)
UNION ALL
SELECT 0, w.waiter_id, 'w', w.owner, 0, w.expires_us, ` + now + ` FROM {waiters} w
WHERE w.lock_key = @key AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)`,
		},
		Renew: `UPDATE {holders} SET expires_us = ` + now + ` + @ttl_us
WHERE lease_id = @lease_id AND token = @token AND expires_us > ` + now + `
RETURNING expires_us, ` + now,
		Release:     `DELETE FROM {holders} WHERE lease_id = @lease_id AND (token = @token OR @token = 0) RETURNING lock_key`,
		ClearMarker: `DELETE FROM {waiters} WHERE lock_key = @key AND waiter_id = @lease_id`,
		Fence: `UPDATE {holders} SET expires_us = expires_us
WHERE lease_id = @lease_id AND token = @token AND expires_us > ` + now + `
RETURNING expires_us, ` + now,
		Holders: `SELECT lock_key, mode, lease_id, owner, token, expires_us, ` + now + ` FROM {holders}
WHERE substr(lock_key, 1, length(@key_prefix)) = @key_prefix
UNION ALL
SELECT lock_key, 'w', waiter_id, owner, 0, expires_us, ` + now + ` FROM {waiters}
WHERE substr(lock_key, 1, length(@key_prefix)) = @key_prefix
ORDER BY 1, 5`,
		Sweep: []string{
			`DELETE FROM {waiters} WHERE rowid IN (SELECT rowid FROM {waiters} WHERE expires_us <= ` + now + ` LIMIT @limit)`,
			`DELETE FROM {holders} WHERE rowid IN (SELECT rowid FROM {holders} WHERE expires_us <= ` + now + ` LIMIT @limit)`,
		},
		CountRows: `SELECT (SELECT count(*) FROM {holders}) + (SELECT count(*) FROM {waiters})`,
	}
}
