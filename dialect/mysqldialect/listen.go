package mysqldialect

// Push wake-ups without LISTEN/NOTIFY (SPEC W2; migration 00009): a
// doorbell. The listening session registers itself and waits in a CALL
// that a release of a watched key interrupts with KILL QUERY; it then
// reads the new wake rows and delivers them.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/dialect"
)

var _ dialect.Listener = Dialect{}

// Timing of a listening session: each CALL waits at most listenSleep
// (whole seconds); the registration lasts listenTTL and is refreshed every
// third of it (a registration left by a session that ended is ignored by
// releases at once, since its named lock is gone, and deleted by a
// listener once expired). Variables so tests can shorten them.
var (
	listenSleep = 10 * time.Second
	listenTTL   = 30 * time.Second
)

// Listen makes conn a listening session of channel's namespace (migration
// 00009) and delivers the dialect.Wake payloads of the releases of watched
// keys until ctx ends or a statement fails. It takes the named lock
// "sqlease:listener:" + a random tag, which proves to releases that the
// session is a listener, registers conn's CONNECTION_ID() and the tag in
// the namespace's listeners table, calls ready, then loops on CALL
// {listen}, which returns the wake rows after the last one seen, waiting
// first when there are none; a release of a watched key interrupts it
// with KILL QUERY. conn is never returned to the pool (a release must
// never interrupt another statement on it): Listen discards it. It returns
// an error matching errors.ErrUnsupported on MySQL (only MariaDB has the
// wait, MASTER_GTID_WAIT) and when channel is not a dialect.Namespace
// channel it can map back to the namespace's tables (a name cut to 63
// bytes). Errors are the database's.
func (d Dialect) Listen(ctx context.Context, conn *sql.Conn, channel string, deliver func(string), ready func()) (err error) {
	ns, ok := namespaceOfChannel(channel)
	if !ok {
		return fmt.Errorf("mysqldialect: channel %q does not name a namespace ([schema.]prefix + \"release\", at most 63 bytes): %w", channel, errors.ErrUnsupported)
	}
	defer func() {
		// Discard the session: it may be mid-statement, and a KILL QUERY
		// sent to it must never reach a statement of the pool's users.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}()
	ln := &listening{conn: conn, listenProc: ns.Object(d, "listen"), startProc: ns.Object(d, "listen_start")}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	ln.tag = hex.EncodeToString(b)
	if err := ln.start(ctx); err != nil {
		return err
	}
	ready()
	for {
		if time.Since(ln.registered) >= listenTTL/3 {
			if err := ln.register(ctx); err != nil {
				return err
			}
		}
		if err := ln.next(ctx, deliver); err != nil {
			return err
		}
	}
}

// listening is the state of one listening session.
type listening struct {
	conn                  *sql.Conn
	listenProc, startProc string // the quoted procedure names
	tag                   string // names the session's named lock
	last                  int64  // the last wake row delivered
	registered            time.Time
}

// start checks the server (MariaDB), takes the session's named lock,
// prepares the session (autocommit, so that each statement reads what
// committed before it began; short lock waits) and registers it, noting
// the last wake row.
func (ln *listening) start(ctx context.Context) error {
	var mariaDB bool
	var got sql.NullInt64
	name := "sqlease:listener:" + ln.tag
	if err := ln.conn.QueryRowContext(ctx, `SELECT VERSION() LIKE '%MariaDB%', GET_LOCK('`+name+`', 0)`).Scan(&mariaDB, &got); err != nil {
		return fmt.Errorf("mysqldialect: listen: %w", err)
	}
	if !mariaDB {
		return fmt.Errorf("mysqldialect: push wake-ups need MariaDB (MASTER_GTID_WAIT), not MySQL; waiters poll: %w", errors.ErrUnsupported)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("mysqldialect: listen: named lock %q not granted (GET_LOCK returned %v)", name, got)
	}
	if err := ln.exec(ctx, `SET SESSION autocommit = 1, innodb_lock_wait_timeout = 2`); err != nil {
		return err
	}
	return ln.register(ctx)
}

// register inserts or refreshes the session's registration and deletes
// expired rows ({listen_start}); at the start, it notes the last wake row.
func (ln *listening) register(ctx context.Context) error {
	at := time.Now()
	var last int64
	err := retryInterrupted(func() error {
		return ln.conn.QueryRowContext(ctx, fmt.Sprintf(`CALL %s('%s', %d)`, ln.startProc, ln.tag, listenTTL.Microseconds())).Scan(&last)
	})
	if err != nil {
		return fmt.Errorf("mysqldialect: listen: %w", err)
	}
	if ln.registered.IsZero() {
		ln.last = last
	}
	ln.registered = at
	return nil
}

// next runs CALL {listen} once: it delivers the wake rows after ln.last,
// waiting first, when there are none, until listenSleep passes or a
// release interrupts it. The procedure waits only when a statement that
// began inside the CALL found no new row, so a wake row that committed
// before the CALL began is never waited over.
func (ln *listening) next(ctx context.Context, deliver func(string)) error {
	q := fmt.Sprintf(`CALL %s(%d, %d)`, ln.listenProc, ln.last, max(1, int(listenSleep/time.Second)))
	rows, err := ln.conn.QueryContext(ctx, q)
	if err != nil {
		return ln.failed(err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq int64
		var payload []byte
		if err := rows.Scan(&seq, &payload); err != nil {
			return ln.failed(err)
		}
		if seq > ln.last {
			ln.last = seq
			deliver(string(payload))
		}
	}
	return ln.failed(rows.Err())
}

// failed returns nil for no error and for an interrupted statement (the
// doorbell), and the error otherwise.
func (ln *listening) failed(err error) error {
	if err == nil || interrupted(err) {
		return nil
	}
	return fmt.Errorf("mysqldialect: listen: %w", err)
}

// exec runs a statement of the session, again when a doorbell interrupted
// it.
func (ln *listening) exec(ctx context.Context, q string) error {
	err := retryInterrupted(func() error {
		_, err := ln.conn.ExecContext(ctx, q)
		return err
	})
	if err != nil {
		return fmt.Errorf("mysqldialect: listen: %w", err)
	}
	return nil
}

// retryInterrupted runs f until it does not fail with ER_QUERY_INTERRUPTED
// (a KILL QUERY doorbell), at most 10 times.
func retryInterrupted(f func() error) error {
	var err error
	for range 10 {
		if err = f(); !interrupted(err) {
			return err
		}
	}
	return err
}

// interrupted reports whether err is ER_QUERY_INTERRUPTED.
func interrupted(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errInterrupted
}

// namespaceOfChannel inverts dialect.Namespace.Channel: "[schema.]prefix"
// + "release". A channel cut to 63 bytes ends with a hash, not "release".
func namespaceOfChannel(channel string) (dialect.Namespace, bool) {
	rest, ok := strings.CutSuffix(channel, "release")
	if !ok {
		return dialect.Namespace{}, false
	}
	var ns dialect.Namespace
	if schema, prefix, ok := strings.Cut(rest, "."); ok {
		ns.Schema, rest = schema, prefix
	}
	ns.Prefix = rest
	return ns, ns.Channel() == channel
}
