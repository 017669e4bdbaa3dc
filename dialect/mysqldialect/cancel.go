package mysqldialect

// Stopping an abandoned acquire on the server (SPEC H6). go-sql-driver/mysql
// closes the connection when a statement's context ends, and the server
// goes on running the statement: an acquire CALL waiting for the per-key
// lock or a fenced row would grant after the caller gave up. The engine
// (dialect.Killer) kills its session instead with KILL CONNECTION from
// another connection and reads its reply.

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/sqlease/sqlease/dialect"
)

var _ dialect.Killer = Dialect{}

// sessionIDs caches CONNECTION_ID() per driver connection, so an acquire
// costs no extra round trip on a connection seen before. The cache is
// emptied when it reaches maxSessionIDs entries: it holds closed
// connections too (their keys cannot be reused while the map holds them),
// and a connection in use by another goroutine must not be touched to ask
// whether it is closed.
var sessionIDs = struct {
	sync.Mutex
	m map[any]int64
}{m: map[any]int64{}}

// maxSessionIDs bounds sessionIDs; emptied, it costs one SELECT
// CONNECTION_ID() per connection again.
const maxSessionIDs = 4096

// SessionID returns conn's CONNECTION_ID(), cached per driver connection
// (dialect.Killer). Errors are the database's.
func (Dialect) SessionID(ctx context.Context, conn *sql.Conn) (int64, error) {
	var dc any
	if err := conn.Raw(func(c any) error { dc = c; return nil }); err != nil {
		return 0, err
	}
	sessionIDs.Lock()
	id, ok := sessionIDs.m[dc]
	sessionIDs.Unlock()
	if ok {
		return id, nil
	}
	if err := conn.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
		return 0, fmt.Errorf("mysqldialect: session ID: %w", err)
	}
	sessionIDs.Lock()
	defer sessionIDs.Unlock()
	if len(sessionIDs.m) >= maxSessionIDs {
		clear(sessionIDs.m)
	}
	sessionIDs.m[dc] = id
	return id, nil
}

// Kill sends KILL CONNECTION id on a connection of db (dialect.Killer):
// the server interrupts the statement session id runs (a wait for GET_LOCK
// or a row lock ends at once) and ends the session, rolling back what the
// statement had not committed yet. KILL QUERY would end only the
// statement, and MariaDB can cut a read inside a stored procedure short
// without an error: the acquire procedure then goes on, may grant beside
// a live lease and commit (TestKillCommitsNothingMore_MySQL). A user may
// kill its own sessions without any privilege. Errors are the database's.
func (Dialect) Kill(ctx context.Context, db *sql.DB, id int64) error {
	if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		return fmt.Errorf("mysqldialect: KILL CONNECTION %d: %w", id, err)
	}
	return nil
}
