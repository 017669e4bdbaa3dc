package mysqldialect_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

func TestClassify(t *testing.T) {
	d := mysqldialect.New()
	for _, tc := range []struct {
		err  error
		want dialect.ErrorClass
	}{
		{&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 1969, Message: "max_statement_time exceeded"}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 1040, Message: "Too many connections"}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 1203, Message: "User already has more than 'max_user_connections' active connections"}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 1226, Message: "User has exceeded the 'max_user_connections' resource"}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 9999, SQLState: [5]byte{'4', '0', '0', '0', '1'}}, dialect.ErrorRetryable},
		{&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, dialect.ErrorConflict},
		{&mysql.MySQLError{Number: 1146, Message: "Table doesn't exist"}, dialect.ErrorUndefinedTable},
		{&mysql.MySQLError{Number: 1305, Message: "PROCEDURE does not exist"}, dialect.ErrorUndefinedTable},
		{&mysql.MySQLError{Number: 1064, Message: "syntax error"}, dialect.ErrorOther},
		{mysql.ErrInvalidConn, dialect.ErrorRetryable},
		{io.ErrUnexpectedEOF, dialect.ErrorRetryable},
		{&net.OpError{Op: "read", Err: errors.New("reset")}, dialect.ErrorRetryable},
		{errors.New("other"), dialect.ErrorOther},
		{nil, dialect.ErrorOther},
	} {
		if got := d.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// TestConnectionLimitIsRetried: a connection the server refuses for too
// many connections (here error 1226, the account's MAX_USER_CONNECTIONS 1,
// taken by another session) is retried like a failed connect, so a
// blocking Acquire with a deadline is granted once the other session ends
// instead of failing at once (SPEC H9).
func TestConnectionLimitIsRetried(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	cfg, err := mysql.ParseDSN(conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime = true
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the cleanup below, which needs it (cleanups run last
	// registered first, after the test's defers).
	t.Cleanup(func() { admin.Close() })
	const schema, user = "sqlease_t_connlim", "sqlease_t_connlim"
	cleanup := func() {
		admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+schema)
		admin.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'")
	}
	cleanup()
	t.Cleanup(cleanup)
	ns := dialect.Namespace{Schema: schema}
	d := mysqldialect.New()
	if _, err := migrate.Up(ctx, admin, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%' WITH MAX_USER_CONNECTIONS 1",
		"GRANT ALL ON " + schema + ".* TO '" + user + "'@'%'",
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	ucfg := cfg.Clone()
	ucfg.User, ucfg.Passwd, ucfg.DBName = user, "", schema
	udb, err := sql.Open("mysql", ucfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer udb.Close()
	l, err := lock.New(ctx, udb, d, lock.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	udb.SetMaxIdleConns(0) // the Locker's next statement needs a new connection

	hog, err := sql.Open("mysql", ucfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	// The user's one connection. The server frees the slot of the
	// connection the pool just closed (SetMaxIdleConns(0) above) a moment
	// after the client hangs up, so the first tries may be refused too.
	var held *sql.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		held, err = hog.Conn(ctx)
		var me *mysql.MySQLError
		if err == nil || !errors.As(err, &me) || me.Number != 1226 && me.Number != 1203 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := udb.PingContext(ctx); err == nil {
		t.Fatal("a second connection of the user was accepted; want it refused by MAX_USER_CONNECTIONS 1")
	} else if me := (*mysql.MySQLError)(nil); !errors.As(err, &me) || me.Number != 1226 && me.Number != 1203 {
		t.Fatalf("second connection of the user: %v; want error 1226 (or 1203)", err)
	}
	time.AfterFunc(time.Second, func() { held.Close(); hog.Close() })
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	start := time.Now()
	le, err := l.Acquire(actx, "connlim", lock.Exclusive)
	if err != nil {
		t.Fatalf("Acquire while the user's connection was taken (freed after 1 s): %v after %v; want it granted", err, time.Since(start))
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("Acquire granted after %v, before the user's connection was freed (1 s)", took)
	}
	if err := le.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
