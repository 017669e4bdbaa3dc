package lock

// Reading the rows of the engine's hot statements (acquire, release, the
// marker refresh) straight from the driver connection.
//
// database/sql starts a goroutine for every query whose context can end
// (sql.Rows watches the context to close the rows), and every engine
// statement runs under a context with a timeout (SPEC H5, H9). Through
// sql.Conn.Raw the engine hands the same context to the driver, which
// cancels the statement itself when it ends (pgx without a goroutine,
// mattn/go-sqlite3 and modernc.org/sqlite with their own), and reads the
// rows without database/sql's goroutine and per-row bookkeeping. Drivers
// whose connections do not implement driver.QueryerContext, or answer
// driver.ErrSkip (go-sql-driver/mysql does for a query with arguments
// unless the DSN sets interpolateParams=true: it prepares it first), and
// arguments their checkers refuse, take database/sql's path.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

// rowScanner reads the current result row into dest (*bool, *string or
// *int64 for the driver path; anything database/sql accepts otherwise).
type rowScanner interface {
	Scan(dest ...any) error
}

// queryConn runs the query q with args on conn under ctx and calls each for
// every result row, stopping at each's first error. Errors are the
// driver's, as database/sql would return them; a broken connection
// (driver.ErrBadConn) is discarded by database/sql when it goes back.
func queryConn(ctx context.Context, conn *sql.Conn, q string, args []any, each func(rowScanner) error) error {
	direct := false
	err := conn.Raw(func(dc any) error {
		qc, ok := dc.(driver.QueryerContext)
		if !ok {
			return nil
		}
		nv, ok := namedValues(dc, args)
		if !ok {
			return nil
		}
		rows, err := qc.QueryContext(ctx, q, nv)
		if errors.Is(err, driver.ErrSkip) {
			return nil
		}
		direct = true
		if err != nil {
			return err
		}
		return readRows(rows, each)
	})
	if direct || err != nil {
		return err
	}
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	return eachRow(rows, each)
}

// eachRow calls each for every row of rows and closes them. It reads the
// rest of the statement's reply (drainResults) before Close.
func eachRow(rows *sql.Rows, each func(rowScanner) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	drainResults(rows)
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// drainResults reads the result sets left after the rows read, while the
// statement's context still bounds the read. A stored procedure that
// returns its rows before its COMMIT answers last with the commit's status;
// go-sql-driver/mysql reads that part at Close without the context, so a
// commit waiting for a semi-synchronous replica's acknowledgement would
// hold the caller past its deadline (SPEC H9). An error ends the draining
// and is left in rows.Err.
func drainResults(rows *sql.Rows) {
	for rows.NextResultSet() {
		for rows.Next() {
		}
	}
}

// queryOne runs q on db and scans its one row into dest, as QueryRowContext
// does, but reads the rest of the reply under ctx (drainResults). No row is
// sql.ErrNoRows; with strict (a dialect with replicas), a row that arrived
// after ctx ended is errUnconfirmed (its commit may have been cancelled
// while waiting for a synchronous standby).
func queryOne(ctx context.Context, strict bool, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string, args []any, dest ...any) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	found := false
	err = eachRow(rows, func(r rowScanner) error {
		if found {
			return nil
		}
		found = true
		return r.Scan(dest...)
	})
	if err == nil && !found {
		err = sql.ErrNoRows
	}
	if err == nil && strict && ctx.Err() != nil {
		err = errUnconfirmed
	}
	return err
}

// namedValues converts args as database/sql does for a connection: the
// connection's driver.NamedValueChecker first, then
// driver.DefaultParameterConverter. It reports false (take database/sql's
// path, which reports the error) for an argument either refuses and for
// named arguments.
func namedValues(dc any, args []any) ([]driver.NamedValue, bool) {
	nv := make([]driver.NamedValue, len(args))
	checker, _ := dc.(driver.NamedValueChecker)
	for i, a := range args {
		if _, ok := a.(sql.NamedArg); ok {
			return nil, false
		}
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		if checker != nil {
			err := checker.CheckNamedValue(&nv[i])
			if err == nil {
				continue
			}
			if !errors.Is(err, driver.ErrSkip) {
				return nil, false
			}
		}
		v, err := driver.DefaultParameterConverter.ConvertValue(a)
		if err != nil {
			return nil, false
		}
		nv[i].Value = v
	}
	return nv, true
}

// readRows calls each for every row of rows and closes them.
func readRows(rows driver.Rows, each func(rowScanner) error) (err error) {
	defer func() {
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}()
	cols := rows.Columns()
	r := &driverRow{cols: cols}
	if len(cols) <= len(r.buf) {
		r.vals = r.buf[:len(cols)]
	} else {
		r.vals = make([]driver.Value, len(cols))
	}
	for {
		if err := rows.Next(r.vals); err != nil {
			if err == io.EOF {
				return drainDriverResults(rows, r.vals)
			}
			return err
		}
		if err := each(r); err != nil {
			return err
		}
	}
}

// drainDriverResults is drainResults for a driver's rows: it reads the
// result sets left, with vals as scratch space.
func drainDriverResults(rows driver.Rows, vals []driver.Value) error {
	rs, ok := rows.(driver.RowsNextResultSet)
	for ok && rs.HasNextResultSet() {
		if err := rs.NextResultSet(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		for rows.Next(vals) == nil {
		}
	}
	return nil
}

// driverRow is the current row of a driver.Rows. Its values may point into
// the driver's buffers until the next row: Scan copies them.
type driverRow struct {
	cols []string
	vals []driver.Value
	buf  [8]driver.Value // vals for up to 8 columns, in the same allocation
}

// Scan converts the row's values into dest as database/sql's Rows.Scan
// does for the destinations the engine uses: *bool, *string and *int64.
func (r *driverRow) Scan(dest ...any) error {
	if len(dest) != len(r.vals) {
		return fmt.Errorf("sql: expected %d destination arguments in Scan, not %d", len(r.vals), len(dest))
	}
	for i, d := range dest {
		if err := assignValue(d, r.vals[i]); err != nil {
			return fmt.Errorf("sql: Scan error on column index %d, name %q: %w", i, r.cols[i], err)
		}
	}
	return nil
}

// assignValue stores src, a driver.Value, in dest.
func assignValue(dest any, src driver.Value) error {
	switch d := dest.(type) {
	case *string:
		switch s := src.(type) {
		case string:
			*d = s
		case []byte:
			*d = string(s)
		case int64:
			*d = strconv.FormatInt(s, 10)
		case uint64:
			*d = strconv.FormatUint(s, 10)
		case float64:
			*d = strconv.FormatFloat(s, 'g', -1, 64)
		case bool:
			*d = strconv.FormatBool(s)
		case time.Time:
			*d = s.Format(time.RFC3339Nano)
		case nil:
			return fmt.Errorf("converting NULL to string is unsupported")
		default:
			return fmt.Errorf("unsupported Scan, storing driver.Value type %T into type *string", src)
		}
	case *int64:
		switch s := src.(type) {
		case int64:
			*d = s
		case uint64:
			if s > math.MaxInt64 {
				return fmt.Errorf("converting driver.Value type uint64 (%d) to a int64: value out of range", s)
			}
			*d = int64(s)
		case []byte:
			return parseInt(d, string(s))
		case string:
			return parseInt(d, s)
		case float64:
			if s != math.Trunc(s) || s < math.MinInt64 || s >= math.MaxInt64 {
				return fmt.Errorf("converting driver.Value type float64 (%v) to a int64: invalid syntax", s)
			}
			*d = int64(s)
		case nil:
			return fmt.Errorf("converting NULL to int64 is unsupported")
		default:
			return fmt.Errorf("unsupported Scan, storing driver.Value type %T into type *int64", src)
		}
	case *bool:
		v, err := driver.Bool.ConvertValue(src)
		if err != nil {
			return err
		}
		*d = v.(bool)
	default:
		return fmt.Errorf("lock: cannot scan into %T", dest)
	}
	return nil
}

func parseInt(d *int64, s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("converting driver.Value type string (%q) to a int64: %w", s, err)
	}
	*d = v
	return nil
}
