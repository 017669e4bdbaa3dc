// Package faultdb is a fault-injecting, statement-counting wrapper around a
// database/sql/driver connector. It is meant for tests and benchmarks that run
// against real databases (SQLite through mattn/go-sqlite3, PostgreSQL through
// pgx/v5/stdlib): the wrapped driver still talks to the real database, and an
// [Injector] decides, statement by statement, whether to delay it, fail it,
// run it and lose the reply, or hold it until released.
//
// Typical use:
//
//	inj := faultdb.New()
//	db := sql.OpenDB(inj.Connector(stdlib.GetConnector(*cfg)))
//	remove := inj.Add(faultdb.Rule{Match: "COMMIT", Action: faultdb.Fail,
//		Err: &pgconn.PgError{Code: "40001"}, Times: 1})
//	defer remove()
//
// Rules are matched against the SQL text that reaches the driver, and against
// the pseudo-texts "BEGIN", "COMMIT" and "ROLLBACK" for the transaction
// methods of the driver (BeginTx, Tx.Commit and Tx.Rollback).
//
// # Interaction with database/sql retries
//
// database/sql transparently retries an operation on *sql.DB (Exec, Query,
// Prepare, Begin and friends) and on *sql.Stmt up to two more times when the
// driver returns an error that matches [driver.ErrBadConn]; operations on
// *sql.Tx and *sql.Conn are not retried (a *sql.Stmt bound to a *sql.Conn is,
// and its retry fails with sql.ErrConnDone). That is right for drivers, which
// only return ErrBadConn when the statement was not sent, but it means that
//
//   - a [Fail] rule whose Err is driver.ErrBadConn and whose Times is smaller
//     than three is usually invisible to a caller of *sql.DB: the retry runs the
//     statement on another connection and succeeds;
//   - a [DropReply] rule (whose default error is driver.ErrBadConn) on a
//     *sql.DB call makes database/sql run the statement again: with Times 1
//     the statement takes effect twice and the caller sees success.
//
// To model a lost reply that the caller does see, run the statement inside a
// *sql.Tx or on a *sql.Conn, or give the DropReply rule an Err that is not
// driver.ErrBadConn (io.ErrUnexpectedEOF, say): the connection is still
// marked bad and discarded by the pool.
package faultdb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Pseudo-texts that rules match and Count counts for the transaction methods.
const (
	textBegin    = "BEGIN"
	textCommit   = "COMMIT"
	textRollback = "ROLLBACK"
)

// Action says what a matching [Rule] does to a statement.
type Action int

const (
	// Delay sleeps Rule.Delay, then runs the statement normally. If the
	// statement's context ends first, the statement is not run and the
	// context's error is returned.
	Delay Action = iota
	// Fail does not run the statement and returns Rule.Err (a generic
	// injected error when Err is nil).
	Fail
	// DropReply runs the statement on the real database, so that it takes
	// effect, then discards the result and returns driver.ErrBadConn (or
	// Rule.Err when it is set). The connection is marked bad: every later
	// operation on it returns driver.ErrBadConn without reaching the
	// database, and its IsValid and ResetSession methods tell database/sql to
	// discard it. See the package documentation about database/sql retries.
	DropReply
	// Hang blocks the statement until Rule.Release is closed, then runs it
	// normally; if the statement's context ends first, the statement is not
	// run and the context's error is returned. A nil Release blocks until the
	// context ends.
	Hang
)

// String returns the name of the action.
func (a Action) String() string {
	switch a {
	case Delay:
		return "Delay"
	case Fail:
		return "Fail"
	case DropReply:
		return "DropReply"
	case Hang:
		return "Hang"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Rule describes one fault. A rule acts on a statement when Match is a
// substring of the statement's SQL text and the rule has Times left.
type Rule struct {
	// Match is a substring of the SQL text as it reaches the driver (after
	// the library rendered it), or one of the pseudo-texts "BEGIN",
	// "COMMIT" and "ROLLBACK" for the transaction methods. The empty string
	// matches every statement, transaction methods included.
	Match string
	// Action is what the rule does to a matching statement.
	Action Action
	// Delay is how long a Delay rule waits before running the statement.
	Delay time.Duration
	// Err is the error a Fail rule returns (for example driver.ErrBadConn,
	// a *pgconn.PgError{Code: "40001"} or a sqlite3.Error{Code:
	// sqlite3.ErrBusy}); nil means a generic injected error. For a DropReply
	// rule a non-nil Err replaces the default driver.ErrBadConn.
	Err error
	// Times is how many statements the rule acts on; 0 means unlimited. A
	// rule that has used up its Times stays installed but no longer matches.
	Times int
	// Release, for a Hang rule, is closed by the test to let the held
	// statements run.
	Release chan struct{}
	// Hits, when not nil, is incremented each time the rule acts on a
	// statement (also when the statement's context then ends first).
	Hits *atomic.Int64
	// MinArgBytes, when positive, limits the rule to statements whose
	// string and []byte arguments total at least this many bytes: a
	// statement that fails only when it carries too much (a batch too big
	// to finish in time). Transaction methods have no arguments.
	MinArgBytes int
}

// rule is an installed Rule with its use count.
type rule struct {
	Rule
	used int
}

// Injector holds rules and statement counters. It is safe for concurrent use,
// and one Injector may serve any number of connectors and connections. The
// zero value is ready to use, like the result of [New].
type Injector struct {
	mu     sync.Mutex
	rules  []*rule
	counts map[string]int
}

// New returns an Injector with no rules and zero counts.
func New() *Injector {
	return &Injector{}
}

// Add installs a rule after the rules already installed and returns a
// function that removes it again (calling it more than once is harmless).
// Rules are checked in the order added; the first matching rule with Times
// left acts, and at most one rule acts on a statement. Removing a rule does
// not release statements it is already holding. Add panics if r.Action is not
// one of the defined actions.
func (inj *Injector) Add(r Rule) (remove func()) {
	switch r.Action {
	case Delay, Fail, DropReply, Hang:
	default:
		panic(fmt.Sprintf("faultdb: Add: unknown action %v", r.Action))
	}
	if r.Times < 0 {
		panic(fmt.Sprintf("faultdb: Add: negative Times %d", r.Times))
	}
	ir := &rule{Rule: r}
	inj.mu.Lock()
	inj.rules = append(inj.rules, ir)
	inj.mu.Unlock()
	return func() {
		inj.mu.Lock()
		defer inj.mu.Unlock()
		for i, x := range inj.rules {
			if x == ir {
				inj.rules = append(inj.rules[:i:i], inj.rules[i+1:]...)
				return
			}
		}
	}
}

// Reset removes all rules. It does not release statements that a Hang or
// Delay rule is already holding, and it does not reset the counts.
func (inj *Injector) Reset() {
	inj.mu.Lock()
	inj.rules = nil
	inj.mu.Unlock()
}

// Count returns how many statements whose SQL text contains substr were sent
// to the base driver: direct Exec and Query calls, executions of prepared
// statements (preparing itself is not counted), and the transaction methods
// counted under the texts "BEGIN", "COMMIT" and "ROLLBACK". Count("") counts
// all of them. A statement is counted when it is handed to the base driver,
// whether or not it then succeeds; statements stopped by a rule (Fail, or a
// Delay or Hang whose context ended) or refused on a connection marked bad are
// not counted, and DropReply statements are. Counts are per statement, not
// per network packet: a driver may use more than one round trip for one
// statement (pgx may prepare a new statement text first, for example).
//
// When a failed or interrupted commit is turned into a rollback of the real
// transaction (see Fail), that rollback is counted as "ROLLBACK".
func (inj *Injector) Count(substr string) int {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	n := 0
	for text, c := range inj.counts {
		if strings.Contains(text, substr) {
			n += c
		}
	}
	return n
}

// ResetCounts sets all statement counts to zero.
func (inj *Injector) ResetCounts() {
	inj.mu.Lock()
	inj.counts = nil
	inj.mu.Unlock()
}

// count records that text was handed to the base driver.
func (inj *Injector) count(text string) {
	inj.mu.Lock()
	if inj.counts == nil {
		inj.counts = make(map[string]int)
	}
	inj.counts[text]++
	inj.mu.Unlock()
}

// match returns a copy of the first rule that matches text and has Times
// left, after charging the use to it, or nil.
func (inj *Injector) match(text string, args []driver.NamedValue) *rule {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for _, r := range inj.rules {
		if r.Times != 0 && r.used >= r.Times {
			continue
		}
		if !strings.Contains(text, r.Match) {
			continue
		}
		if r.MinArgBytes > 0 && argBytes(args) < r.MinArgBytes {
			continue
		}
		r.used++
		if r.Hits != nil {
			r.Hits.Add(1)
		}
		return r
	}
	return nil
}

// argBytes is the total length of the string and []byte arguments.
func argBytes(args []driver.NamedValue) int {
	n := 0
	for _, a := range args {
		switch v := a.Value.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		}
	}
	return n
}

// refund gives back the use of r charged by match, for a statement that the
// base driver declined with driver.ErrSkip (database/sql retries it through
// another path, where the rule is applied again).
func (inj *Injector) refund(r *rule) {
	if r == nil {
		return
	}
	inj.mu.Lock()
	r.used--
	if r.Hits != nil {
		r.Hits.Add(-1)
	}
	inj.mu.Unlock()
}

// injectedError is returned by a Fail rule without an Err.
type injectedError struct{ text string }

func (e *injectedError) Error() string {
	return fmt.Sprintf("faultdb: injected failure of %q", e.text)
}

// failErr returns the error of the Fail rule r for text.
func failErr(r *rule, text string) error {
	if r.Err != nil {
		return r.Err
	}
	return &injectedError{text: text}
}

// dropErr returns the error of the DropReply rule r.
func dropErr(r *rule) error {
	if r.Err != nil {
		return r.Err
	}
	return driver.ErrBadConn
}

// verdict is the outcome of applying the rules to one statement before it is
// sent.
type verdict struct {
	r    *rule // the rule that acted, or nil
	drop bool  // run the statement, then drop the reply
}

// before applies the rules to a statement with the given text and context.
// A non-nil error means the statement must not be sent and the error must be
// returned instead.
func (inj *Injector) before(ctx context.Context, text string, args []driver.NamedValue) (verdict, error) {
	r := inj.match(text, args)
	if r == nil {
		return verdict{}, nil
	}
	switch r.Action {
	case Fail:
		return verdict{r: r}, failErr(r, text)
	case Delay:
		if r.Delay > 0 {
			t := time.NewTimer(r.Delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return verdict{r: r}, ctx.Err()
			}
		} else if err := ctx.Err(); err != nil {
			return verdict{r: r}, err
		}
	case Hang:
		select {
		case <-r.Release:
		case <-ctx.Done():
			return verdict{r: r}, ctx.Err()
		}
	case DropReply:
		return verdict{r: r, drop: true}, nil
	}
	return verdict{r: r}, nil
}

// Connector wraps base so that every connection it makes goes through the
// Injector. Use it as sql.OpenDB(inj.Connector(base)). If base implements
// io.Closer, so does the result, and closing the *sql.DB closes base.
func (inj *Injector) Connector(base driver.Connector) driver.Connector {
	return &connector{inj: inj, base: base}
}

type connector struct {
	inj  *Injector
	base driver.Connector
}

// Connect opens a base connection and wraps it.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	bc, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &Conn{inj: c.inj, base: bc}, nil
}

// Driver returns the base connector's driver, wrapped by the Injector.
func (c *connector) Driver() driver.Driver {
	return &wrapDriver{inj: c.inj, base: c.base.Driver()}
}

// Close closes the base connector if it implements io.Closer.
func (c *connector) Close() error {
	if cl, ok := c.base.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// wrapDriver is the driver.Driver of a wrapped connector.
type wrapDriver struct {
	inj  *Injector
	base driver.Driver
}

// Open opens a base connection by name and wraps it.
func (d *wrapDriver) Open(name string) (driver.Conn, error) {
	bc, err := d.base.Open(name)
	if err != nil {
		return nil, err
	}
	return &Conn{inj: d.inj, base: bc}, nil
}

// OpenConnector returns a wrapped connector for name.
func (d *wrapDriver) OpenConnector(name string) (driver.Connector, error) {
	bc, err := DSNConnector(d.base, name)
	if err != nil {
		return nil, err
	}
	return d.inj.Connector(bc), nil
}

// DSNConnector adapts a driver that opens connections from a data source name
// into a driver.Connector, for use with [Injector.Connector]. If d implements
// driver.DriverContext, its OpenConnector is used (and its error returned);
// otherwise (as with mattn's &sqlite3.SQLiteDriver{}) the connector calls
// d.Open(dsn) for each connection.
func DSNConnector(d driver.Driver, dsn string) (driver.Connector, error) {
	if dc, ok := d.(driver.DriverContext); ok {
		return dc.OpenConnector(dsn)
	}
	return &dsnConnector{d: d, dsn: dsn}, nil
}

type dsnConnector struct {
	d   driver.Driver
	dsn string
}

// Connect opens a connection with the driver's Open.
func (c *dsnConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.d.Open(c.dsn)
}

// Driver returns the driver.
func (c *dsnConnector) Driver() driver.Driver { return c.d }

// Conn is a connection wrapped by an Injector. It implements every optional
// driver interface that database/sql uses, forwarding to the base connection
// (or falling back as database/sql would when the base lacks one).
//
// Code that reaches the driver connection through sql.Conn.Raw gets a *Conn
// and should unwrap it with an interface check, so that it works with and
// without this package:
//
//	err := sqlConn.Raw(func(dc any) error {
//		if u, ok := dc.(interface{ Unwrap() driver.Conn }); ok {
//			dc = u.Unwrap()
//		}
//		pc := dc.(*stdlib.Conn).Conn() // the native *pgx.Conn
//		...
//	})
//
// Statements run on the unwrapped connection bypass the Injector.
type Conn struct {
	inj  *Injector
	base driver.Conn
	bad  atomic.Bool
}

// Compile-time checks of the interfaces Conn promises.
var (
	_ driver.Conn               = (*Conn)(nil)
	_ driver.ConnPrepareContext = (*Conn)(nil)
	_ driver.ConnBeginTx        = (*Conn)(nil)
	_ driver.ExecerContext      = (*Conn)(nil)
	_ driver.QueryerContext     = (*Conn)(nil)
	_ driver.Pinger             = (*Conn)(nil)
	_ driver.SessionResetter    = (*Conn)(nil)
	_ driver.Validator          = (*Conn)(nil)
	_ driver.NamedValueChecker  = (*Conn)(nil)

	_ driver.Stmt              = (*stmt)(nil)
	_ driver.StmtExecContext   = (*stmt)(nil)
	_ driver.StmtQueryContext  = (*stmt)(nil)
	_ driver.NamedValueChecker = (*stmt)(nil)
)

// Unwrap returns the base driver connection (for pgx, a *stdlib.Conn whose
// Conn method gives the *pgx.Conn).
func (c *Conn) Unwrap() driver.Conn { return c.base }

// markBad makes database/sql discard the connection and refuses further use.
func (c *Conn) markBad() { c.bad.Store(true) }

// Prepare prepares a statement; see PrepareContext.
func (c *Conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares a statement on the base connection. Preparing is
// neither subject to rules nor counted; executions of the statement are.
func (c *Conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.bad.Load() {
		return nil, driver.ErrBadConn
	}
	var (
		si  driver.Stmt
		err error
	)
	if pc, ok := c.base.(driver.ConnPrepareContext); ok {
		si, err = pc.PrepareContext(ctx, query)
	} else {
		si, err = c.base.Prepare(query)
		if err == nil && ctx.Err() != nil {
			si.Close()
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	return &stmt{c: c, base: si, query: query}, nil
}

// Close closes the base connection.
func (c *Conn) Close() error {
	return c.base.Close()
}

// Begin starts a transaction; see BeginTx.
func (c *Conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx applies the rules to the pseudo-text "BEGIN" and starts a
// transaction on the base connection. The returned transaction applies the
// rules to "COMMIT" and "ROLLBACK", waiting (for Delay and Hang) under ctx,
// since driver.Tx methods take no context.
func (c *Conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.bad.Load() {
		return nil, driver.ErrBadConn
	}
	v, err := c.inj.before(ctx, textBegin, nil)
	if err != nil {
		return nil, err
	}
	var btx driver.Tx
	if bc, ok := c.base.(driver.ConnBeginTx); ok {
		btx, err = bc.BeginTx(ctx, opts)
	} else {
		// What database/sql does for a driver without ConnBeginTx.
		switch {
		case opts.Isolation != driver.IsolationLevel(0):
			return nil, errors.New("sql: driver does not support non-default isolation level")
		case opts.ReadOnly:
			return nil, errors.New("sql: driver does not support read-only transactions")
		}
		btx, err = c.base.Begin()
		if err == nil && ctx.Err() != nil {
			btx.Rollback()
			return nil, ctx.Err()
		}
	}
	c.inj.count(textBegin)
	if v.drop {
		c.markBad()
		return nil, dropErr(v.r)
	}
	if err != nil {
		return nil, err
	}
	return &tx{c: c, base: btx, ctx: ctx}, nil
}

// ExecContext applies the rules to query and runs it with the base
// connection's ExecContext. It returns driver.ErrSkip (so database/sql
// prepares the statement instead) when the base lacks driver.ExecerContext.
func (c *Conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ec, ok := c.base.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if c.bad.Load() {
		return nil, driver.ErrBadConn
	}
	v, err := c.inj.before(ctx, query, args)
	if err != nil {
		return nil, err
	}
	res, err := ec.ExecContext(ctx, query, args)
	if err == driver.ErrSkip {
		c.inj.refund(v.r)
		return nil, err
	}
	c.inj.count(query)
	if v.drop {
		c.markBad()
		return nil, dropErr(v.r)
	}
	return res, err
}

// QueryContext applies the rules to query and runs it with the base
// connection's QueryContext. It returns driver.ErrSkip (so database/sql
// prepares the statement instead) when the base lacks driver.QueryerContext.
// The base rows are returned unwrapped.
func (c *Conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := c.base.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if c.bad.Load() {
		return nil, driver.ErrBadConn
	}
	v, err := c.inj.before(ctx, query, args)
	if err != nil {
		return nil, err
	}
	rows, err := qc.QueryContext(ctx, query, args)
	if err == driver.ErrSkip {
		c.inj.refund(v.r)
		return nil, err
	}
	c.inj.count(query)
	if v.drop {
		if err == nil {
			drain(rows)
		}
		c.markBad()
		return nil, dropErr(v.r)
	}
	return rows, err
}

// Ping forwards to the base connection's Ping, if it has one. Pings are
// neither subject to rules nor counted.
func (c *Conn) Ping(ctx context.Context) error {
	if c.bad.Load() {
		return driver.ErrBadConn
	}
	if p, ok := c.base.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession returns driver.ErrBadConn for a connection marked bad, and
// otherwise forwards to the base connection's ResetSession, if it has one.
func (c *Conn) ResetSession(ctx context.Context) error {
	if c.bad.Load() {
		return driver.ErrBadConn
	}
	if r, ok := c.base.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid reports false for a connection marked bad, and otherwise what the
// base connection's IsValid reports (true if it has none).
func (c *Conn) IsValid() bool {
	if c.bad.Load() {
		return false
	}
	if v, ok := c.base.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// CheckNamedValue forwards to the base connection's CheckNamedValue, or
// returns driver.ErrSkip (database/sql's default conversion) if it has none.
func (c *Conn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.base.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// drain reads and closes rows so that the statement behind them completes.
func drain(rows driver.Rows) {
	dest := make([]driver.Value, len(rows.Columns()))
	for rows.Next(dest) == nil {
	}
	if rs, ok := rows.(driver.RowsNextResultSet); ok {
		for rs.HasNextResultSet() && rs.NextResultSet() == nil {
			dest = make([]driver.Value, len(rows.Columns()))
			for rows.Next(dest) == nil {
			}
		}
	}
	rows.Close()
}

// stmt is a prepared statement on a Conn.
type stmt struct {
	c     *Conn
	base  driver.Stmt
	query string
}

// Close closes the base statement.
func (s *stmt) Close() error { return s.base.Close() }

// NumInput forwards to the base statement.
func (s *stmt) NumInput() int { return s.base.NumInput() }

// Exec executes the statement; see ExecContext.
func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), valuesToNamed(args))
}

// Query runs the statement; see QueryContext.
func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), valuesToNamed(args))
}

// ExecContext applies the rules to the statement's text and executes it.
func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if s.c.bad.Load() {
		return nil, driver.ErrBadConn
	}
	v, err := s.c.inj.before(ctx, s.query, args)
	if err != nil {
		return nil, err
	}
	var res driver.Result
	if ec, ok := s.base.(driver.StmtExecContext); ok {
		res, err = ec.ExecContext(ctx, args)
	} else {
		var dargs []driver.Value
		if dargs, err = namedToValues(args); err != nil {
			return nil, err
		}
		if err = ctx.Err(); err != nil {
			return nil, err
		}
		res, err = s.base.Exec(dargs) //nolint:staticcheck // fallback as in database/sql
	}
	s.c.inj.count(s.query)
	if v.drop {
		s.c.markBad()
		return nil, dropErr(v.r)
	}
	return res, err
}

// QueryContext applies the rules to the statement's text and runs it.
func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if s.c.bad.Load() {
		return nil, driver.ErrBadConn
	}
	v, err := s.c.inj.before(ctx, s.query, args)
	if err != nil {
		return nil, err
	}
	var rows driver.Rows
	if qc, ok := s.base.(driver.StmtQueryContext); ok {
		rows, err = qc.QueryContext(ctx, args)
	} else {
		var dargs []driver.Value
		if dargs, err = namedToValues(args); err != nil {
			return nil, err
		}
		if err = ctx.Err(); err != nil {
			return nil, err
		}
		rows, err = s.base.Query(dargs) //nolint:staticcheck // fallback as in database/sql
	}
	s.c.inj.count(s.query)
	if v.drop {
		if err == nil {
			drain(rows)
		}
		s.c.markBad()
		return nil, dropErr(v.r)
	}
	return rows, err
}

// CheckNamedValue forwards to the base statement's CheckNamedValue, else to
// the base connection's, else returns driver.ErrSkip: the same order
// database/sql uses when it sees the base statement and connection.
func (s *stmt) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := s.base.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return s.c.CheckNamedValue(nv)
}

// valuesToNamed converts positional values for the context methods.
func valuesToNamed(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return nv
}

// namedToValues converts named values for the legacy methods, as
// database/sql does.
func namedToValues(named []driver.NamedValue) ([]driver.Value, error) {
	args := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, errors.New("sql: driver does not support the use of Named Parameters")
		}
		args[i] = nv.Value
	}
	return args, nil
}

// tx is a transaction on a Conn.
type tx struct {
	c    *Conn
	base driver.Tx
	ctx  context.Context // the BeginTx context, for Delay and Hang
}

// Commit applies the rules to "COMMIT" and commits the base transaction. When
// a rule stops the commit (Fail, or Delay/Hang whose context ended), the base
// transaction is rolled back so that nothing it did takes effect and the
// connection stays usable; if that rollback fails the connection is marked
// bad.
func (t *tx) Commit() error {
	if t.c.bad.Load() {
		return driver.ErrBadConn
	}
	v, err := t.c.inj.before(t.ctx, textCommit, nil)
	if err != nil {
		rerr := t.base.Rollback()
		t.c.inj.count(textRollback)
		if rerr != nil {
			t.c.markBad()
		}
		return err
	}
	err = t.base.Commit()
	t.c.inj.count(textCommit)
	if v.drop {
		t.c.markBad()
		return dropErr(v.r)
	}
	return err
}

// Rollback applies the rules to "ROLLBACK" and rolls back the base
// transaction. When a rule stops the rollback (Fail, or Delay/Hang whose
// context ended), the connection is marked bad, so that database/sql closes
// it and the database ends the transaction.
func (t *tx) Rollback() error {
	if t.c.bad.Load() {
		return driver.ErrBadConn
	}
	v, err := t.c.inj.before(t.ctx, textRollback, nil)
	if err != nil {
		t.c.markBad()
		return err
	}
	err = t.base.Rollback()
	t.c.inj.count(textRollback)
	if v.drop {
		t.c.markBad()
		return dropErr(v.r)
	}
	return err
}
