package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ErrReadOnly is matched (errors.Is) when the server is a read-only replica
// (a PostgreSQL hot standby, a MySQL or MariaDB server with read_only on):
// a lease granted there would not exist on the primary, so lock.New and
// migrate.Up refuse it before they write anything (rule S7 of
// docs/contract.md). lock.ErrReadOnly is this same value. Detail:
// *ServerError.
var ErrReadOnly = errors.New("read-only server")

// ServerError says why a server cannot hold leases: it is a read-only
// replica (ReadOnly; matches ErrReadOnly), or something else about it
// breaks the dialect's rules (for example a Galera node, which does not
// replicate GET_LOCK; matches errors.ErrUnsupported).
type ServerError struct {
	// Pkg is the package that reports it ("lock", "migrate"); it starts
	// the message when set.
	Pkg string
	// Dialect is the dialect's registry name.
	Dialect string
	// ReadOnly is true for a read-only replica.
	ReadOnly bool
	// Reason is the dialect's own description, naming the server.
	Reason string
}

func (e *ServerError) Error() string {
	what := "cannot hold leases"
	if e.ReadOnly {
		what = "is read-only (a replica); connect to the primary"
	}
	msg := fmt.Sprintf("%s server %s: %s", e.Dialect, what, e.Reason)
	if e.Pkg != "" {
		msg = e.Pkg + ": " + msg
	}
	return msg
}

// Is matches ErrReadOnly for a read-only replica and errors.ErrUnsupported
// otherwise.
func (e *ServerError) Is(target error) bool {
	if e.ReadOnly {
		return target == ErrReadOnly
	}
	return target == errors.ErrUnsupported
}

// CheckPrimary runs d's Statements.Primary query, if it has one, on db and
// returns a *ServerError, reported by package pkg (may be empty), when the server cannot
// hold leases (rule S7); a dialect without the query passes. Other errors
// are the database's, wrapped.
func CheckPrimary(ctx context.Context, db *sql.DB, d Dialect, pkg string) error {
	q := d.Statements().Primary
	if q == "" {
		return nil
	}
	var readOnly bool
	var reason sql.NullString
	if err := db.QueryRowContext(ctx, q).Scan(&readOnly, &reason); err != nil {
		err = fmt.Errorf("check that the %s server is a writable primary: %w", d.Name(), err)
		if pkg != "" {
			err = fmt.Errorf("%s: %w", pkg, err)
		}
		return err
	}
	if !readOnly && reason.String == "" {
		return nil
	}
	return &ServerError{Pkg: pkg, Dialect: d.Name(), ReadOnly: readOnly, Reason: reason.String}
}
