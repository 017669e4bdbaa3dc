package pgdialect

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// listenDirect makes c LISTEN on channel and checks that c is a session of
// its own on the server, the only kind that hears notifications. One simple
// query (one transaction, so a pooler keeps it on one server connection)
// runs LISTEN and reads pg_backend_pid(). On a direct connection that is the
// process ID the server announced at connect time (BackendKeyData). A
// pooler (PgBouncer, and other proxies) announces its own key instead; in
// transaction or statement pooling mode the LISTEN stays behind on a server
// connection that goes back to the pool, and notifications never reach c.
// Since the pooling mode cannot be read from the connection, any pooler is
// refused with an error matching errors.ErrUnsupported that says what to do
// (the engine then polls).
func (d Dialect) listenDirect(ctx context.Context, c *pgx.Conn, channel string) error {
	res, err := c.PgConn().Exec(ctx, "LISTEN "+d.QuoteIdent(channel)+"; SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return err
	}
	if len(res) != 2 || len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 1 {
		return fmt.Errorf("pgdialect: LISTEN %q: unexpected reply to SELECT pg_backend_pid()", channel)
	}
	backend, err := strconv.ParseUint(string(res[1].Rows[0][0]), 10, 32)
	if err != nil {
		return fmt.Errorf("pgdialect: LISTEN %q: pg_backend_pid() = %q: %w", channel, res[1].Rows[0][0], err)
	}
	if key := c.PgConn().PID(); uint32(backend) != key {
		return fmt.Errorf("pgdialect: LISTEN %q: the connection goes through a pooler (server backend %d, announced process ID %d), where LISTEN does not last beyond the statement in transaction pooling mode (PgBouncer pool_mode = transaction); give the Locker a direct connection for LISTEN (lock.WithListenDB); waiters poll: %w",
			channel, backend, key, errors.ErrUnsupported)
	}
	return nil
}
