// Package dialect is the extension point through which sqlease supports a
// database: a Dialect contributes the SQL text of every engine operation, the
// goose migrations that create the lock tables, identifier quoting and error
// classification. The engine in package lock runs that SQL and never branches
// on a dialect's name, only on its capabilities (CapabilitiesOf).
//
// The built-in dialects live in dialect/pgdialect (PostgreSQL),
// dialect/mysqldialect (MySQL, MariaDB) and dialect/sqlitedialect (SQLite). A third-party dialect is a value that
// implements Dialect, registered with Register, and proven with one
// conformance.Run call; nothing in this module has to change.
//
// # Templates
//
// Statement and migration texts are templates. Two kinds of marker are
// rendered once, when a lock.Locker is built or migrations run:
//
//   - {name} names a database object (table, sequence, function) of the lock
//     schema. It renders to the dialect's quoted identifier for the
//     configured Namespace: "schema"."prefix" + name, or "prefix" + name.
//   - @param names a bound parameter of the operation (Statement parameters
//     are listed on Statements). It renders to the dialect's Placeholder(n),
//     numbered in order of first use, so the engine binds positional
//     arguments on every driver; keys are never pasted into SQL (SPEC D3).
//     With numbered placeholders ("$1", "?1") a repeated parameter reuses
//     its number; with plain "?" every use is a placeholder of its own.
//
// Markers inside quoted strings, quoted identifiers and comments are not
// rendered, nor are @@name (MySQL system variables) and @name when name is
// not a parameter of the operation (MySQL user variables); see Compile.
// Migration templates are rendered with RenderNames, which replaces every
// {name}, quoted or not (so a migration can write '{holders}' to get the
// quoted table name as a string).
//
// # Stability
//
// The Dialect interface, Statements, Capabilities and ErrorClass are a public
// extension point: new operations are added as new Statements fields (a
// dialect that leaves one empty declares the operation unsupported, and the
// engine reports errors.ErrUnsupported for it), never as new interface
// methods.
//
// "SPEC H3" and the like cite the numbered rules of docs/contract.md in the
// repository, the contract sqlease keeps on every dialect.
package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/pressly/goose/v3/lock"
)

// Dialect is the SQL a database contributes to the shared engine.
// Implementations must be safe for concurrent use; the built-ins are
// stateless values.
type Dialect interface {
	// Name is the registry name ("postgres", "sqlite"): lower case, unique.
	Name() string
	// Capabilities declares what the dialect's SQL supports that the
	// engine cannot see from what it implements (CapNotify and CapFIFO are
	// derived instead: see CapabilitiesOf, which the engine and the
	// conformance suite branch on).
	Capabilities() Capabilities
	// QuoteIdent quotes one identifier (no dots) for use in SQL text.
	QuoteIdent(name string) string
	// Placeholder returns the text of the n-th (1-based) bound parameter,
	// for example "$1" or "?1".
	Placeholder(n int) string
	// Statements returns the statement templates of every engine operation.
	Statements() Statements
	// Migrations returns the goose SQL migration templates (files named
	// NNNNN_name.sql), rendered with the same {name} markers as statements.
	Migrations() fs.FS
	// GooseDialect is the goose dialect name used for the version table
	// ("postgres", "sqlite3").
	GooseDialect() string
	// Classify maps a driver error to an ErrorClass. It must not need the
	// engine to import any driver.
	Classify(err error) ErrorClass
}

// MigrationLocker is implemented by dialects that can serialize concurrent
// migrate runs (SPEC D1): it returns a goose lock.Locker
// (github.com/pressly/goose/v3/lock) for the namespace ns, which package
// migrate passes to goose.WithLocker. The lock must not be session state: it
// must work through PgBouncer in transaction pooling mode (PostgreSQL uses
// goose's table locker, MySQL goose's MySQL table locker).
type MigrationLocker interface {
	MigrationLocker(ns Namespace) (lock.Locker, error)
}

// MigrationLockTabler is implemented by a MigrationLocker whose lock lives
// in a table of the namespace: MigrationLockTable returns that table's name
// without the namespace's prefix and schema (for example "migration_lock"
// for "<prefix>migration_lock"), so that migrate.Drop removes it with the
// rest of the namespace (SPEC D1).
type MigrationLockTabler interface {
	MigrationLockTable() string
}

// MigrationPoolChecker is an optional interface: migrate.Up calls
// CheckMigrationPool before it writes anything (no CREATE SCHEMA first), so
// a pool the migrations cannot run on is refused with nothing written. It
// must only read.
type MigrationPoolChecker interface {
	CheckMigrationPool(ctx context.Context, db *sql.DB) error
}

// DriverMatcher is an optional interface: a Dialect that implements it takes
// part in Detect, claiming the database/sql drivers it knows.
type DriverMatcher interface {
	MatchesDriver(d driver.Driver) bool
}

// Capabilities is a set of Capability flags.
type Capabilities uint64

// Capability is one optional feature of a dialect's SQL.
type Capability = Capabilities

const (
	// CapSchemas: objects can live in a named schema (Namespace.Schema).
	// Without it, only a table prefix is accepted.
	CapSchemas Capability = 1 << iota
	// CapRowLockFence: Statements.Fence locks the holder row inside the
	// caller's transaction so that a takeover waits for it and renewals do
	// not (PostgreSQL FOR KEY SHARE; MySQL a shared lock on a row renewals
	// do not update) (SPEC F1, H7).
	CapRowLockFence
	// CapWriteLockFence: Statements.Fence is a write that takes the
	// database-wide write lock for the rest of the caller's transaction
	// (SQLite). Renewals of every lease wait behind a fenced transaction.
	CapWriteLockFence
	// CapConcurrentWriters: several connections can write at the same
	// moment (PostgreSQL). Without it the database serializes writers and
	// tests that need two concurrent write transactions are skipped.
	CapConcurrentWriters
	// CapNotify is derived, never declared: CapabilitiesOf sets it when the
	// dialect implements Listener (Release then notifies waiters on
	// @channel, so they are woken at once instead of at their next poll).
	CapNotify
	// CapFIFO is derived, never declared: CapabilitiesOf sets it when
	// Statements.AcquireFIFO is set (with Dequeue, and tickets listed in
	// Holders), so acquires can wait in a strict FIFO queue of ticket rows
	// per key (SPEC W6).
	CapFIFO
	// CapFenceIdleTimeout: Statements.Fence makes the database end the
	// caller's transaction when it sits idle for about the lease TTL
	// (PostgreSQL: a transaction-local idle_in_transaction_session_timeout),
	// so a holder stopped or hung inside a fenced transaction blocks
	// takeover for about one TTL, not for as long as it is stopped
	// (SPEC F1).
	CapFenceIdleTimeout
)

// Listener is implemented by dialects with push wake-ups (CapNotify, which
// implementing it gives): Listen turns conn
// (a connection the engine dedicates to it) into a listener on channel,
// calls ready once it listens, then calls deliver with the payload (see
// Wake and ParseWake) of every notification until ctx ends or the connection fails. It returns
// an error matching errors.ErrUnsupported when the connection's driver
// cannot receive notifications (the engine then polls).
type Listener interface {
	Listen(ctx context.Context, conn *sql.Conn, channel string, deliver func(payload string), ready func()) error
}

// ChangeWatcher is implemented by dialects that can see commits to the
// database without sending a statement (SQLite on Linux: inotify on the
// database's directory). WatchChanges finds the database through db (it may
// borrow a connection briefly and holds none while it watches), calls ready
// once it watches, then calls changed after commits by any connection or
// process (at least once after each commit becomes visible; calls may be
// coalesced or spurious) until ctx ends, and returns ctx's error then. It
// returns an error matching errors.ErrUnsupported when db's database cannot
// be watched (an in-memory database, no inotify). It must not disturb the
// driver: SQLite's watch opens none of the database's files, whose POSIX
// locks a close would drop. The engine uses it like CapNotify's Listener
// for waiters in other processes: a blocked acquire polls rarely and
// attempts again after a change, at most about 20 times per second per
// waiter and 100 per pool while the database is busy. Wake-ups are hints:
// no rule depends on them (SPEC W2).
type ChangeWatcher interface {
	WatchChanges(ctx context.Context, db *sql.DB, changed func(), ready func()) error
}

// Has reports whether every flag in c is set.
func (cs Capabilities) Has(c Capability) bool { return cs&c == c }

// String lists the set flags, for messages.
func (cs Capabilities) String() string {
	names := []string{"schemas", "row-lock-fence", "write-lock-fence", "concurrent-writers", "notify", "fifo", "fence-idle-timeout"}
	var out []string
	for i, n := range names {
		if cs&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return strings.Join(out, "|")
}

// ErrorClass is what an error means to the engine.
type ErrorClass int

const (
	// ErrorOther is any error the dialect does not recognize; the engine
	// treats it as possibly transient while a lease is renewing (SPEC H2).
	ErrorOther ErrorClass = iota
	// ErrorRetryable: the statement did not take effect and may simply be
	// retried (SQLITE_BUSY, serialization failure 40001, deadlock 40P01,
	// statement timeout 57014, lost connection).
	ErrorRetryable
	// ErrorConflict: a unique or exclusion constraint was violated.
	ErrorConflict
	// ErrorUndefinedTable: the lock tables do not exist (schema not migrated).
	ErrorUndefinedTable
	// ErrorIsolation: the statement refused to run under the isolation
	// level of its transaction and did nothing (the session defaults to a
	// level its checks were not proved for). The engine runs it again in a
	// transaction begun with Statements.Isolation (SPEC S6).
	ErrorIsolation
	// ErrorConnection: the connection failed while the statement may have
	// been in flight (for example pgx's "conn closed" after a send), so it
	// may or may not have taken effect. The engine retries it while a
	// caller waits and treats its outcome as unknown: an acquire that got
	// it is undone before going on (SPEC H6, H9). Failures the engine
	// recognizes without the dialect (io.EOF, net.Error,
	// driver.ErrBadConn) need not be reported with this class.
	ErrorConnection
	// ErrorFailoverPause: the server refused to mint a token because it is
	// a primary the namespace has not recorded yet, or one still inside its
	// failover pause (Statements.SeePrimary; SPEC S7). Nothing was written.
	// The engine runs SeePrimary and reports the key locked until the pause
	// ends.
	ErrorFailoverPause
)

func (c ErrorClass) String() string {
	switch c {
	case ErrorRetryable:
		return "retryable"
	case ErrorConflict:
		return "conflict"
	case ErrorUndefinedTable:
		return "undefined-table"
	case ErrorIsolation:
		return "isolation"
	case ErrorConnection:
		return "connection"
	case ErrorFailoverPause:
		return "failover-pause"
	}
	return "other"
}

// Statements holds the statement template of every engine operation.
//
// Parameters (bind with @name): @key (text, the lease key), @mode (text, "x"
// exclusive or "s" shared), @lease_id (text), @owner (text), @token (int64
// fencing token), @ttl_us (int64 lease TTL in microseconds), @marker_us
// (int64 pending-writer marker TTL in microseconds, 0 = do not write a
// marker), @watch_us (int64 TTL of the caller's interest in release
// notifications for @key, 0 = none; dialects without CapNotify ignore it),
// @limit (int64 row limit), @key_prefix (text, a LIKE-free prefix
// filter; empty matches all), @leases (text: a JSON array of
// "leaseID:token" strings), @channel (text: the notification channel of
// the namespace, see CapNotify), @ticket_id (text: the FIFO waiter's ticket
// ID, stable for the whole acquire), @ticket_us (int64 ticket TTL in
// microseconds, 0 = do not write the ticket; see AcquireFIFO),
// @shared_limit (int64: the most shared leases of @key a shared request
// may be granted beside, 0 = no limit; see Acquire and ParamSharedLimit).
//
// Times returned by statements are int64 microseconds since the Unix epoch in
// the database's clock (SPEC S2), as columns named *_us.
type Statements struct {
	// Acquire is a script: its statements run in order in one write
	// transaction (opened with BeginWrite) when there are several, or alone
	// in autocommit when there is one. Parameters: @key @mode @lease_id
	// @owner @ttl_us @marker_us @watch_us. The last statement returns the result rows
	// (granted, lease_id, mode, owner, token, expires_us, now_us):
	//
	//   - granted (one row, granted = 1): the new lease; the caller's own
	//     pending-writer marker is cleared.
	//   - refused (granted = 0): one row per lease that blocks the request,
	//     plus one row with mode "w" for a live pending-writer marker (its
	//     waiter ID in lease_id, token 0). When @mode is "x" and @marker_us >
	//     0, the caller's marker is set or refreshed unless another waiter's
	//     live marker exists; the rows then include it.
	//
	// Rules (SPEC S1, S2, S3, W1): expired holders of @key are removed first
	// (takeover); an exclusive request is granted only when no holder of
	// @key remains and no other waiter's live marker exists; a shared
	// request when no exclusive holder remains and no live marker exists. A
	// grant takes a fencing token greater than every token granted before.
	//
	// Semaphores (SPEC W7, optional): a script that binds @shared_limit
	// refuses a shared request with @shared_limit > 0 while @key has at
	// least @shared_limit holders, and then lists every holder of @key in
	// its refusal rows. The count and the insert must see one state: two
	// requests must never both see n-1 holders and both be granted (count
	// under the same per-key serialization as the other checks). A script
	// that does not bind it declares semaphores unsupported; Probe, Grant
	// and ProbeFIFO are then not run for limited requests unless they bind
	// it too (and must then refuse as Acquire does).
	Acquire []string
	// BeginWrite opens a write transaction for a multi-statement Acquire
	// ("BEGIN IMMEDIATE" on SQLite). Empty means the driver's BeginTx.
	BeginWrite string
	// Isolation is the isolation level the Acquire script was proved for
	// (SPEC S6), when the session's default may differ (sql.LevelDefault:
	// any level is fine). An Acquire statement that
	// detects another level fails with an error Classify maps to
	// ErrorIsolation, having done nothing; the engine then runs the script
	// in a transaction begun with sql.TxOptions{Isolation: Isolation}, and
	// keeps doing so for that Locker. PostgreSQL: sql.LevelReadCommitted.
	Isolation sql.IsolationLevel
	// Renew extends exactly the live lease (@lease_id, @token) to now +
	// @ttl_us, changing no key column, and returns (expires_us, now_us).
	// No row means the lease is gone or not ours (SPEC S4, H2).
	Renew string
	// RenewBatch renews many leases in one statement: every live lease
	// listed in @leases whose lease ID and token match, to now + @ttl_us.
	// It returns one row (lease_id, expires_us, now_us) per lease renewed;
	// a listed lease without a row is gone or not ours. Optional: without
	// it the engine sends Renew once per lease (SPEC H2, S4).
	RenewBatch string
	// Release deletes the lease (@lease_id, @token), expired or not. It
	// returns one row (whose first column is the key) per holder row
	// deleted. @token = 0 matches any token of @lease_id: the engine uses it
	// only to undo an acquire whose reply it never saw (lease IDs are random
	// and never reused). A dialect with CapNotify also notifies @channel
	// in the same statement, at least when a waiter of the key may be
	// granted now, with a Wake payload: the key, and the waiter ID of the
	// key's live pending-writer marker to wake only that waiter (a hint:
	// waiters also poll). The engine runs it
	// alone in autocommit, so it may commit without waiting for
	// durability (PostgreSQL: synchronous_commit off for its transaction):
	// a release lost in a crash leaves the lease to expire, provided grants
	// commit durably. Parameters: @lease_id @token @channel (SPEC S4, H5,
	// H6, D2).
	Release string
	// ClearMarker removes the pending-writer marker of waiter @lease_id on
	// @key, when a waiter gives up (SPEC W1).
	ClearMarker string
	// Fence runs inside the caller's transaction: it returns one row
	// (expires_us, now_us) when the lease (@lease_id, @token) is live and
	// keeps it from being taken over until the transaction ends; no row
	// means lost (SPEC F1, F2). @ttl_us (the lease TTL) may be used to
	// bound how long the database lets the transaction sit idle
	// (CapFenceIdleTimeout).
	Fence string
	// FenceEnd is optional: run alone in autocommit on the connection of
	// a fenced transaction once it ended (Lease.RunInTx), it puts back the
	// session settings Fence changed, when those are not
	// transaction-scoped (MySQL: MariaDB's idle-transaction timeouts), so
	// the connection goes back to the pool as it was; the engine discards
	// the connection when it fails. No parameters. Empty: Fence changes
	// nothing that outlives the transaction (SPEC F1).
	FenceEnd string
	// Holders lists every lease and pending-writer marker whose key starts
	// with @key_prefix, expired ones included, as rows (key, mode, lease_id,
	// owner, token, expires_us, now_us) ordered by key and token; markers
	// have mode "w" and token 0. A dialect with CapFIFO lists FIFO tickets
	// too: mode "q", the ticket ID as lease_id, its sequence number as
	// token.
	Holders string
	// Sweep is a script run like Acquire. It deletes at most @limit expired
	// holder rows, plus expired markers, FIFO tickets and idle per-key rows,
	// in short transactions (one, or one per kind of row); the RowsAffected of its last statement is the number of
	// holder rows deleted (SPEC D2), unless SweepReturnsCount is set.
	Sweep []string
	// SweepReturnsCount says that the last Sweep statement is a query
	// returning one row with one integer column: the number of holder rows
	// deleted. Use it when RowsAffected cannot say (MySQL's CALL reports the
	// sum over every statement inside the procedure).
	SweepReturnsCount bool
	// CountRows returns one row, one column: the number of rows in all lock
	// tables except the token counter and the version table (SPEC D2).
	CountRows string

	// AcquireFIFO is Acquire for strict FIFO waiters (SPEC W6), a script run
	// like Acquire with its parameters plus @ticket_id and @ticket_us, and
	// the same result rows; refused rows also list, with mode "q", token =
	// sequence number and the ticket's expiry, every live ticket of @key
	// ahead of the caller's that conflicts with @mode. Rules, on top of
	// Acquire's: expired tickets of @key are removed first; when @ticket_us
	// > 0 the caller's ticket (@ticket_id: @key, @mode, @owner) is inserted
	// with the next sequence number and the database time, or, when it
	// exists, its expiry is moved to now + @ticket_us; a request is granted
	// only when no live ticket with a smaller sequence number conflicts with
	// it (an exclusive one for a shared request, any for an exclusive one or
	// for a semaphore request, @shared_limit > 0, when the script binds it);
	// a caller without a live ticket (a try) counts as behind every ticket.
	// A grant deletes the caller's ticket. The pending-writer marker is set
	// only when no ticket is ahead of the caller. A refused attempt with
	// @ticket_us, @marker_us and @watch_us all 0 writes nothing. Optional;
	// setting it gives CapFIFO.
	AcquireFIFO []string
	// Dequeue deletes the ticket @ticket_id (a FIFO waiter gives up; SPEC
	// W6). Required with AcquireFIFO.
	Dequeue string

	// Primary is an optional query, without parameters or names, that
	// lock.New and migrate.Up run before anything else: one row of two
	// columns, (read_only, reason). read_only true (1) with a reason naming
	// the server: a read-only replica (ErrReadOnly); false with a reason:
	// the server cannot keep the dialect's rules for another cause
	// (errors.ErrUnsupported); false with an empty or NULL reason: a
	// writable primary (SPEC S7).
	Primary string
	// SeePrimary is the optional failover pause (SPEC S7): it records the
	// server it runs on as the namespace's primary, with the moment it was
	// first seen when it differs from the one recorded, raises the
	// namespace's pause to @pause_us microseconds when that is larger (0
	// leaves it), and returns one row (until_us, now_us): the end of the
	// pause since this primary was first seen, and the database's time.
	// While now_us < until_us, or on a primary not recorded yet when the
	// pause is set, every grant fails with an error the dialect classifies
	// as ErrorFailoverPause, having written nothing. Renewals are never
	// paused. Without it lock.WithFailoverPause is refused.
	SeePrimary string
}

// Namespace says where the lock objects live: an optional schema (dialects
// with CapSchemas) and a name prefix ("sqlease_" by default).
type Namespace struct {
	Schema string
	Prefix string
}

// DefaultPrefix is the table-name prefix used when Namespace.Prefix is empty.
const DefaultPrefix = "sqlease_"

// MaxIdentifierLength bounds a schema name or prefix, in bytes, so that every
// derived object name fits PostgreSQL's 63-byte identifiers.
const MaxIdentifierLength = 40

// ErrInvalidInput is matched (errors.Is) by every error sqlease returns
// for bad input, in every package: a bad key, key prefix, TTL, duration,
// option, schema name, table prefix, dialect name or nil argument (rule I1
// of docs/contract.md). lock.ErrInvalidInput is this same value, so one
// errors.Is check covers lock, migrate, dialect and the adapters. Detail:
// *InputError.
var ErrInvalidInput = errors.New("invalid input")

// ErrInvalidName is matched (errors.Is) by every error about a bad schema
// name or table prefix (rules D3, I1); those errors are *InputError values
// and match ErrInvalidInput too.
var ErrInvalidName = errors.New("invalid identifier")

// InputError names a bad input value and what is allowed (rule I1). It is
// the one input-error type of every sqlease package (lock.InputError is an
// alias of it). It matches ErrInvalidInput, and Err when set (ErrInvalidName
// for a schema or prefix, ErrUnknownDialect for a dialect name).
type InputError struct {
	// Pkg is the package that reports it ("lock", "migrate", "dialect");
	// it starts the message.
	Pkg string
	// Field names the input: "key", "key prefix", "TTL", "schema", ...
	Field string
	// Value is the bad value, quoted or formatted (long values clipped).
	Value string
	// Allowed says what would be accepted.
	Allowed string
	// Err is a more specific sentinel the error also matches, or nil.
	Err error
}

func (e *InputError) Error() string {
	pkg := e.Pkg
	if pkg == "" {
		pkg = "sqlease"
	}
	return fmt.Sprintf("%s: invalid %s %s: %s", pkg, e.Field, e.Value, e.Allowed)
}

// Is matches ErrInvalidInput.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// Unwrap returns Err, the more specific sentinel, if any.
func (e *InputError) Unwrap() error { return e.Err }

// Relabel returns err with its *InputError, if err is one, reported by
// package pkg instead; any other error is returned unchanged. Packages that
// pass a dialect's validation error on use it so the message starts with
// their own name, once.
func Relabel(err error, pkg string) error {
	var ie *InputError
	if errors.As(err, &ie) && ie.Pkg != pkg {
		c := *ie
		c.Pkg = pkg
		return &c
	}
	return err
}

// Validate checks the schema and prefix: each must be empty or match
// [a-z_][a-z0-9_]* and be at most MaxIdentifierLength bytes; a schema is only
// allowed when d has CapSchemas (PostgreSQL; not SQLite), and never a
// reserved one (ReservedSchema), whatever the dialect. Errors are
// *InputError values matching ErrInvalidName and ErrInvalidInput that name
// the bad value (rules D3, I1).
func (ns Namespace) Validate(d Dialect) error {
	const allowed = "only lower-case letters, digits and '_', not starting with a digit"
	bad := func(what, v, why string) error {
		return &InputError{Pkg: "dialect", Field: what, Value: fmt.Sprintf("%q", clip(v)), Allowed: why, Err: ErrInvalidName}
	}
	check := func(what, v string) error {
		if v == "" {
			return nil
		}
		if len(v) > MaxIdentifierLength {
			return bad(what, v, fmt.Sprintf("is %d bytes, at most %d allowed; %s", len(v), MaxIdentifierLength, allowed))
		}
		for i, r := range v {
			ok := r == '_' || (r >= 'a' && r <= 'z') || (i > 0 && r >= '0' && r <= '9')
			if !ok {
				return bad(what, v, allowed)
			}
		}
		return nil
	}
	if err := check("schema", ns.Schema); err != nil {
		return err
	}
	if ReservedSchema(ns.Schema) {
		return bad("schema", ns.Schema, "is reserved for the database's own catalogs (names starting with pg_, information_schema, mysql, sys, performance_schema); choose another schema")
	}
	if err := check("prefix", ns.Prefix); err != nil {
		return err
	}
	if ns.Schema != "" && d != nil && !d.Capabilities().Has(CapSchemas) {
		return bad("schema", ns.Schema, fmt.Sprintf("dialect %q has no schemas (only dialects with CapSchemas, such as postgres, do); use a table prefix instead", d.Name()))
	}
	return nil
}

// ReservedSchema reports whether schema is a database's own catalog, which
// Namespace.Validate rejects for every dialect (rule D3): names starting
// with "pg_" (PostgreSQL), "information_schema" (SQL standard), "mysql",
// "sys" and "performance_schema" (MySQL, MariaDB).
func ReservedSchema(schema string) bool {
	switch schema {
	case "information_schema", "mysql", "sys", "performance_schema":
		return true
	}
	return strings.HasPrefix(schema, "pg_")
}

func (ns Namespace) prefix() string {
	if ns.Prefix == "" {
		return DefaultPrefix
	}
	return ns.Prefix
}

// Object returns the quoted, schema-qualified name of object name (for
// example "holders") in this namespace.
func (ns Namespace) Object(d Dialect, name string) string {
	q := d.QuoteIdent(ns.prefix() + name)
	if ns.Schema != "" {
		return d.QuoteIdent(ns.Schema) + "." + q
	}
	return q
}

// Channel is the notification channel of this namespace (CapNotify). It is
// at most 63 bytes (PostgreSQL rejects longer channel names in pg_notify): a
// longer name is cut and suffixed with a hash of the full one.
func (ns Namespace) Channel() string {
	c := ns.prefix() + "release"
	if ns.Schema != "" {
		c = ns.Schema + "." + c
	}
	if len(c) <= 63 {
		return c
	}
	h := fnv.New64a()
	h.Write([]byte(c))
	return fmt.Sprintf("%s_%016x", c[:63-17], h.Sum64())
}

// VersionTable is the unquoted name of the goose version table
// ("schema.prefixdb_version"); both parts are validated identifiers.
func (ns Namespace) VersionTable() string {
	t := ns.prefix() + "db_version"
	if ns.Schema != "" {
		return ns.Schema + "." + t
	}
	return t
}

// RenderNames replaces every {name} marker in text with ns.Object(d, name).
// It fails on an unterminated or empty marker.
func (ns Namespace) RenderNames(d Dialect, text string) (string, error) {
	var b strings.Builder
	for {
		i := strings.IndexByte(text, '{')
		if i < 0 {
			b.WriteString(text)
			break
		}
		j := strings.IndexByte(text[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("dialect: unterminated marker %q", clip(text[i:]))
		}
		name := text[i+1 : i+j]
		if !isIdent(name) {
			return "", fmt.Errorf("dialect: bad object marker {%s}", name)
		}
		b.WriteString(text[:i])
		b.WriteString(ns.Object(d, name))
		text = text[i+j+1:]
	}
	return b.String(), nil
}

// Stmt is a rendered statement: SQL text plus the order in which named
// parameters bind to its positional placeholders.
type Stmt struct {
	SQL    string
	Params []string
}

// Args orders the named values for binding; a missing name binds nil.
func (s Stmt) Args(values map[string]any) []any {
	args := make([]any, len(s.Params))
	for i, p := range s.Params {
		args[i] = values[p]
	}
	return args
}

// Compile renders a statement template: each {name} object marker through
// ns, and each @param (which must be in allowed) to d.Placeholder.
//
// Markers are recognized only in SQL text proper: text inside single-quoted
// strings ('...', a doubled quote escaping one; backslash escapes are not
// understood, so templates must not use them), double-quoted and
// backtick-quoted identifiers, -- line comments and /* */ block comments is
// copied unchanged. @@name (a MySQL system variable) and @name where name is
// not in allowed (a MySQL user variable) are copied unchanged too.
//
// Placeholders are numbered in order of first use. When the dialect's
// placeholders carry their number (Placeholder(1) != Placeholder(2), as
// "$1" or "?1"), a repeated @param reuses its placeholder and binds once;
// otherwise ("?" drivers such as MySQL's) each use gets a placeholder of its
// own and Stmt.Params lists the parameter once per use, so Args binds as
// many values as there are placeholders.
//
// It fails on an unterminated or bad {marker}, an '@' not followed by a
// name, or an unterminated quote or comment.
func Compile(d Dialect, ns Namespace, template string, allowed []string) (Stmt, error) {
	numbered := d.Placeholder(1) != d.Placeholder(2)
	text := template
	var b strings.Builder
	var params []string
	isName := func(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	for i := 0; i < len(text); i++ {
		c := text[i]
		// Quoted text and comments are copied as they are.
		end := -1
		switch {
		case c == '\'' || c == '"' || c == '`':
			j := strings.IndexByte(text[i+1:], c)
			if j < 0 {
				return Stmt{}, fmt.Errorf("dialect: unterminated %c quote in %q", c, clip(text[i:]))
			}
			end = i + 1 + j + 1 // a doubled quote is two adjacent quoted runs
		case c == '-' && i+1 < len(text) && text[i+1] == '-':
			j := strings.IndexByte(text[i:], '\n')
			if j < 0 {
				end = len(text)
			} else {
				end = i + j + 1
			}
		case c == '/' && i+1 < len(text) && text[i+1] == '*':
			j := strings.Index(text[i+2:], "*/")
			if j < 0 {
				return Stmt{}, fmt.Errorf("dialect: unterminated comment in %q", clip(text[i:]))
			}
			end = i + 2 + j + 2
		}
		if end >= 0 {
			b.WriteString(text[i:end])
			i = end - 1
			continue
		}
		switch c {
		case '{':
			j := strings.IndexByte(text[i:], '}')
			if j < 0 {
				return Stmt{}, fmt.Errorf("dialect: unterminated marker %q", clip(text[i:]))
			}
			name := text[i+1 : i+j]
			if !isIdent(name) {
				return Stmt{}, fmt.Errorf("dialect: bad object marker {%s}", name)
			}
			b.WriteString(ns.Object(d, name))
			i += j
			continue
		case '@':
		default:
			b.WriteByte(c)
			continue
		}
		if i+1 < len(text) && text[i+1] == '@' {
			// @@system_variable: copy it with its name.
			j := i + 2
			for j < len(text) && (isName(text[j]) || text[j] == '.' || text[j] >= 'A' && text[j] <= 'Z') {
				j++
			}
			b.WriteString(text[i:j])
			i = j - 1
			continue
		}
		j := i + 1
		for j < len(text) && isName(text[j]) {
			j++
		}
		name := text[i+1 : j]
		if name == "" {
			return Stmt{}, fmt.Errorf("dialect: stray '@' in %q", clip(text))
		}
		if !slices.Contains(allowed, name) {
			// Not a parameter of the operation: a user variable.
			b.WriteString(text[i:j])
			i = j - 1
			continue
		}
		n := slices.Index(params, name)
		if n < 0 || !numbered {
			params = append(params, name)
			n = len(params) - 1
		}
		b.WriteString(d.Placeholder(n + 1))
		i = j - 1
	}
	return Stmt{SQL: b.String(), Params: params}, nil
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

var (
	regMu    sync.RWMutex
	registry = map[string]Dialect{}
)

// Register makes a dialect available by name. Like sql.Register it panics if
// d is nil, its name is empty or already registered. Call it from an init
// function.
func Register(d Dialect) {
	if d == nil || reflect.ValueOf(d).Kind() == reflect.Pointer && reflect.ValueOf(d).IsNil() {
		panic("dialect: Register dialect is nil")
	}
	name := d.Name()
	if name == "" {
		panic("dialect: Register dialect with empty name")
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("dialect: Register called twice for dialect " + name)
	}
	registry[name] = d
}

// ErrUnknownDialect is matched (errors.Is) by Lookup and Detect failures;
// those are *InputError values and match ErrInvalidInput too (rule I1).
var ErrUnknownDialect = errors.New("unknown dialect")

// Lookup returns the registered dialect called name. The error is an
// *InputError matching ErrUnknownDialect and ErrInvalidInput that lists the
// registered names (rule I1).
func Lookup(name string) (Dialect, error) {
	regMu.RLock()
	d, ok := registry[name]
	regMu.RUnlock()
	if !ok {
		return nil, &InputError{Pkg: "dialect", Field: "dialect name", Value: fmt.Sprintf("%q", clip(name)),
			Allowed: fmt.Sprintf("not registered (registered: %s; import its package, e.g. github.com/sqlease/sqlease/dialect/pgdialect)", strings.Join(Names(), ", ")),
			Err:     ErrUnknownDialect}
	}
	return d, nil
}

// Names returns the registered dialect names, sorted.
func Names() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Detect picks the registered dialect whose DriverMatcher claims db's driver
// (pgx and lib/pq: "postgres"; go-sql-driver/mysql: "mysql";
// mattn/go-sqlite3 and modernc.org/sqlite: "sqlite"). The error is an
// *InputError matching ErrUnknownDialect and ErrInvalidInput that names the
// driver type (a nil db matches ErrInvalidInput); pass a dialect explicitly
// to override detection. The built-in dialects print their name (fmt's
// %v), so a detected dialect can be logged as is.
func Detect(db *sql.DB) (Dialect, error) {
	if db == nil {
		return nil, &InputError{Pkg: "dialect", Field: "database", Value: "nil", Allowed: "Detect needs an open *sql.DB"}
	}
	drv := db.Driver()
	regMu.RLock()
	defer regMu.RUnlock()
	var found []Dialect
	for _, d := range registry {
		if m, ok := d.(DriverMatcher); ok && m.MatchesDriver(drv) {
			found = append(found, d)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, &InputError{Pkg: "dialect", Field: "driver", Value: fmt.Sprintf("%T", drv),
			Allowed: noDialectFor(namesLocked()),
			Err:     ErrUnknownDialect}
	}
	return nil, &InputError{Pkg: "dialect", Field: "driver", Value: fmt.Sprintf("%T", drv),
		Allowed: "several registered dialects claim it; pass one explicitly", Err: ErrUnknownDialect}
}

// noDialectFor says what to do when no registered dialect claims a driver.
func noDialectFor(registered []string) string {
	if len(registered) == 0 {
		return "no sqlease dialect is registered: import one, e.g. _ \"github.com/sqlease/sqlease/dialect/pgdialect\" (or sqlitedialect, mysqldialect), or pass one explicitly"
	}
	return fmt.Sprintf("none of the registered dialects (%s) recognizes it; import the one for this driver, or pass one explicitly", strings.Join(registered, ", "))
}

func namesLocked() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DriverPackage returns the Go package path of a driver's type, for
// DriverMatcher implementations ("github.com/jackc/pgx/v5/stdlib").
func DriverPackage(d driver.Driver) string {
	t := reflect.TypeOf(d)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// ParamSharedLimit names the Statements parameter that carries a semaphore
// acquire's limit (SPEC W7): @shared_limit, an int64, 0 for a request
// without one. A dialect supports lock.Limit when its Acquire script binds
// it (and lock.Limit with lock.FIFO when its AcquireFIFO script does).
const ParamSharedLimit = "shared_limit"

// TakesParam reports whether any of the statement templates binds the
// parameter @name (outside quoted text and comments, as Compile reads
// them). The engine and the conformance suite derive what a dialect
// supports from its statements this way, for example SupportsLimit.
func TakesParam(d Dialect, name string, templates ...string) bool {
	for _, t := range templates {
		s, err := Compile(d, Namespace{}, t, []string{name})
		if err == nil && slices.Contains(s.Params, name) {
			return true
		}
	}
	return false
}

// SupportsLimit reports whether d's acquire statements take
// ParamSharedLimit, for acquires with FIFO when fifo is set: whether
// lock.Limit works on d (SPEC W7).
func SupportsLimit(d Dialect, fifo bool) bool {
	s := d.Statements()
	if fifo {
		return TakesParam(d, ParamSharedLimit, s.AcquireFIFO...)
	}
	return TakesParam(d, ParamSharedLimit, s.Acquire...)
}
