package lock

import (
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sqlease/sqlease/dialect"
)

// Limits on inputs (SPEC I1).
const (
	// MinTTL is the shortest lease TTL accepted: long enough for three
	// renewal round trips to a nearby database.
	MinTTL = 100 * time.Millisecond
	// MaxTTL is the longest lease TTL accepted.
	MaxTTL = 24 * time.Hour
	// DefaultTTL is the lease TTL when WithTTL is not given.
	DefaultTTL = 30 * time.Second
	// MaxKeyLength is the longest key accepted, in bytes.
	MaxKeyLength = 512
	// MaxOwnerLength is the longest owner label accepted, in bytes.
	MaxOwnerLength = 256
	// DefaultReleaseTimeout bounds a release (SPEC H5).
	DefaultReleaseTimeout = 5 * time.Second
	// DefaultMaxBackoff caps the wait between polls of a blocked acquire
	// (SPEC W2); the cap is also never above the TTL.
	DefaultMaxBackoff = 500 * time.Millisecond
	// MinBackoff is the first backoff step of a waiting acquire.
	MinBackoff = 2 * time.Millisecond
)

// Option configures a Locker. Options are validated by New, which names the
// bad value in an *InputError matching ErrInvalidInput.
//
// Zero values: leaving an option out gives its documented default; giving
// it a zero value (WithTTL(0), WithOwner(""), WithRenewTimeout(0), ...) is
// an error that names the allowed range, never a silent default. The only
// options whose empty value is meaningful are WithSchema("") (no schema)
// and WithTablePrefix("") (DefaultPrefix), the zero dialect.Namespace. A nil
// Option is rejected the same way.
type Option func(*config)

type config struct {
	ttl            time.Duration
	owner          string
	ns             dialect.Namespace
	logger         *slog.Logger
	renewDB        *sql.DB
	renewTimeout   time.Duration
	releaseTimeout time.Duration
	stmtTimeout    time.Duration
	maxBackoff     time.Duration
	markerTTL      time.Duration
	margin         time.Duration
	skipCheck      bool
	observer       Observer
	sweepEvery     time.Duration
	sweepLimit     int
	notifyPoll     time.Duration
	sweepSet       bool
	// zero holds the first option given a zero value (see Option).
	zero          error
	listenDB      *sql.DB
	failoverPause time.Duration
}

// rejectZero records that an option was given its zero value; New returns
// the error.
func (c *config) rejectZero(field, value, allowed, option string) {
	if c.zero == nil {
		c.zero = inputErr(field, value, allowed+" (leave "+option+" out for the default)")
	}
}

// durationOption sets *dst to d, rejecting zero (see Option).
func durationOption(field, allowed, option string, d time.Duration, dst func(*config) *time.Duration) Option {
	return func(c *config) {
		if d == 0 {
			c.rejectZero(field, "0s", allowed, option)
		}
		*dst(c) = d
	}
}

// WithTTL sets the lease TTL (default DefaultTTL, allowed MinTTL..MaxTTL;
// 0 is rejected like any value out of range). Leases renew every TTL/3
// (SPEC H2).
func WithTTL(ttl time.Duration) Option {
	return durationOption("TTL", fmt.Sprintf("between %s and %s", MinTTL, MaxTTL), "WithTTL", ttl, func(c *config) *time.Duration { return &c.ttl })
}

// WithOwner sets the owner label stored with each lease, for humans (default
// "host:pid"; 1..MaxOwnerLength bytes of valid UTF-8 without NUL; "" is
// rejected).
func WithOwner(owner string) Option {
	return func(c *config) {
		if owner == "" {
			c.rejectZero("owner", `""`, fmt.Sprintf("1..%d bytes of valid UTF-8 without NUL", MaxOwnerLength), "WithOwner")
		}
		c.owner = owner
	}
}

// WithSchema puts the lock tables in a schema, on dialects that declare
// dialect.CapSchemas (PostgreSQL; MySQL, where a schema is a database; not
// SQLite, where New fails with an *InputError matching ErrInvalidInput and
// dialect.ErrInvalidName that says to use WithTablePrefix instead). The
// name is validated ([a-z_][a-z0-9_]*, at most dialect.MaxIdentifierLength
// bytes) and quoted in SQL (SPEC D3); "" means no schema (the default). It
// must match the schema given to migrate.Up.
func WithSchema(schema string) Option { return func(c *config) { c.ns.Schema = schema } }

// WithTablePrefix sets the prefix of every lock object name (validated like
// WithSchema; "" means the default, dialect.DefaultPrefix "sqlease_"). It
// works on every dialect and must match the prefix given to migrate.Up.
func WithTablePrefix(prefix string) Option { return func(c *config) { c.ns.Prefix = prefix } }

// WithLogger sets the logger for renewal retries (DEBUG), losses, failed
// releases and renewals that cannot keep up with the leases held (WARN). Default: slog.Default(); nil is rejected (use
// slog.New(slog.DiscardHandler) to log nothing).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.rejectZero("logger", "nil", "a *slog.Logger; slog.New(slog.DiscardHandler) logs nothing", "WithLogger")
		}
		c.logger = l
	}
}

// WithRenewDB renews leases through a separate pool, so an application that
// exhausts its own pool cannot starve renewals (SPEC H7). It must reach the
// same database. Default: the Locker's own pool; nil is rejected. Where the
// database takes concurrent writers, a renewal round sends up to 4 batches
// at once, on at most half of this pool's SetMaxOpenConns connections.
func WithRenewDB(db *sql.DB) Option {
	return func(c *config) {
		if db == nil {
			c.rejectZero("renew database", "nil", "an open *sql.DB reaching the same database", "WithRenewDB")
		}
		c.renewDB = db
	}
}

// WithRenewTimeout bounds each renewal statement (default TTL/5; positive,
// at most TTL/3).
func WithRenewTimeout(d time.Duration) Option {
	return durationOption("renew timeout", "a positive duration of at most TTL/3", "WithRenewTimeout", d, func(c *config) *time.Duration { return &c.renewTimeout })
}

// WithReleaseTimeout bounds a release, which runs on a context detached from
// the caller's (default DefaultReleaseTimeout; positive; SPEC H5).
func WithReleaseTimeout(d time.Duration) Option {
	return durationOption("release timeout", "a positive duration", "WithReleaseTimeout", d, func(c *config) *time.Duration { return &c.releaseTimeout })
}

// WithStatementTimeout bounds one acquire statement; the statement runs to
// its end even when the caller's context ends, so a grant that commits
// anyway is seen and released (SPEC H6). Default: max(TTL, 5s); positive.
func WithStatementTimeout(d time.Duration) Option {
	return durationOption("statement timeout", "a positive duration", "WithStatementTimeout", d, func(c *config) *time.Duration { return &c.stmtTimeout })
}

// WithMaxBackoff caps the wait between polls of a blocked acquire (default
// DefaultMaxBackoff; at least MinBackoff; the effective cap is min(d, TTL);
// SPEC W2).
func WithMaxBackoff(d time.Duration) Option {
	return durationOption("max backoff", "at least "+MinBackoff.String(), "WithMaxBackoff", d, func(c *config) *time.Duration { return &c.maxBackoff })
}

// WithPendingWriterTTL sets how long a waiting writer's marker blocks new
// grants after its last refresh (default max(4 x the backoff cap, 6s), at
// most the TTL; SPEC W1). The writer refreshes it every third of this, so
// the default costs one statement per 2 s per waiting writer. A waiter that
// dies stops blocking readers after this long. Zero is rejected.
func WithPendingWriterTTL(d time.Duration) Option {
	return durationOption("pending-writer TTL", "a positive duration of at most the TTL", "WithPendingWriterTTL", d, func(c *config) *time.Duration { return &c.markerTTL })
}

// WithSafetyMargin sets how much of the TTL the holder does not trust, to
// absorb clock-rate differences and the reply's travel time (default TTL/10;
// positive, less than TTL/2; SPEC H1).
func WithSafetyMargin(d time.Duration) Option {
	return durationOption("safety margin", "a positive duration below TTL/2", "WithSafetyMargin", d, func(c *config) *time.Duration { return &c.margin })
}

// WithNotifyPollInterval caps the wait between polls of a blocked acquire
// while push wake-ups are available (a notification listener is up, SPEC
// W2): each wait is then drawn uniformly from [d/2, d] (at least 100 ms
// when d allows), since releases wake the waiter that can use them and
// polls are only the fallback; default 3s, positive, at most the TTL.
func WithNotifyPollInterval(d time.Duration) Option {
	return durationOption("notify poll interval", "a positive duration of at most the TTL", "WithNotifyPollInterval", d, func(c *config) *time.Duration { return &c.notifyPoll })
}

// WithListenDB gives the Locker a separate pool for its notification
// listener (push wake-ups, SPEC W2; dialects with CapNotify): direct
// connections to the same database, for an application whose main pool
// goes through PgBouncer in transaction pooling mode, where LISTEN cannot
// work (it is session state). The listener holds one connection of db
// while the Locker has waiters; the Locker never closes db. Without this
// option the listener uses the main pool. A listener that cannot hear
// notifications (the PostgreSQL dialect refuses a connection through a
// pooler) is given up for that pool with one warning log: waiters then poll
// every WithMaxBackoff (default 500ms) at most, so a release is seen within
// that plus one acquire round trip. Errors from New: db given for a dialect
// without CapNotify.
func WithListenDB(db *sql.DB) Option {
	return func(c *config) {
		if db == nil {
			c.rejectZero("listen database", "nil", "an open *sql.DB with direct (not pooled) connections", "WithListenDB")
		}
		c.listenDB = db
	}
}

// WithoutSchemaCheck skips New's schema version check (one query). For
// callers that just ran migrate.Up themselves.
func WithoutSchemaCheck() Option { return func(c *config) { c.skipCheck = true } }

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

func inputErr(field, value, allowed string) error {
	return &InputError{Pkg: "lock", Field: field, Value: value, Allowed: allowed}
}

func (c *config) finish(d dialect.Dialect) error {
	if c.zero != nil {
		return c.zero
	}
	if c.ttl == 0 {
		c.ttl = DefaultTTL
	}
	if err := CheckTTL(c.ttl); err != nil {
		return err
	}
	if c.owner == "" {
		c.owner = defaultOwner()
	} else if len(c.owner) > MaxOwnerLength || !utf8.ValidString(c.owner) || containsNUL(c.owner) {
		return inputErr("owner", strconv.Quote(clip(c.owner)), fmt.Sprintf("1..%d bytes of valid UTF-8 without NUL", MaxOwnerLength))
	}
	if err := c.ns.Validate(d); err != nil {
		return dialect.Relabel(err, "lock")
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	positive := func(name string, v *time.Duration, def, maxV time.Duration) error {
		if *v == 0 {
			*v = def
		}
		if *v < 0 || (maxV > 0 && *v > maxV) {
			allowed := "a positive duration"
			if maxV > 0 {
				allowed = fmt.Sprintf("a positive duration of at most %s", maxV)
			}
			return inputErr(name, v.String(), allowed)
		}
		return nil
	}
	if err := positive("renew timeout", &c.renewTimeout, c.ttl/5, c.ttl/3); err != nil {
		return err
	}
	if err := positive("release timeout", &c.releaseTimeout, DefaultReleaseTimeout, 0); err != nil {
		return err
	}
	if err := positive("statement timeout", &c.stmtTimeout, max(c.ttl, 5*time.Second), 0); err != nil {
		return err
	}
	if err := positive("max backoff", &c.maxBackoff, DefaultMaxBackoff, 0); err != nil {
		return err
	}
	if c.maxBackoff < MinBackoff {
		return inputErr("max backoff", c.maxBackoff.String(), "at least "+MinBackoff.String())
	}
	c.maxBackoff = min(c.maxBackoff, c.ttl)
	if err := c.checkFailoverPause(d); err != nil {
		return err
	}
	if c.listenDB != nil && !dialect.CapabilitiesOf(d).Has(dialect.CapNotify) {
		return inputErr("listen pool", "a *sql.DB", fmt.Sprintf("none: dialect %q has no notifications (it does not implement dialect.Listener)", d.Name()))
	}
	if err := positive("notify poll interval", &c.notifyPoll, min(3*time.Second, c.ttl), c.ttl); err != nil {
		return err
	}
	if err := positive("pending-writer TTL", &c.markerTTL, min(max(4*c.maxBackoff, 6*time.Second), c.ttl), c.ttl); err != nil {
		return err
	}
	if c.markerTTL < 3*MinBackoff*4 {
		return inputErr("pending-writer TTL", c.markerTTL.String(), "at least "+(12*MinBackoff).String())
	}
	if err := positive("safety margin", &c.margin, c.ttl/10, c.ttl/2-1); err != nil {
		return err
	}
	if c.sweepSet {
		if c.sweepEvery < 100*time.Millisecond {
			return inputErr("sweep interval", c.sweepEvery.String(), "at least 100ms")
		}
		if c.sweepLimit < 1 {
			return inputErr("sweep limit", fmt.Sprint(c.sweepLimit), "at least 1")
		}
	}
	return nil
}

// CheckTTL reports whether ttl is allowed (MinTTL..MaxTTL). The error
// matches ErrInvalidInput and names the value (SPEC I1).
func CheckTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return inputErr("TTL", ttl.String(), fmt.Sprintf("between %s and %s", MinTTL, MaxTTL))
	}
	return nil
}

// CheckKey reports whether key is allowed: 1..MaxKeyLength bytes of valid
// UTF-8 without NUL. Keys are compared byte for byte (no case folding, no
// Unicode normalization). The error matches ErrInvalidInput (SPEC I1).
func CheckKey(key string) error {
	const allowed = "keys are 1..512 bytes of valid UTF-8 without NUL"
	switch {
	case key == "":
		return inputErr("key", `""`, "empty; "+allowed)
	case len(key) > MaxKeyLength:
		return inputErr("key", strconv.Quote(clip(key)), fmt.Sprintf("is %d bytes; %s", len(key), allowed))
	case !utf8.ValidString(key):
		return inputErr("key", strconv.Quote(clip(key)), "is not valid UTF-8; "+allowed)
	case containsNUL(key):
		return inputErr("key", strconv.Quote(clip(key)), "contains NUL; "+allowed)
	}
	return nil
}

// CheckKeyPrefix reports whether prefix is allowed as a key-prefix filter
// (Holders, the sqlease status command): "" (every key) or at most
// MaxKeyLength bytes of valid UTF-8 without NUL, like a key. The error is
// an *InputError matching ErrInvalidInput that names the value (SPEC I1).
func CheckKeyPrefix(prefix string) error {
	const allowed = "key prefixes are empty (every key) or at most 512 bytes of valid UTF-8 without NUL"
	switch {
	case len(prefix) > MaxKeyLength:
		return inputErr("key prefix", strconv.Quote(clip(prefix)), fmt.Sprintf("is %d bytes; %s", len(prefix), allowed))
	case !utf8.ValidString(prefix):
		return inputErr("key prefix", strconv.Quote(clip(prefix)), "is not valid UTF-8; "+allowed)
	case containsNUL(prefix):
		return inputErr("key prefix", strconv.Quote(clip(prefix)), "contains NUL; "+allowed)
	}
	return nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// clip shortens s for a message, never cutting a valid character in two.
func clip(s string) string {
	if len(s) <= 40 {
		return s
	}
	n := 40
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
