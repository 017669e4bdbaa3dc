package lock

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/advice"
)

// Sentinel errors. Every error the package returns for these conditions
// matches one of them through errors.Is; the typed errors below carry the
// detail and are reached with errors.As. Their texts carry no "lock:"
// prefix because they appear only at the end of a message that already
// starts with it (`lock: acquire shared "tenant/42": key already held by
// this locker`).
var (
	// ErrLocked: the key is held in a conflicting mode, or a pending writer
	// blocks a shared request (SPEC W1, W3). Detail: *LockedError.
	ErrLocked = errors.New("locked")
	// ErrLeaseLost: the lease is gone, was taken over, or its trusted window
	// ran out (SPEC H2, H3, F2). Detail: *LeaseLostError.
	ErrLeaseLost = errors.New("lease lost")
	// ErrNotHeld: the database holds no such lease (Release of a lease that
	// already ended by expiry or takeover, Renew after Release).
	ErrNotHeld = errors.New("lease not held")
	// ErrReentrant: this Locker already holds or is acquiring the key
	// exclusively, or holds or is acquiring it at all and the new acquire
	// is exclusive; the acquire would wait behind this Locker itself (SPEC
	// W4). Several shared leases of one key are allowed (SPEC W5).
	ErrReentrant = errors.New("key already held by this locker")
	// ErrReleased is the context cause of a lease that was released.
	ErrReleased = errors.New("lease released")
	// ErrClosed: the Locker was closed.
	ErrClosed = errors.New("locker closed")
	// ErrInvalidInput: a bad key, key prefix, TTL, duration, option,
	// namespace or argument (SPEC I1). It is dialect.ErrInvalidInput, the
	// one input sentinel of every sqlease package, so errors.Is matches it
	// whether lock, migrate or dialect returned the error. Detail:
	// *InputError.
	ErrInvalidInput = dialect.ErrInvalidInput
	// ErrSchemaNotMigrated: the lock tables are missing or older than this
	// library (SPEC D1). Detail: *SchemaError.
	ErrSchemaNotMigrated = errors.New("schema not migrated")
	// ErrReadOnly: New was given a read-only replica (a PostgreSQL hot
	// standby, a MySQL or MariaDB server with read_only on) instead of the
	// primary; a lease granted there would not exist on the primary (SPEC
	// S7). It is dialect.ErrReadOnly. Detail: *dialect.ServerError, which
	// names the server; a server that is writable but breaks the dialect's
	// rules (a Galera node) gets the same type matching
	// errors.ErrUnsupported instead.
	ErrReadOnly = dialect.ErrReadOnly
)

// Holder describes one lease, pending-writer marker or FIFO ticket found in
// the database.
type Holder struct {
	Key     string
	Mode    Mode   // Exclusive or Shared; PendingWriter for a marker; Queued for a FIFO ticket (SPEC W6)
	LeaseID string // the ticket ID for a FIFO ticket
	Owner   string
	Token   int64     // 0 for a marker; the place in the key's queue for a FIFO ticket
	Expiry  time.Time // database time
}

func (h Holder) String() string {
	if h.Mode == FailoverPause {
		return fmt.Sprintf("%s until %s (a new primary grants nothing until then)", h.Mode, h.Expiry.UTC().Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("%s %s owner=%q token=%d expires=%s", h.Mode, h.LeaseID, h.Owner, h.Token, h.Expiry.UTC().Format(time.RFC3339Nano))
}

// LockedError reports who blocks an acquire (SPEC W3). It matches ErrLocked.
type LockedError struct {
	Key  string
	Mode Mode // the mode that was requested
	// Limit is the n of a semaphore acquire (Limit, SPEC W7); 0 otherwise.
	Limit int
	// Holders are the live leases in a conflicting mode and the pending
	// writer marker, if any, as seen by the last attempt; for a FIFO
	// acquire also the conflicting tickets ahead of it (mode Queued, SPEC
	// W6). A new primary inside its failover pause is one holder of mode
	// FailoverPause whose Expiry is the end of the pause (SPEC S7,
	// WithFailoverPause).
	Holders []Holder
	// Waited is how long a blocking acquire waited before giving up (0 for
	// a try).
	Waited time.Duration
	// Err is the error of the last attempt when it failed (a transient
	// error, retried until the wait ran out: a dropped or refused
	// connection, a lock wait cut short) instead of being refused; nil
	// when the last attempt was refused. Holders then come from the last
	// refused attempt, and are empty when no attempt reached the
	// database. It is not unwrapped: errors.Is(err, ErrLocked) stays the
	// one answer, and a statement's context.DeadlineExceeded is not taken
	// for the caller's.
	Err error
}

func (e *LockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lock: acquire %s %q: locked", e.Mode, e.Key)
	if e.Limit > 0 {
		fmt.Fprintf(&b, " (at most %d shared holders, lock.Limit)", e.Limit)
	}
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
	if e.Err != nil {
		fmt.Fprintf(&b, " (the last attempt failed: %v)", e.Err)
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
	// LossOrphaned: Orphan stopped renewing the lease on purpose; it ends
	// by expiry in the database.
	LossOrphaned LossReason = "orphaned: renewal stopped by Orphan, the lease ends by expiry"
	// LossMaxLife: the lease reached the maximum life HoldAtMost gave it
	// (SPEC H10); its row expires at grant + that life.
	LossMaxLife LossReason = "maximum life (HoldAtMost) reached"
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

// InputError names a bad input value and what is allowed (SPEC I1). It is
// dialect.InputError (an alias: one type across lock, migrate and dialect)
// and matches ErrInvalidInput; errors about a schema or prefix also match
// dialect.ErrInvalidName.
type InputError = dialect.InputError

// SchemaError reports lock tables that are missing or older than this
// library (SPEC D1). It matches ErrSchemaNotMigrated. Its message says how
// to migrate; when the namespace is not migrated at all (Current 0) and
// the caller named a schema or prefix, it also cautions that a mistyped
// one, once migrated, would be a second set of lock tables whose leases
// exclude nothing in the first.
type SchemaError struct {
	Dialect string
	Table   string // the version table looked at
	Current int64  // applied version, 0 when the tables do not exist
	Want    int64  // version this library needs
	// Namespace is the Locker's schema and prefix, which the migrations
	// must be applied with; the message names them.
	Namespace dialect.Namespace
	// Elsewhere names lock tables found under another schema or prefix
	// when Current is 0, with the option that reaches them ("found
	// nc_db_version: did you mean lock.WithTablePrefix(\"nc_\")?"); "" when
	// none were found.
	Elsewhere string
}

func (e *SchemaError) Error() string {
	if e.Current == 0 {
		found := ""
		if e.Elsewhere != "" {
			found = e.Elsewhere + " If not, "
		}
		return fmt.Sprintf("lock: the %s lock tables are not migrated (version table %s is at version 0), this library needs %d: %s%s%s",
			e.Dialect, e.Table, e.Want, found, advice.MigrateUp(e.Namespace), advice.Caution(e.Namespace, e.Elsewhere != ""))
	}
	return fmt.Sprintf("lock: the %s lock tables are at version %d (version table %s), this library needs %d: %s",
		e.Dialect, e.Current, e.Table, e.Want, advice.MigrateUp(e.Namespace))
}

// Is matches ErrSchemaNotMigrated.
func (e *SchemaError) Is(target error) bool { return target == ErrSchemaNotMigrated }

// joinedError is errors.Join on one line: its message is its parts'
// messages separated by "; ", and errors.Is and errors.As see every part.
type joinedError []error

func (e joinedError) Error() string {
	var b strings.Builder
	for i, err := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e joinedError) Unwrap() []error { return e }

// join is errors.Join on one line (joinedError), without repeats: nil
// errors are dropped, an error that an error kept before already matches
// (errors.Is: the loss Do reports and the same loss returned by the
// function as context.Cause) is dropped, and an error that matches one
// kept before takes its place (it wraps it, with more context). One error
// left is returned as it is.
func join(errs ...error) error {
	var kept joinedError
next:
	for _, err := range errs {
		if err == nil {
			continue
		}
		for i, k := range kept {
			switch {
			case errors.Is(k, err):
				continue next
			case errors.Is(err, k):
				kept[i] = err
				continue next
			}
		}
		kept = append(kept, err)
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return kept
}
