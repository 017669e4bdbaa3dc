package dialect

import (
	"context"
	"database/sql"
)

// Killer is an optional interface for dialects whose driver, when a
// statement's context ends, only closes the connection while the server
// goes on running the statement (go-sql-driver/mysql): an acquire
// abandoned while its statement waits for a lock on the server would
// otherwise be granted after it returned, and hold the key for one TTL
// (SPEC H6).
//
// The engine reads the session ID of the connection an acquire statement
// runs on before sending it. When the caller gives up (its context ends,
// or its deadline or wait timeout passes) while the statement runs, the
// engine calls Kill from another connection of the pool and waits, for at
// most 250 ms, for the statement's reply: its outcome is then known (the
// server runs nothing of it any more), and a grant it committed is undone
// before the acquire returns. The connection is discarded afterwards,
// never reused. When Kill fails, or the reply does not come in time, the
// engine drops the connection as without Killer.
type Killer interface {
	// SessionID returns the server's ID of conn's session (MySQL:
	// CONNECTION_ID()). It may cache the ID per driver connection.
	SessionID(ctx context.Context, conn *sql.Conn) (int64, error)
	// Kill stops the statement session id is running, sent on a
	// connection of db (MySQL: KILL CONNECTION), and returns once the server
	// accepted it. The statement then fails, or has already finished.
	Kill(ctx context.Context, db *sql.DB, id int64) error
}
