// Package dialect is the extension point through which sqlease supports a
// database: a Dialect contributes the SQL text of every engine operation, the
// goose migrations that create the lock tables, identifier quoting and error
// classification. The engine in package lock runs that SQL and never branches
// on a dialect's name, only on the Capabilities it declares.
//
// The built-in dialects live in dialect/pgdialect (PostgreSQL) and
// dialect/sqlitedialect (SQLite). A third-party dialect is a value that
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
//
// A template that still holds a marker after rendering, or names a parameter
// its operation does not have, is rejected with an error.
//
// # Stability
//
// The Dialect interface, Statements, Capabilities and ErrorClass are a public
// extension point: new operations are added as new Statements fields (a
// dialect that leaves one empty declares the operation unsupported, and the
// engine reports errors.ErrUnsupported for it), never as new interface
// methods.
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
)

// Dialect is the SQL a database contributes to the shared engine.
// Implementations must be safe for concurrent use; the built-ins are
// stateless values.
type Dialect interface {
	// Name is the registry name ("postgres", "sqlite"): lower case, unique.
	Name() string
	// Capabilities declares what the dialect's SQL supports; the engine and
	// the conformance suite branch on these flags only.
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
	// caller's transaction (PostgreSQL FOR KEY SHARE) and renewals do not
	// wait for it (SPEC F1, H7).
	CapRowLockFence
	// CapWriteLockFence: Statements.Fence is a write that takes the
	// database-wide write lock for the rest of the caller's transaction
	// (SQLite). Renewals of every lease wait behind a fenced transaction.
	CapWriteLockFence
	// CapConcurrentWriters: several connections can write at the same
	// moment (PostgreSQL). Without it the database serializes writers and
	// tests that need two concurrent write transactions are skipped.
	CapConcurrentWriters
	// CapSessionLockedMigrations: migrations take goose's PostgreSQL
	// session advisory lock, so concurrent migrate.Up calls queue.
	CapSessionLockedMigrations
	// CapNotify: Release notifies waiters on @channel, and the dialect
	// implements Listener, so waiters are woken at once instead of at their
	// next poll.
	CapNotify
)

// Listener is implemented by dialects with CapNotify: Listen turns conn
// (a connection the engine dedicates to it) into a listener on channel,
// calls ready once it listens, then calls deliver with the payload (a key)
// of every notification until ctx ends or the connection fails. It returns
// an error matching errors.ErrUnsupported when the connection's driver
// cannot receive notifications (the engine then polls).
type Listener interface {
	Listen(ctx context.Context, conn *sql.Conn, channel string, deliver func(payload string), ready func()) error
}

// Has reports whether every flag in c is set.
func (cs Capabilities) Has(c Capability) bool { return cs&c == c }

// String lists the set flags, for messages.
func (cs Capabilities) String() string {
	names := []string{"schemas", "row-lock-fence", "write-lock-fence", "concurrent-writers", "session-locked-migrations", "notify"}
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
)

func (c ErrorClass) String() string {
	switch c {
	case ErrorRetryable:
		return "retryable"
	case ErrorConflict:
		return "conflict"
	case ErrorUndefinedTable:
		return "undefined-table"
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
// the namespace, see CapNotify).
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
	Acquire []string
	// Probe is an optional read-only query run before the Acquire script
	// when the attempt has no marker or watch to write (@marker_us and
	// @watch_us are 0): it returns the same refusal rows as Acquire for the
	// live leases and markers that block the request, and no row when the
	// key looks free (the engine then runs Acquire). A refused poll then
	// takes no write lock. Parameters as Acquire.
	Probe string
	// BeginWrite opens a write transaction for a multi-statement Acquire
	// ("BEGIN IMMEDIATE" on SQLite). Empty means the driver's BeginTx.
	BeginWrite string
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
	// Release deletes the lease (@lease_id, @token), expired or not, and
	// the key's idle per-key rows where nothing waits for their locks. It
	// returns one row (whose first column is the key) per holder row
	// deleted. @token = 0 matches any token of @lease_id: the engine uses it
	// only to undo an acquire whose reply it never saw (lease IDs are random
	// and never reused). A dialect with CapNotify also notifies @channel
	// with the key in the same statement. Parameters: @lease_id @token
	// @channel (SPEC S4, H5, H6, D2).
	Release string
	// ClearMarker removes the pending-writer marker of waiter @lease_id on
	// @key, when a waiter gives up (SPEC W1).
	ClearMarker string
	// Fence runs inside the caller's transaction: it returns one row
	// (expires_us, now_us) when the lease (@lease_id, @token) is live and
	// keeps it from being taken over until the transaction ends; no row
	// means lost (SPEC F1, F2).
	Fence string
	// Holders lists every lease and pending-writer marker whose key starts
	// with @key_prefix, expired ones included, as rows (key, mode, lease_id,
	// owner, token, expires_us, now_us) ordered by key and token; markers
	// have mode "w" and token 0.
	Holders string
	// Sweep is a script run like Acquire. It deletes at most @limit expired
	// holder rows, plus expired markers and idle per-key rows, in one short
	// transaction; the RowsAffected of its last statement is the number of
	// holder rows deleted (SPEC D2).
	Sweep []string
	// CountRows returns one row, one column: the number of rows in all lock
	// tables except the token counter and the version table (SPEC D2).
	CountRows string
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

// ErrInvalidName is matched (errors.Is) by every error about a bad schema
// name or prefix (SPEC D3, I1).
var ErrInvalidName = errors.New("invalid identifier")

// Validate checks the schema and prefix: each must be empty or match
// [a-z_][a-z0-9_]* and be at most MaxIdentifierLength bytes; a schema is only
// allowed when d has CapSchemas. Errors match ErrInvalidName and name the bad
// value (SPEC D3, I1).
func (ns Namespace) Validate(d Dialect) error {
	check := func(what, v string, allowEmpty bool) error {
		if v == "" {
			if allowEmpty {
				return nil
			}
			return fmt.Errorf("dialect: %s is empty: %w", what, ErrInvalidName)
		}
		if len(v) > MaxIdentifierLength {
			return fmt.Errorf("dialect: %s %q is %d bytes, at most %d allowed: %w", what, v, len(v), MaxIdentifierLength, ErrInvalidName)
		}
		for i, r := range v {
			ok := r == '_' || (r >= 'a' && r <= 'z') || (i > 0 && r >= '0' && r <= '9')
			if !ok {
				return fmt.Errorf("dialect: %s %q: only lower-case letters, digits and '_' are allowed, not starting with a digit: %w", what, v, ErrInvalidName)
			}
		}
		return nil
	}
	if err := check("schema", ns.Schema, true); err != nil {
		return err
	}
	if err := check("prefix", ns.Prefix, true); err != nil {
		return err
	}
	if ns.Schema != "" && d != nil && !d.Capabilities().Has(CapSchemas) {
		return fmt.Errorf("dialect: schema %q: dialect %q has no schemas, use a table prefix instead: %w", ns.Schema, d.Name(), ErrInvalidName)
	}
	return nil
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

// Compile renders a statement template: object markers through ns, and each
// @param (which must be in allowed) to d.Placeholder. Text inside single
// quotes is left alone. It fails on a parameter not in allowed or a stray
// marker.
func Compile(d Dialect, ns Namespace, template string, allowed []string) (Stmt, error) {
	text, err := ns.RenderNames(d, template)
	if err != nil {
		return Stmt{}, err
	}
	var b strings.Builder
	var params []string
	inQuote := false
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c == '\'' {
			inQuote = !inQuote
		}
		if c != '@' || inQuote {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(text) && (text[j] == '_' || text[j] >= 'a' && text[j] <= 'z' || text[j] >= '0' && text[j] <= '9') {
			j++
		}
		name := text[i+1 : j]
		if name == "" {
			return Stmt{}, fmt.Errorf("dialect: stray '@' in %q", clip(text))
		}
		if !slices.Contains(allowed, name) {
			return Stmt{}, fmt.Errorf("dialect: parameter @%s is not one of %v", name, allowed)
		}
		n := slices.Index(params, name)
		if n < 0 {
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

// ErrUnknownDialect is matched (errors.Is) by Lookup and Detect failures.
var ErrUnknownDialect = errors.New("unknown dialect")

// Lookup returns the registered dialect called name. The error matches
// ErrUnknownDialect and lists the registered names (SPEC I1).
func Lookup(name string) (Dialect, error) {
	regMu.RLock()
	d, ok := registry[name]
	regMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("dialect: %q is not registered (registered: %s; import its package, e.g. github.com/sqlease/sqlease/dialect/pgdialect): %w",
			name, strings.Join(Names(), ", "), ErrUnknownDialect)
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
// (pgx and lib/pq: "postgres"; mattn/go-sqlite3 and modernc.org/sqlite:
// "sqlite"). The error matches ErrUnknownDialect and names the driver type;
// pass a dialect explicitly to override detection.
func Detect(db *sql.DB) (Dialect, error) {
	if db == nil {
		return nil, errors.New("dialect: Detect: db is nil")
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
		return nil, fmt.Errorf("dialect: no registered dialect (%s) recognizes driver %T; pass one explicitly: %w",
			strings.Join(namesLocked(), ", "), drv, ErrUnknownDialect)
	}
	return nil, fmt.Errorf("dialect: several dialects claim driver %T; pass one explicitly: %w", drv, ErrUnknownDialect)
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
