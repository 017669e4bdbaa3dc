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
// for modernc.org/sqlite (pure Go, driver "sqlite", builds with
// CGO_ENABLED=0) and github.com/mattn/go-sqlite3 (cgo, driver "sqlite3").
// The package imports neither driver: the program imports the one it uses,
// and errors are classified through ResultCode, which reads both drivers'
// error types without linking them.
//
// # DSN
//
// Use WAL journal mode for concurrent readers and a busy timeout so writers
// queue instead of failing with SQLITE_BUSY. Both drivers accept mattn's
// query keys (modernc.org/sqlite does in v1.62.0, the version tested):
//
//	file:/var/lib/app/locks.db?_journal_mode=WAL&_busy_timeout=5000&_pragma=journal_size_limit(4194304)
//
// modernc.org/sqlite also accepts the long form
// _pragma=journal_mode(WAL)&_pragma=busy_timeout(5000), which mattn
// ignores. A busy timeout of at most 5 s (the default release timeout)
// saves two statements per release: the engine must otherwise shorten the
// connection's busy timeout around it, since SQLite's busy handler cannot
// be interrupted (dialect.LockWaiter). Adding _txlock=immediate (both drivers) makes database/sql
// transactions begin with BEGIN IMMEDIATE; the engine's own write scripts
// always do (Statements.BeginWrite), and a fenced transaction's first
// statement is a write, so neither needs it.
//
// The last key keeps the WAL file from staying at the largest size it
// ever reached (journal_size_limit is set per connection; mattn ignores
// _pragma and has no key for it: set it in a ConnectHook, as
// docs/operations.md, "WAL size", shows).
//
// "SPEC H3" and the like cite the numbered rules of docs/contract.md in the
// repository, the contract sqlease keeps on every dialect.
package sqlitedialect

import (
	"database/sql/driver"
	"embed"
	"errors"
	"io/fs"
	"reflect"
	"strconv"
	"strings"

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

// String returns Name, so a dialect (for example dialect.Detect's result)
// prints as its name with fmt's %v.
func (Dialect) String() string { return Name }

// Capabilities: write-lock fences (no schemas, one writer at a time; FIFO
// tickets are derived from Statements.AcquireFIFO).
func (Dialect) Capabilities() dialect.Capabilities {
	return dialect.CapWriteLockFence
}

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

// SQLite primary result codes used by Classify (the low byte of an extended
// result code).
const (
	codeBusy       = 5
	codeLocked     = 6
	codeConstraint = 19
)

// Classify: SQLITE_BUSY and SQLITE_LOCKED (and a lost connection) are
// retryable, SQLITE_CONSTRAINT is a conflict, "no such table" means the
// schema is not migrated. Extended result codes (SQLITE_BUSY_SNAPSHOT,
// SQLITE_CONSTRAINT_UNIQUE, ...) count as their primary code. See
// ResultCode for how the code is read without importing a driver.
func (Dialect) Classify(err error) dialect.ErrorClass {
	if err == nil {
		return dialect.ErrorOther
	}
	code, _ := ResultCode(err)
	switch code & 0xff {
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

// ResultCode returns the SQLite result code carried by err or by an error it
// wraps (errors.As), extended when the driver reports one (for example 517,
// SQLITE_BUSY_SNAPSHOT; the primary code is code & 0xff), and whether one
// was found. The package imports no driver, so a program built with
// CGO_ENABLED=0 on modernc.org/sqlite links no cgo, and a mattn program does
// not link modernc:
//
//   - modernc.org/sqlite: its *sqlite.Error has a Code() int method; any
//     error with that method is read through it.
//   - github.com/mattn/go-sqlite3: its sqlite3.Error has no method carrying
//     the code, only the exported fields ExtendedCode and Code. They are
//     read by reflection, and only from a struct type named Error declared
//     in package github.com/mattn/go-sqlite3 (value or pointer). A
//     build-tagged adapter could not tell which driver a program uses:
//     tagged on cgo it would link mattn's C SQLite into every cgo build of
//     a modernc program.
func ResultCode(err error) (int, bool) {
	for _, e := range chain(err) {
		if c, ok := e.(interface{ Code() int }); ok {
			return c.Code(), true
		}
		if code, ok := mattnCode(e); ok {
			return code, true
		}
	}
	return 0, false
}

// mattnPackage is the import path of github.com/mattn/go-sqlite3.
const mattnPackage = "github.com/mattn/go-sqlite3"

// mattnCode reads the result code of a mattn sqlite3.Error (value or
// pointer): ExtendedCode when set, else Code.
func mattnCode(err error) (int, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 0, false
		}
		v = v.Elem()
	}
	t := v.Type()
	if v.Kind() != reflect.Struct || t.Name() != "Error" || t.PkgPath() != mattnPackage {
		return 0, false
	}
	field := func(name string) (int, bool) {
		f := v.FieldByName(name)
		if !f.IsValid() || !f.CanInt() {
			return 0, false
		}
		return int(f.Int()), true
	}
	if ext, ok := field("ExtendedCode"); ok && ext != 0 {
		return ext, true
	}
	return field("Code")
}

// chain lists err and every error it wraps, depth first (Unwrap() error and
// Unwrap() []error), as errors.As walks them.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		for e != nil && len(out) < 64 {
			out = append(out, e)
			switch u := e.(type) {
			case interface{ Unwrap() []error }:
				for _, x := range u.Unwrap() {
					walk(x)
				}
				return
			case interface{ Unwrap() error }:
				e = u.Unwrap()
			default:
				return
			}
		}
	}
	walk(err)
	return out
}

// now is the database clock in integer microseconds (millisecond resolution).
const now = `(CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000)`

// nextToken is the fencing token of a grant, read from the counter row c: a
// hybrid clock, greater than the last token granted (the counter row, which
// the token_bump trigger advances; SPEC S3) and at least the database clock
// in microseconds. A database file restored from an older copy has an older
// counter, but its clock has moved on past every token the lost grants took,
// so tokens never go back (SPEC S7): that assumes the clock of the machine
// that opens the restored file is not behind the old one's by more than the
// time since the copy was taken.
const nextToken = `max(c.value + 1, ` + now + `)`

// mySeq is the FIFO caller's place in the queue of its key: its live
// ticket's sequence number, or past every ticket when it has none (a try).
const mySeq = `coalesce((SELECT seq FROM {tickets} WHERE ticket_id = @ticket_id AND expires_us > ` + now + `), 9223372036854775807)`

// ticketsAhead selects the live tickets of @key ahead of the caller's that
// conflict with @mode (SPEC W6); for a semaphore acquire every ticket ahead
// does, so semaphore waiters are admitted in arrival order (SPEC W7).
const ticketsAhead = `FROM {tickets} t
WHERE t.lock_key = @key AND t.expires_us > ` + now + ` AND t.ticket_id <> @ticket_id
  AND (t.mode = 'x' OR @mode = 'x' OR @shared_limit > 0) AND t.seq < ` + mySeq

// full and fullLive are true when the request is a semaphore acquire
// (@shared_limit > 0, SPEC W7) and @key has at least @shared_limit holder
// rows (full, for the Acquire scripts, which run after the takeover of
// expired rows under the write lock, so the count cannot change before
// their insert) or live holders (fullLive, for the read-only probes).
// A request without a limit never reads the count.
const (
	full     = `@shared_limit > 0 AND @shared_limit <= (SELECT count(*) FROM {holders} f WHERE f.lock_key = @key)`
	fullLive = `@shared_limit > 0 AND @shared_limit <= (SELECT count(*) FROM {holders} f WHERE f.lock_key = @key AND f.expires_us > ` + now + `)`
)

// probeHolder and probeMarker select, for Probe, the live holders that
// conflict with @mode (every one when a semaphore is full) and the live
// marker of another waiter of @key.
const (
	probeHolder = `h.lock_key = @key AND h.expires_us > ` + now + ` AND (h.mode = 'x' OR @mode = 'x' OR ` + fullLive + `)`
	probeMarker = `m.lock_key = @key AND m.expires_us > ` + now + ` AND m.waiter_id <> @lease_id`
)

// Statements returns the SQLite statement templates.
func (Dialect) Statements() dialect.Statements {
	return dialect.Statements{
		BeginWrite: "BEGIN IMMEDIATE",
		Acquire: []string{
			// Takeover of expired holders and markers of this key.
			`DELETE FROM {holders} WHERE lock_key = @key AND expires_us <= ` + now,
			`DELETE FROM {markers} WHERE lock_key = @key AND expires_us <= ` + now,
			// Grant when nothing blocks; the token_bump trigger advances
			// the counter row to the new token.
			`INSERT INTO {holders} (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
SELECT @lease_id, @key, @mode, @owner, ` + nextToken + `, ` + now + `, ` + now + ` + @ttl_us
FROM {counter} c
WHERE c.id = 1
  AND @mode IN ('x', 's')
  AND NOT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x'))
  AND NOT EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = @key AND m.waiter_id <> @lease_id)
  AND NOT (` + full + `)`,
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
WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x' OR ` + full + `)
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
UNION ALL
SELECT lock_key, 'q', ticket_id, owner, seq, expires_us, ` + now + `
FROM {tickets} WHERE substr(lock_key, 1, length(@key_prefix)) = @key_prefix
ORDER BY 1, 5`,
		Sweep: []string{
			`DELETE FROM {markers} WHERE rowid IN (SELECT rowid FROM {markers} WHERE expires_us <= ` + now + ` LIMIT @limit)`,
			`DELETE FROM {tickets} WHERE seq IN (SELECT seq FROM {tickets} WHERE expires_us <= ` + now + ` LIMIT @limit)`,
			// The holder table has no rowid and no expiry index
			// (migration 00004): the batch is found by a scan.
			`DELETE FROM {holders} WHERE lease_id IN (SELECT lease_id FROM {holders} WHERE expires_us <= ` + now + ` LIMIT @limit)`,
		},
		CountRows: `SELECT (SELECT count(*) FROM {holders}) + (SELECT count(*) FROM {markers}) + (SELECT count(*) FROM {tickets})`,
		AcquireFIFO: []string{
			`DELETE FROM {holders} WHERE lock_key = @key AND expires_us <= ` + now,
			`DELETE FROM {markers} WHERE lock_key = @key AND expires_us <= ` + now,
			`DELETE FROM {tickets} WHERE lock_key = @key AND expires_us <= ` + now,
			// Take a place at the end of the queue, or keep ours.
			`INSERT INTO {tickets} (ticket_id, lock_key, mode, owner, queued_us, expires_us)
SELECT @ticket_id, @key, @mode, @owner, ` + now + `, ` + now + ` + @ticket_us
WHERE @ticket_us > 0 AND @mode IN ('x', 's')
ON CONFLICT (ticket_id) DO UPDATE SET expires_us = excluded.expires_us`,
			`INSERT INTO {holders} (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
SELECT @lease_id, @key, @mode, @owner, ` + nextToken + `, ` + now + `, ` + now + ` + @ttl_us
FROM {counter} c
WHERE c.id = 1
  AND @mode IN ('x', 's')
  AND NOT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x'))
  AND NOT EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = @key AND m.waiter_id <> @lease_id)
  AND NOT (` + full + `)
  AND NOT EXISTS (SELECT 1 ` + ticketsAhead + `)`,
			// Only the head of the queue claims the key against readers
			// that do not queue.
			`INSERT INTO {markers} (lock_key, waiter_id, owner, expires_us)
SELECT @key, @lease_id, @owner, ` + now + ` + @marker_us
WHERE @mode = 'x' AND @marker_us > 0 AND NOT EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)
  AND NOT EXISTS (SELECT 1 ` + ticketsAhead + `)
ON CONFLICT (lock_key) DO UPDATE SET expires_us = excluded.expires_us
WHERE waiter_id = excluded.waiter_id`,
			`DELETE FROM {markers} WHERE lock_key = @key AND waiter_id = @lease_id
  AND EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)`,
			`DELETE FROM {tickets} WHERE ticket_id = @ticket_id
  AND EXISTS (SELECT 1 FROM {holders} WHERE lease_id = @lease_id)`,
			`SELECT 1 AS granted, lease_id, mode, owner, token, expires_us, ` + now + ` AS now_us
FROM {holders} WHERE lease_id = @lease_id
UNION ALL
SELECT 0, h.lease_id, h.mode, h.owner, h.token, h.expires_us, ` + now + `
FROM {holders} h
WHERE h.lock_key = @key AND (h.mode = 'x' OR @mode = 'x' OR ` + full + `)
  AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)
UNION ALL
SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
FROM {markers} m
WHERE m.lock_key = @key AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)
UNION ALL
SELECT 0, t.ticket_id, 'q', t.owner, t.seq, t.expires_us, ` + now + `
` + ticketsAhead + `
  AND NOT EXISTS (SELECT 1 FROM {holders} g WHERE g.lease_id = @lease_id)`,
		},
		Dequeue: `DELETE FROM {tickets} WHERE ticket_id = @ticket_id`,
	}
}

// FastPath returns SQLite's one-statement shortcuts (dialect.FastPather):
// the Acquire script takes the database's one write lock, so a refused
// poll is a read (Probe, ProbeFIFO), an uncontended grant one statement
// (Grant) and a marker refresh one statement (Mark).
func (Dialect) FastPath() dialect.FastPath {
	return dialect.FastPath{
		// A refused poll is one read, without the write lock.
		//
		// No CTE and no INSERT ... SELECT on the hot path: SQLite
		// materializes a CTE read twice, and the SELECT of an INSERT that
		// reads the target table, into an ephemeral table, which costs
		// several times the statement itself (a fresh page cache per run).
		Probe: `SELECT 0 AS granted, h.lease_id, h.mode, h.owner, h.token, h.expires_us, ` + now + ` AS now_us
FROM {holders} h
WHERE ` + probeHolder + `
UNION ALL
SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
FROM {markers} m
WHERE ` + probeMarker + `
UNION ALL
SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
FROM {markers} m
WHERE m.lock_key = @key AND m.waiter_id = @lease_id AND m.expires_us > ` + now + `
  AND (EXISTS (SELECT 1 FROM {holders} h WHERE ` + probeHolder + `)
    OR EXISTS (SELECT 1 FROM {markers} m WHERE ` + probeMarker + `))`,
		// FIFO waiters (SPEC W6): a refused poll is one read.
		ProbeFIFO: `WITH b AS (
    SELECT 0 AS granted, h.lease_id, h.mode, h.owner, h.token, h.expires_us, ` + now + ` AS now_us
    FROM {holders} h
    WHERE ` + probeHolder + `
    UNION ALL
    SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
    FROM {markers} m
    WHERE m.lock_key = @key AND m.expires_us > ` + now + ` AND m.waiter_id <> @lease_id
    UNION ALL
    SELECT 0, t.ticket_id, 'q', t.owner, t.seq, t.expires_us, ` + now + `
    ` + ticketsAhead + `
)
SELECT * FROM b
UNION ALL
SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us, ` + now + `
FROM {markers} m
WHERE m.lock_key = @key AND m.waiter_id = @lease_id AND m.expires_us > ` + now + ` AND EXISTS (SELECT 1 FROM b)`,
		// The uncontended grant in one autocommit statement: expired
		// holders and markers do not block it, and the takeover trigger
		// deletes them (and the caller's own marker) in the same
		// statement. The write lock is taken at the statement's start, so
		// the checks and the insert see one state (SPEC S1, S3).
		// A refused grant inserts nothing: a live conflicting holder or
		// another waiter's live marker makes mode NULL, a NOT NULL
		// violation that OR IGNORE turns into "no row" (as it does for a
		// mode other than 'x' or 's', the CHECK). A single-row VALUES
		// reads the tables before the insert without an ephemeral copy.
		// OR IGNORE would also turn a lease ID that already has a row into
		// "no row": the engine never sends one (IDs are random and never
		// reused). TestGrantDifferential compares it with the INSERT ...
		// SELECT form it replaced.
		Grant: `INSERT OR IGNORE INTO {holders} (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
VALUES (@lease_id, @key,
  CASE WHEN EXISTS (SELECT 1 FROM {holders} h
                    WHERE h.lock_key = @key AND h.expires_us > ` + now + ` AND (h.mode = 'x' OR @mode = 'x'))
         OR EXISTS (SELECT 1 FROM {markers} m
                    WHERE m.lock_key = @key AND m.expires_us > ` + now + ` AND m.waiter_id <> @lease_id)
       THEN NULL ELSE @mode END,
  @owner, (SELECT ` + nextToken + ` FROM {counter} c WHERE c.id = 1), ` + now + `, ` + now + ` + @ttl_us)
RETURNING 1 AS granted, lease_id, mode, owner, token, expires_us, ` + now + ` AS now_us`,
		// A marker refresh in one statement: set, refresh, or take over
		// an expired marker of another waiter.
		Mark: `INSERT INTO {markers} (lock_key, waiter_id, owner, expires_us)
SELECT @key, @lease_id, @owner, ` + now + ` + @marker_us
WHERE @mode = 'x' AND @marker_us > 0
ON CONFLICT (lock_key) DO UPDATE SET waiter_id = excluded.waiter_id, owner = excluded.owner, expires_us = excluded.expires_us
WHERE waiter_id = excluded.waiter_id OR expires_us <= ` + now + `
RETURNING expires_us, ` + now + ` AS now_us`,
	}
}
