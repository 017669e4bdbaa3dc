// Package pgdialect is the PostgreSQL dialect of sqlease.
//
// Fencing tokens come from a SEQUENCE, so acquiring one key locks no row that
// another key needs (SPEC S3, S5). Acquire is one call of a plpgsql function
// installed by the migrations: one round trip, and a refused poll writes
// nothing. Times are clock_timestamp(), evaluated when each statement runs
// (SPEC S2). Fenced writes hold the holder row FOR KEY SHARE; a takeover
// deletes the row and so waits, while a renewal updates only non-key columns
// and does not (SPEC F1, H7).
//
// Importing the package registers the dialect as "postgres"; it is detected
// for the pgx (github.com/jackc/pgx/v5/stdlib, v4) and lib/pq drivers.
// Errors are classified by their SQLSTATE through the
// SQLState() method both drivers' error types have. Push wake-ups (LISTEN)
// use the native pgx connection when the driver is pgx.
package pgdialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

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

// Capabilities: schemas, row-lock fences, concurrent writers, and migrations
// serialized by a session advisory lock.
func (Dialect) Capabilities() dialect.Capabilities {
	return dialect.CapSchemas | dialect.CapRowLockFence | dialect.CapConcurrentWriters | dialect.CapSessionLockedMigrations | dialect.CapNotify
}

// Listen makes conn LISTEN on channel and delivers notification payloads
// (keys released) until ctx ends. It needs the pgx driver (v5 stdlib): it
// reaches the native *pgx.Conn through sql.Conn.Raw, unwrapping wrapping
// drivers that have an Unwrap() driver.Conn method. Other drivers get
// errors.ErrUnsupported, and waiters poll.
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
		if _, err := c.Exec(ctx, "LISTEN "+d.QuoteIdent(channel)); err != nil {
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
// 57P01..57P03 shutdown, class 08 connection errors, and lost connections
// are retryable; 23505/23P01 are conflicts; 42P01/42883/3F000 (undefined
// table, function or schema) mean the schema is not migrated.
func (Dialect) Classify(err error) dialect.ErrorClass {
	if err == nil {
		return dialect.ErrorOther
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		code := st.SQLState()
		switch {
		case code == "40001" || code == "40P01" || code == "55P03" || code == "57014",
			strings.HasPrefix(code, "57P"), strings.HasPrefix(code, "08"):
			return dialect.ErrorRetryable
		case code == "23505" || code == "23P01":
			return dialect.ErrorConflict
		case code == "42P01" || code == "42883" || code == "3F000":
			return dialect.ErrorUndefinedTable
		}
		return dialect.ErrorOther
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) {
		return dialect.ErrorRetryable
	}
	return dialect.ErrorOther
}

// Statements returns the PostgreSQL statement templates.
func (Dialect) Statements() dialect.Statements {
	return dialect.Statements{
		Acquire: []string{`SELECT granted, lease_id, mode, owner, token, expires_us, now_us
FROM {acquire}(@key, @mode, @lease_id, @owner, @ttl_us::bigint, @marker_us::bigint, @watch_us::bigint)`},
		Renew: `UPDATE {holders}
SET expires_at = clock_timestamp() + @ttl_us::bigint * interval '1 microsecond'
WHERE lease_id = @lease_id AND token = @token AND expires_at > clock_timestamp()
RETURNING {to_us}(expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us`,
		// The idle key row is removed only when no one holds its lock
		// (SKIP LOCKED): release never waits behind an acquire.
		RenewBatch: `UPDATE {holders} h
SET expires_at = clock_timestamp() + @ttl_us::bigint * interval '1 microsecond'
FROM (SELECT split_part(v, ':', 1) AS id, split_part(v, ':', 2)::bigint AS token
      FROM jsonb_array_elements_text(@leases::jsonb) AS l(v)) u
WHERE h.lease_id = u.id AND h.token = u.token AND h.expires_at > clock_timestamp()
RETURNING h.lease_id, {to_us}(h.expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us`,
		// Waiters of the key are notified at commit (CapNotify), only when
		// a waiter watches it: NOTIFY serializes committing transactions
		// server-wide, so an unwatched release must not send one. The
		// watch is consumed; waiters still blocked renew it on their next
		// poll.
		Release: `WITH gone AS (
    DELETE FROM {holders} WHERE lease_id = @lease_id AND (token = @token OR @token::bigint = 0)
    RETURNING lock_key
), woke AS (
    DELETE FROM {watches} w USING gone g
    WHERE w.lock_key = g.lock_key
    RETURNING w.lock_key, w.expires_at
)
SELECT g.lock_key,
       CASE WHEN EXISTS (SELECT 1 FROM woke WHERE woke.lock_key = g.lock_key AND woke.expires_at > clock_timestamp())
            THEN pg_notify(@channel, g.lock_key) END
FROM gone g`,
		ClearMarker: `DELETE FROM {markers} WHERE lock_key = @key AND waiter_id = @lease_id`,
		Fence: `SELECT {to_us}(expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us
FROM {holders}
WHERE lease_id = @lease_id AND token = @token AND expires_at > clock_timestamp()
FOR KEY SHARE`,
		Holders: `SELECT lock_key, mode, lease_id, owner, token, {to_us}(expires_at) AS expires_us, {to_us}(clock_timestamp()) AS now_us
FROM {holders} WHERE starts_with(lock_key, @key_prefix)
UNION ALL
SELECT lock_key, 'w', waiter_id, owner, 0, {to_us}(expires_at), {to_us}(clock_timestamp())
FROM {markers} WHERE starts_with(lock_key, @key_prefix)
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
)
DELETE FROM {holders} h USING doomed d
WHERE h.lease_id = d.lease_id AND h.expires_at <= clock_timestamp()`},
		CountRows: `SELECT (SELECT count(*) FROM {holders}) + (SELECT count(*) FROM {markers}) + (SELECT count(*) FROM {watches})`,
	}
}
