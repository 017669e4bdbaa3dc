// Package pgdialect is the PostgreSQL dialect of sqlease.
//
// Fencing tokens come from a SEQUENCE, so acquiring one key locks no row that
// another key needs (SPEC S3, S5); a token is the greater of the sequence's
// next value and the database clock in microseconds, the sequence set to it
// when the clock wins (migration 00009), so tokens do not go back when the
// sequence does, after a failover that lost WAL or a restore (SPEC S7).
// Acquire is one call of a plpgsql function installed by the migrations:
// one round trip, and a refused poll writes nothing. Times are clock_timestamp(), evaluated when each statement runs
// (SPEC S2). Fenced writes hold the holder row FOR KEY SHARE; a takeover
// deletes the row and so waits, while a renewal updates only non-key columns
// and does not (SPEC F1, H7).
//
// Importing the package registers the dialect as "postgres"; it is detected
// for the pgx (github.com/jackc/pgx/v5/stdlib, v4) and lib/pq drivers.
// Errors are classified by their SQLSTATE through the
// SQLState() method both drivers' error types have. Push wake-ups (LISTEN)
// use the native pgx connection when the driver is pgx.
//
// "SPEC H3" and the like cite the numbered rules of docs/contract.md in the
// repository, the contract sqlease keeps on every dialect.
package pgdialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqlease/sqlease/dialect"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Name is the registry name of this dialect.
const Name = "postgres"

// Dialect is the PostgreSQL dialect. Its zero value is ready to use.
type Dialect struct{}

var (
	_ dialect.Dialect       = Dialect{}
	_ dialect.DriverMatcher = Dialect{}
	_ dialect.Listener      = Dialect{}
)

func init() { dialect.Register(Dialect{}) }

// New returns the PostgreSQL dialect.
func New() Dialect { return Dialect{} }

// Name returns "postgres".
func (Dialect) Name() string { return Name }

// String returns Name, so a dialect (for example dialect.Detect's result)
// prints as its name with fmt's %v.
func (Dialect) String() string { return Name }

// Capabilities: schemas, row-lock fences bounded by an idle timeout and
// concurrent writers (release notifications and FIFO tickets are derived
// from Listen and Statements.AcquireFIFO). Migrations are
// serialized by MigrationLocker, a table lock (not a session advisory lock,
// which PgBouncer's transaction pooling breaks).
func (Dialect) Capabilities() dialect.Capabilities {
	return dialect.CapSchemas | dialect.CapRowLockFence | dialect.CapConcurrentWriters | dialect.CapFenceIdleTimeout
}

// Listen makes conn LISTEN on channel and delivers notification payloads
// (dialect.Wake payloads of keys released) until ctx ends. It needs the pgx
// driver (v5 stdlib): it
// reaches the native *pgx.Conn through sql.Conn.Raw, unwrapping wrapping
// drivers that have an Unwrap() driver.Conn method. Other drivers get
// errors.ErrUnsupported, and waiters poll. conn must be a direct session:
// a connection through a pooler such as PgBouncer (detected by comparing
// pg_backend_pid() with the process ID the server side announced) gets
// errors.ErrUnsupported too, since in transaction pooling mode it would
// listen in vain.
func (d Dialect) Listen(ctx context.Context, conn *sql.Conn, channel string, deliver func(string), ready func()) error {
	return conn.Raw(func(dc any) error {
		for {
			u, ok := dc.(interface{ Unwrap() driver.Conn })
			if !ok {
				break
			}
			dc = u.Unwrap()
		}
		nc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("pgdialect: driver connection %T cannot receive notifications: %w", dc, errors.ErrUnsupported)
		}
		c := nc.Conn()
		if err := d.listenDirect(ctx, c, channel); err != nil {
			return err
		}
		ready()
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				// The connection may be mid-read: never reuse it.
				_ = c.Close(context.Background())
				return errors.Join(err, driver.ErrBadConn)
			}
			deliver(n.Payload)
		}
	})
}

// QuoteIdent double-quotes name, doubling embedded quotes.
func (Dialect) QuoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Placeholder returns "$n".
func (Dialect) Placeholder(n int) string { return "$" + strconv.Itoa(n) }

// GooseDialect returns "postgres".
func (Dialect) GooseDialect() string { return "postgres" }

// Migrations returns the embedded migration templates.
func (Dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// MatchesDriver claims pgx (v4, v5) and lib/pq.
func (Dialect) MatchesDriver(d driver.Driver) bool {
	p := dialect.DriverPackage(d)
	return strings.HasPrefix(p, "github.com/jackc/pgx/") || p == "github.com/lib/pq"
}

// Classify maps SQLSTATEs: 40001 serialization failure, 40P01 deadlock,
// 55P03 lock not available, 57014 query canceled (statement timeout),
// 57P01..57P03 shutdown, class 08 connection errors, 53300 too many
// connections (a connection refused by the server's or the role's limit),
// and lost connections
// (EOF, failed connects, network errors, pgconn's safe-to-retry errors)
// are retryable; 23505/23P01 are conflicts; 42P01/42883/3F000 (undefined
// table, function or schema) mean the schema is not migrated; SL001
// (SQLStateWrongIsolation) is ErrorIsolation.
func (Dialect) Classify(err error) dialect.ErrorClass {
	if err == nil {
		return dialect.ErrorOther
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		code := st.SQLState()
		switch {
		case code == "40001" || code == "40P01" || code == "55P03" || code == "57014",
			strings.HasPrefix(code, "57P"), strings.HasPrefix(code, "08"),
			// too_many_connections: the server (or the role's CONNECTION
			// LIMIT) refused a new connection; one may free up (SPEC H9).
			code == "53300":
			return dialect.ErrorRetryable
		case code == "23505" || code == "23P01":
			return dialect.ErrorConflict
		case code == "42P01" || code == "42883" || code == "3F000":
			return dialect.ErrorUndefinedTable
		case code == SQLStateWrongIsolation:
			return dialect.ErrorIsolation
		case code == SQLStateFailoverPause:
			return dialect.ErrorFailoverPause
		}
		return dialect.ErrorOther
	}
	if errors.Is(err, pgconn.ErrConnClosed) {
		// The connection closed after a send: the outcome is unknown.
		return dialect.ErrorConnection
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return dialect.ErrorRetryable
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return dialect.ErrorRetryable
	}
	return dialect.ErrorOther
}

// SQLStateWrongIsolation is the SQLSTATE the acquire function raises,
// having done nothing, when its transaction does not run at READ COMMITTED
// (the session defaults to REPEATABLE READ or SERIALIZABLE): its checks need
// a fresh snapshot per statement (SPEC S6). The engine then calls it inside
// BEGIN ISOLATION LEVEL READ COMMITTED.
const SQLStateWrongIsolation = "SL001"

// primaryQuery refuses a hot standby (SPEC S7): a lease granted there
// would not exist on the primary. It names the server as the standby sees
// itself (its address and port, or the local socket). It also refuses
// CockroachDB, whose advisory locks are no-ops (SPEC S1 would not hold).
const primaryQuery = `SELECT pg_is_in_recovery(), CASE
  WHEN version() LIKE 'CockroachDB%' THEN
    'CockroachDB: its advisory-lock functions do nothing, and the acquire function serializes the grants of a key with pg_advisory_xact_lock'
  WHEN pg_is_in_recovery() THEN
    'hot standby at ' || coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'a local socket') ||
    ' (pg_is_in_recovery() is true)' END`

// SQLStateFailoverPause is the SQLSTATE a grant fails with, having written
// nothing, on a primary inside its failover pause (migration 00010; SPEC S7).
const SQLStateFailoverPause = "SL002"

// Statements returns the PostgreSQL statement templates.
func (Dialect) Statements() dialect.Statements {
	return dialect.Statements{
		Primary:    primaryQuery,
		SeePrimary: `SELECT until_us, now_us FROM {primary_seen}(@pause_us)`,
		Isolation:  sql.LevelReadCommitted,
		Acquire: []string{`SELECT granted, lease_id, mode, owner, token, expires_us, now_us
FROM {acquire}(@key, @mode, @lease_id, @owner, @ttl_us::bigint, @marker_us::bigint, @watch_us::bigint, @shared_limit::bigint)`},
		Renew: `UPDATE {holders}
SET expires_at = clock_timestamp() + @ttl_us::bigint * interval '1 microsecond'
WHERE lease_id = @lease_id AND token = @token AND expires_at > clock_timestamp()
RETURNING {to_us}(expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us`,
		// Every listed live lease whose token matches, in one statement.
		RenewBatch: `UPDATE {holders} h
SET expires_at = clock_timestamp() + @ttl_us::bigint * interval '1 microsecond'
FROM (SELECT split_part(v, ':', 1) AS id, split_part(v, ':', 2)::bigint AS token
      FROM jsonb_array_elements_text(@leases::jsonb) AS l(v)) u
WHERE h.lease_id = u.id AND h.token = u.token AND h.expires_at > clock_timestamp()
RETURNING h.lease_id, {to_us}(h.expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us`,
		// Waiters of the key are notified at commit (CapNotify), only when
		// a waiter watches it (NOTIFY serializes committing transactions
		// server-wide, so an unwatched release must not send one): the
		// RETURNING clause calls the {wake} function (migration 00008)
		// only for a watched key, and an unwatched release runs only this
		// DELETE and one watches index lookup. {wake} notifies when no
		// other live holder of the key remains (nothing waiting could be
		// granted then); the payload names the key's marked waiter when
		// there is one (a dialect.Wake payload: chr(30) framing),
		// so only its process wakes it (SPEC W1), and the watch then stays
		// for the waiters not woken. Otherwise the watch is consumed: the
		// woken waiters that stay blocked renew it on their attempt.
		//
		// A release that deletes a row commits without waiting for its WAL
		// flush (synchronous_commit off for this statement's transaction
		// only): a release lost in a server crash or failover leaves the
		// lease to end by expiry (SPEC H5), and the next grant of the key
		// commits synchronously, which flushes the WAL up to and past the
		// release. It saves one disk flush on every release and handoff.
		Release: `DELETE FROM {holders} h
WHERE h.lease_id = @lease_id AND (h.token = @token OR @token::bigint = 0)
RETURNING h.lock_key, set_config('synchronous_commit', 'off', true),
    CASE WHEN EXISTS (SELECT 1 FROM {watches} w WHERE w.lock_key = h.lock_key AND w.expires_at > clock_timestamp())
         THEN {wake}(h.lock_key, @lease_id, @channel) END`,
		ClearMarker: `DELETE FROM {markers} WHERE lock_key = @key AND waiter_id = @lease_id`,
		// The fence also lowers the transaction's
		// idle_in_transaction_session_timeout to the TTL (transaction-local,
		// unless a shorter one is set): the server ends the transaction of
		// a holder stopped or hung between statements, and its row lock
		// with it (CapFenceIdleTimeout).
		Fence: `SELECT {to_us}(h.expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us
FROM {holders} h,
     (SELECT set_config('idle_in_transaction_session_timeout',
                CASE WHEN c.cur > interval '0' AND c.cur <= c.ttl
                     THEN current_setting('idle_in_transaction_session_timeout')
                     ELSE ((@ttl_us::bigint + 999) / 1000)::text END, true)
      FROM (SELECT current_setting('idle_in_transaction_session_timeout')::interval AS cur,
                   @ttl_us::bigint * interval '1 microsecond' AS ttl) c) s
WHERE h.lease_id = @lease_id AND h.token = @token AND h.expires_at > clock_timestamp()
FOR KEY SHARE OF h`,
		Holders: `SELECT lock_key, mode, lease_id, owner, token, {to_us}(expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us
FROM {holders} WHERE starts_with(lock_key, @key_prefix)
UNION ALL
SELECT lock_key, 'w', waiter_id, owner, 0, {to_us}(expires_at), {to_us}(clock_timestamp())
FROM {markers} WHERE starts_with(lock_key, @key_prefix)
UNION ALL
SELECT lock_key, 'q', ticket_id, owner, seq, {to_us}(expires_at), {to_us}(clock_timestamp())
FROM {tickets} WHERE starts_with(lock_key, @key_prefix)
ORDER BY 1, 5`,
		// SKIP LOCKED passes over rows a fenced transaction holds.
		Sweep: []string{`WITH doomed AS (
    SELECT lease_id FROM {holders}
    WHERE expires_at <= clock_timestamp()
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), stale_markers AS (
    DELETE FROM {markers} WHERE lock_key IN (
        SELECT lock_key FROM {markers} WHERE expires_at <= clock_timestamp()
        LIMIT @limit FOR UPDATE SKIP LOCKED)
      AND expires_at <= clock_timestamp()
), stale_watches AS (
    DELETE FROM {watches} WHERE lock_key IN (
        SELECT lock_key FROM {watches} WHERE expires_at <= clock_timestamp()
        LIMIT @limit FOR UPDATE SKIP LOCKED)
      AND expires_at <= clock_timestamp()
), stale_tickets AS (
    DELETE FROM {tickets} WHERE ticket_id IN (
        SELECT ticket_id FROM {tickets} WHERE expires_at <= clock_timestamp()
        LIMIT @limit FOR UPDATE SKIP LOCKED)
      AND expires_at <= clock_timestamp()
)
DELETE FROM {holders} h USING doomed d
WHERE h.lease_id = d.lease_id AND h.expires_at <= clock_timestamp()`},
		CountRows: `SELECT (SELECT count(*) FROM {holders}) + (SELECT count(*) FROM {markers}) + (SELECT count(*) FROM {watches}) + (SELECT count(*) FROM {tickets})`,
		// FIFO waiters (SPEC W6): the function has its own read-only pass.
		AcquireFIFO: []string{`SELECT granted, lease_id, mode, owner, token, expires_us, now_us
FROM {acquire_fifo}(@key, @mode, @lease_id, @owner, @ttl_us::bigint, @marker_us::bigint, @watch_us::bigint, @ticket_id, @ticket_us::bigint, @shared_limit::bigint)`},
		Dequeue: `DELETE FROM {tickets} WHERE ticket_id = @ticket_id`,
	}
}

// SessionID returns pg_backend_pid() of tx's connection. With BlockedBy it
// lets the conformance suite watch lock waits (conformance.LockInspector).
func (Dialect) SessionID(ctx context.Context, tx *sql.Tx) (int64, error) {
	var pid int64
	err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, err
}

// BlockedBy returns the pid of one backend waiting for a lock that backend
// pid holds (pg_blocking_pids), and false when none waits.
func (Dialect) BlockedBy(ctx context.Context, db *sql.DB, pid int64) (int64, bool, error) {
	var waiter int64
	err := db.QueryRowContext(ctx, `SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)) LIMIT 1`, pid).Scan(&waiter)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return waiter, err == nil, err
}
