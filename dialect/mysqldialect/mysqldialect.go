// Package mysqldialect is the MySQL dialect of sqlease, for MySQL 8.0+ and
// MariaDB 10.11+ with InnoDB tables.
//
// Acquire, renew, release and sweep are stored procedures installed by the
// migrations; each runs its own short READ COMMITTED transaction, so the
// session's default isolation (MySQL's REPEATABLE READ included) does not
// matter and no gap lock of one key blocks another (SPEC S5, S6). Grants of
// one key are serialized by a named lock (GET_LOCK) on a hash of the key;
// a fencing token is the greater of the next value of an AUTO_INCREMENT
// counter, which persists across restarts and belongs to no row, and the
// database clock in microseconds, so tokens never go back after a failover
// to a replica that lost grants or a restore of an old dump (SPEC S3, S5,
// S7; migration 00002; keys may share a token since migration 00008, which
// dropped the table-wide token lock). A grant of a key without rows runs
// about half the statements of one that must look for expired holders and
// markers (migration 00008). The failover pause (lock.WithFailoverPause, SPEC
// S7; migration 00003) keeps the server the namespace last saw in a
// one-row table, named by @@server_id with @@server_uuid (MySQL 8) or
// @@hostname:@@port (MariaDB): the acquire procedure grants nothing on
// another server until the pause after it was first seen has ended. Times
// are read from UTC_TIMESTAMP(6) in a statement of their own after every
// lock wait, because MySQL evaluates it once per statement, at its start
// (SPEC S2).
//
// InnoDB has no FOR KEY SHARE, so the expiry of a lease lives in a table of
// its own: a fenced transaction holds the lease's holder row in share mode
// (LOCK IN SHARE MODE), which a takeover must lock exclusively to delete,
// while a renewal only takes a share lock on that row and updates the
// expiry row (SPEC F1, H7). The fence also lowers the session's idle
// timeouts to the TTL, so the server ends a fenced transaction left idle
// that long (migration 00006); an acquire abandoned while its CALL waits
// is stopped with KILL CONNECTION (SPEC H6; cancel.go).
//
// Strict FIFO waiters (lock.FIFO(), SPEC W6; migration 00007) keep a ticket
// row while they wait: its sequence number is an AUTO_INCREMENT value drawn
// under the same per-key named lock as grants, so per key it follows
// arrival order, and the FIFO acquire procedure grants only when no live
// ticket ahead of the caller's conflicts with the request.
//
// A Locker renews the leases due in one CALL per batch of up to 2,500
// (migration 00005: the listed pairs are read with JSON_TABLE, so MySQL
// 8.0.4+ or MariaDB 10.6+), which locks their holder rows in share mode, as
// the one-lease renewal does, and moves every live expiry in one UPDATE
// (SPEC H2, S4): 10,000 leases take 4 or 5 CALLs per renewal interval.
//
// Concurrent migrate.Up calls queue on a row of a lock table, one per
// namespace, shared with goose's MySQL table locker (SPEC D1).
//
// Push wake-ups (SPEC W2; migration 00009, listen.go), on MariaDB only:
// there is no LISTEN/NOTIFY, so a process with blocked waiters keeps one
// listening session per pool and namespace, registered in a table, which
// waits in a statement that a release of a key with blocked waiters
// interrupts with KILL QUERY (after its commit, from inside the release
// procedure); the session then reads the wake rows the releases wrote and
// the engine wakes the waiters of their keys. A refused attempt of a
// blocking acquire marks its key watched; a release of an unwatched key
// costs one index lookup more than before, and an uncontended acquire
// nothing. On MySQL 8, Listen reports errors.ErrUnsupported and waiters
// poll, as they do on every server when the listening session is down.
//
// Importing the package registers the dialect as "mysql"; it is detected for
// the github.com/go-sql-driver/mysql driver. A Namespace schema is a MySQL
// database (created by migrate.Up when missing). DSNs are go-sql-driver
// DSNs, e.g. "user:pass@tcp(host:3306)/db"; no option is required (times
// are integers, so parseTime does not matter).
package mysqldialect

import (
	"context"
	"database/sql/driver"
	"embed"
	"errors"
	"io"
	"io/fs"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/dialect"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Name is the registry name of this dialect.
const Name = "mysql"

// Dialect is the MySQL/MariaDB dialect. Its zero value is ready to use.
type Dialect struct{}

var (
	_ dialect.Dialect             = Dialect{}
	_ dialect.DriverMatcher       = Dialect{}
	_ dialect.MigrationLocker     = Dialect{}
	_ dialect.MigrationLockTabler = Dialect{}
)

func init() { dialect.Register(Dialect{}) }

// New returns the MySQL dialect.
func New() Dialect { return Dialect{} }

// Name returns "mysql".
func (Dialect) Name() string { return Name }

// Capabilities: schemas (MySQL databases), row-lock fences bounded by an
// idle timeout (migration 00006: MariaDB's idle_transaction_timeout,
// MySQL 8's wait_timeout, each in whole seconds) and concurrent writers.
// FIFO waiters (CapFIFO) are derived from Statements.AcquireFIFO and push
// wake-ups (CapNotify) from Listen.
func (Dialect) Capabilities() dialect.Capabilities {
	return dialect.CapSchemas | dialect.CapRowLockFence | dialect.CapConcurrentWriters | dialect.CapFenceIdleTimeout
}

// QuoteIdent back-quotes name, doubling embedded back quotes.
func (Dialect) QuoteIdent(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// Placeholder returns "?": go-sql-driver/mysql binds positionally, so a
// parameter used twice in a template is bound twice (see dialect.Compile).
func (Dialect) Placeholder(int) string { return "?" }

// GooseDialect returns "mysql".
func (Dialect) GooseDialect() string { return "mysql" }

// Migrations returns the embedded migration templates.
func (Dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// MatchesDriver claims github.com/go-sql-driver/mysql.
func (Dialect) MatchesDriver(d driver.Driver) bool {
	return dialect.DriverPackage(d) == "github.com/go-sql-driver/mysql"
}

// MySQL server error numbers used by Classify.
const (
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT (also the per-key lock)
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK
	errLockNowait      = 3572 // ER_LOCK_NOWAIT
	errQueryTimeout    = 3024 // ER_QUERY_TIMEOUT (MySQL max_execution_time)
	errStatementTime   = 1969 // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
	errInterrupted     = 1317 // ER_QUERY_INTERRUPTED
	errShutdown        = 1053 // ER_SERVER_SHUTDOWN
	errConnKilled      = 1927 // ER_CONNECTION_KILLED (MariaDB)
	errTooManyConns    = 1040 // ER_CON_COUNT_ERROR (max_connections)
	errTooManyUserConn = 1203 // ER_TOO_MANY_USER_CONNECTIONS (max_user_connections)
	errUserLimit       = 1226 // ER_USER_LIMIT_REACHED (an account's MAX_USER_CONNECTIONS)
	errDupEntry        = 1062 // ER_DUP_ENTRY
	errNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	errBadDB           = 1049 // ER_BAD_DB_ERROR
	errNoSuchProc      = 1305 // ER_SP_DOES_NOT_EXIST
)

// Classify maps MySQL error numbers: lock wait timeout, deadlock, NOWAIT,
// statement timeouts, interruption and shutdown, a connection refused for
// too many connections (1040, 1203, 1226), a lost connection and any error with
// SQLSTATE 40001 are retryable; a duplicate key is a conflict; an
// unknown table, database or procedure means the schema is not migrated;
// SQLSTATE SL002 (SQLStateFailoverPause) is ErrorFailoverPause.
func (Dialect) Classify(err error) dialect.ErrorClass {
	if err == nil {
		return dialect.ErrorOther
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errLockWaitTimeout, errDeadlock, errLockNowait, errQueryTimeout, errStatementTime,
			errInterrupted, errShutdown, errConnKilled,
			errTooManyConns, errTooManyUserConn, errUserLimit: // a refused connection: one may free up (SPEC H9)
			return dialect.ErrorRetryable
		case errDupEntry:
			return dialect.ErrorConflict
		case errNoSuchTable, errBadDB, errNoSuchProc:
			return dialect.ErrorUndefinedTable
		}
		switch string(me.SQLState[:]) {
		case "40001":
			return dialect.ErrorRetryable
		case SQLStateFailoverPause:
			return dialect.ErrorFailoverPause
		}
		return dialect.ErrorOther
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "40001" {
		return dialect.ErrorRetryable
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) {
		return dialect.ErrorRetryable
	}
	return dialect.ErrorOther
}

// nowUS is the database clock in integer microseconds, evaluated when the
// statement starts.
const nowUS = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// primaryQuery tells whether this server can take locks (Statements.Primary):
// one row (read_only, reason). read_only is 1, with a reason naming the
// server, on a read-only server, which is a replica (or a primary
// being demoted): its grants would be lost at the next failover, and its
// tables only change through replication. MySQL 8's super_read_only needs
// no check of its own: enabling it enables read_only (MariaDB has only
// read_only). read_only is 0 with a reason on a Galera cluster node
// (wsrep_on = ON): the acquire procedure serializes the grants of a key
// with a named lock, GET_LOCK (SPEC S1, S3), and Galera does not
// replicate named locks to the other nodes, so two nodes could grant one
// key at once. Otherwise 0 and an empty reason.
//
// @@wsrep_on always exists on MariaDB but not on MySQL (unless built with
// Galera), where reading an unknown variable fails. So the test is written
// twice in version comments: MariaDB runs the body of /*M!100000 ... */,
// which MySQL skips as a comment; MySQL 8 runs /*!80000 ... */, which
// MariaDB 10.11 does not (checked: SELECT 1 /*!80000 +1 */ is 1 there), and
// reads the variable from performance_schema.global_variables, readable by
// every user and present whatever performance_schema is set to. That table
// is missing on MariaDB when performance_schema is off, hence the split.
const primaryQuery = `SELECT IF(@@global.read_only, 1, 0) AS read_only,
  CASE
    WHEN @@global.read_only THEN CONCAT('server ', @@hostname, ':', @@port,
      ' (read_only=ON)')
    WHEN 0 /*M!100000 OR @@global.wsrep_on */ /*!80000 OR COALESCE((SELECT variable_value FROM performance_schema.global_variables WHERE variable_name = 'wsrep_on'), 'OFF') = 'ON' */
      THEN CONCAT('server ', @@hostname, ':', @@port,
      ' is a Galera cluster node (wsrep_on=ON): the MySQL dialect serializes the grants of a key with GET_LOCK, which Galera does not replicate to the other nodes')
    WHEN VERSION() LIKE '%TiDB%' THEN CONCAT('server ', @@hostname, ':', @@port,
      ' is TiDB: the MySQL dialect needs stored procedures, which TiDB does not have')
    ELSE ''
  END AS reason`

// SQLStateFailoverPause is the SQLSTATE a grant fails with (SIGNAL in the
// acquire procedure, error number 1644), having written nothing, on a
// server inside its failover pause (migration 00003; SPEC S7).
const SQLStateFailoverPause = "SL002"

// Statements returns the MySQL statement templates.
func (Dialect) Statements() dialect.Statements {
	return dialect.Statements{
		Primary:     primaryQuery,
		SeePrimary:  `CALL {primary_seen}(@pause_us)`,
		Acquire:     []string{`CALL {acquire_limit}(@key, @mode, @lease_id, @owner, @ttl_us, @marker_us, @watch_us, @shared_limit)`},
		Renew:       `CALL {renew}(@lease_id, @token, @ttl_us)`,
		RenewBatch:  `CALL {renew_batch}(@leases, @ttl_us)`,
		Release:     `CALL {release}(@lease_id, @token)`,
		ClearMarker: `CALL {clear_marker}(@key, @lease_id)`,
		// The fence procedure (migration 00006) locks the holder row
		// only: rows a subquery reads are not locked, so renewals (which
		// update the expiry row) are not blocked, and a takeover (which
		// deletes the holder row) is. On MariaDB it also lowers the
		// session's idle-transaction timeouts to the TTL in whole seconds,
		// so the server ends a fenced transaction left idle that long
		// (CapFenceIdleTimeout); FenceEnd puts them back.
		Fence:    `CALL {fence}(@lease_id, @token, @ttl_us)`,
		FenceEnd: `CALL {fence_end}()`,
		Holders: `SELECT h.lock_key, h.mode, h.lease_id, h.owner, h.token, e.expires_us, ` + nowUS + ` AS now_us
FROM {holders} h JOIN {expiry} e ON e.lease_id = h.lease_id
WHERE LEFT(h.lock_key, LENGTH(@key_prefix)) = @key_prefix
UNION ALL
SELECT m.lock_key, 'w', m.waiter_id, m.owner, 0, m.expires_us, ` + nowUS + `
FROM {markers} m WHERE LEFT(m.lock_key, LENGTH(@key_prefix)) = @key_prefix
UNION ALL
SELECT t.lock_key, 'q', t.ticket_id, t.owner, t.seq, t.expires_us, ` + nowUS + `
FROM {tickets} t WHERE LEFT(t.lock_key, LENGTH(@key_prefix)) = @key_prefix
ORDER BY 1, 5`,
		// Expired tickets, then the holders and markers of {sweep}
		// (migration 00007).
		Sweep:             []string{`CALL {sweep_fifo}(@limit)`},
		SweepReturnsCount: true,
		CountRows:         `SELECT (SELECT COUNT(*) FROM {holders}) + (SELECT COUNT(*) FROM {expiry}) + (SELECT COUNT(*) FROM {markers}) + (SELECT COUNT(*) FROM {tickets})`,
		// FIFO waiters (SPEC W6; migration 00007): tickets are drawn
		// under the same per-key lock as Acquire's grants.
		AcquireFIFO: []string{`CALL {acquire_fifo}(@key, @mode, @lease_id, @owner, @ttl_us, @marker_us, @watch_us, @ticket_id, @ticket_us, @shared_limit)`},
		Dequeue:     `CALL {dequeue}(@ticket_id)`,
	}
}
