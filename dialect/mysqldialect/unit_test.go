package mysqldialect_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
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

func TestWithParseTime(t *testing.T) {
	got, err := mysqldialect.WithParseTime("root@tcp(127.0.0.1:3306)/test?timeout=5s")
	if err != nil || !strings.Contains(got, "parseTime=true") || !strings.Contains(got, "timeout=5s") {
		t.Errorf("WithParseTime: %q, %v", got, err)
	}
	if _, err := mysqldialect.WithParseTime("not a dsn"); err == nil {
		t.Errorf("WithParseTime of a bad DSN: want an error")
	}
}

// TestDetectAndParseTime: the dialect is detected from the driver, and
// migrate.Up on a pool without parseTime=true fails at once with
// ErrParseTimeRequired (goose's lock would retry its failing scan for
// minutes), writing no lock table.
func TestDetectAndParseTime(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	dsn := conftest.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime = false
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := dialect.Detect(db)
	if err != nil || d.Name() != mysqldialect.Name {
		t.Fatalf("Detect: %v, %v", d, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ns := dialect.Namespace{Schema: "sqlease_t_parsetime"}
	defer db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS sqlease_t_parsetime")
	_, err = migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
	if !errors.Is(err, mysqldialect.ErrParseTimeRequired) {
		t.Fatalf("migrate.Up without parseTime: want ErrParseTimeRequired, got %v", err)
	}
	if !strings.Contains(err.Error(), "parseTime=true") {
		t.Errorf("error %q should say how to fix the DSN", err)
	}
	// With parseTime the same call works.
	cfg.ParseTime = true
	db2, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if _, err := migrate.Up(ctx, db2, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatalf("migrate.Up with parseTime: %v", err)
	}
}
