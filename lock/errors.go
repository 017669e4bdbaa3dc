package lock

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Every error the package returns for these conditions
// matches one of them through errors.Is; the typed errors below carry the
// detail and are reached with errors.As.
var (
	// ErrLocked: the key is held in a conflicting mode, or a pending writer
	// blocks a shared request (SPEC W1, W3). Detail: *LockedError.
	ErrLocked = errors.New("lock: locked")
	// ErrLeaseLost: the lease is gone, was taken over, or its trusted window
	// ran out (SPEC H2, H3, F2). Detail: *LeaseLostError.
	ErrLeaseLost = errors.New("lock: lease lost")
	// ErrNotHeld: the database holds no such lease (Release of a lease that
	// already ended by expiry or takeover, Renew after Release).
	ErrNotHeld = errors.New("lock: lease not held")
	// ErrReentrant: this Locker already holds or is acquiring the key
	// (SPEC W4).
	ErrReentrant = errors.New("lock: key already held by this locker")
	// ErrReleased is the context cause of a lease that was released.
	ErrReleased = errors.New("lock: lease released")
	// ErrClosed: the Locker was closed.
	ErrClosed = errors.New("lock: locker closed")
	// ErrInvalidInput: a bad key, TTL, duration, option or argument
	// (SPEC I1). Detail: *InputError.
	ErrInvalidInput = errors.New("lock: invalid input")
	// ErrSchemaNotMigrated: the lock tables are missing or older than this
	// library (SPEC D1). Detail: *SchemaError.
	ErrSchemaNotMigrated = errors.New("lock: schema not migrated")
)

// Holder describes one lease or pending-writer marker found in the database.
type Holder struct {
	Key     string
	Mode    Mode // Exclusive or Shared; PendingWriter for a marker
	LeaseID string
	Owner   string
	Token   int64     // 0 for a marker
	Expiry  time.Time // database time
}

func (h Holder) String() string {
	return fmt.Sprintf("%s %s owner=%q token=%d expires=%s", h.Mode, h.LeaseID, h.Owner, h.Token, h.Expiry.UTC().Format(time.RFC3339Nano))
}

// LockedError reports who blocks an acquire (SPEC W3). It matches ErrLocked.
type LockedError struct {
	Key  string
	Mode Mode // the mode that was requested
	// Holders are the live leases in a conflicting mode and the pending
	// writer marker, if any, as seen by the last attempt.
	Holders []Holder
	// Waited is how long a blocking acquire waited before giving up (0 for
	// a try).
	Waited time.Duration
}

func (e *LockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lock: acquire %s %q: locked", e.Mode, e.Key)
	if e.Waited > 0 {
		fmt.Fprintf(&b, " after waiting %s", e.Waited.Round(time.Millisecond))
	}
	for i, h := range e.Holders {
		if i == 0 {
			b.WriteString(" by ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(h.String())
	}
	return b.String()
}

// Is matches ErrLocked.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// LossReason says why a lease was lost.
type LossReason string

const (
	// LossNotOurs: the database no longer has this lease (expired and taken
	// over or swept, deleted, or never ours).
	LossNotOurs LossReason = "lease not found in database (expired and taken over, swept, or deleted)"
	// LossWindowExhausted: renewals kept failing until the trusted window
	// (SPEC H1) ended.
	LossWindowExhausted LossReason = "trusted window ended before a renewal succeeded"
	// LossFenceFailed: a fence found the lease no longer live.
	LossFenceFailed LossReason = "fence found the lease expired or gone"
)

// LeaseLostError says which lease was lost and why (SPEC H3). It matches
// ErrLeaseLost.
type LeaseLostError struct {
	Key     string
	LeaseID string
	Token   int64
	Reason  LossReason
	// Err is the last database error, for LossWindowExhausted.
	Err error
}

func (e *LeaseLostError) Error() string {
	s := fmt.Sprintf("lock: lease %q token %d lost: %s", e.Key, e.Token, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches ErrLeaseLost.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Unwrap returns the last database error, if any.
func (e *LeaseLostError) Unwrap() error { return e.Err }

// InputError names a bad input value and what is allowed (SPEC I1). It
// matches ErrInvalidInput.
type InputError struct {
	Field   string // "key", "TTL", "wait timeout", ...
	Value   string // the bad value, quoted or formatted
	Allowed string // what would be accepted
}

func (e *InputError) Error() string {
	return fmt.Sprintf("lock: invalid %s %s: %s", e.Field, e.Value, e.Allowed)
}

// Is matches ErrInvalidInput.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// SchemaError reports lock tables that are missing or older than this
// library (SPEC D1). It matches ErrSchemaNotMigrated.
type SchemaError struct {
	Dialect string
	Table   string // the version table looked at
	Current int64  // applied version, 0 when the tables do not exist
	Want    int64  // version this library needs
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("lock: %s schema is at version %d (version table %s), this library needs %d: run migrate.Up(ctx, db, dialect) or `sqlease migrate --dsn DSN` first, with the same schema and prefix as the Locker (migrate.WithNamespace; --schema, --prefix)",
		e.Dialect, e.Current, e.Table, e.Want)
}

// Is matches ErrSchemaNotMigrated.
func (e *SchemaError) Is(target error) bool { return target == ErrSchemaNotMigrated }
