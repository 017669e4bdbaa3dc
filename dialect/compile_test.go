package dialect_test

import (
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
)

// fakeDialect is a Dialect whose placeholder style is chosen per test.
type fakeDialect struct{ numbered bool }

func (fakeDialect) Name() string                       { return "fake" }
func (fakeDialect) Capabilities() dialect.Capabilities { return 0 }
func (fakeDialect) QuoteIdent(n string) string         { return "`" + n + "`" }
func (f fakeDialect) Placeholder(n int) string {
	if f.numbered {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}
func (fakeDialect) Statements() dialect.Statements    { return dialect.Statements{} }
func (fakeDialect) Migrations() fs.FS                 { return nil }
func (fakeDialect) GooseDialect() string              { return "mysql" }
func (fakeDialect) Classify(error) dialect.ErrorClass { return dialect.ErrorOther }

var allowed = []string{"key", "token", "lease_id"}

func TestCompileRepeatedParam(t *testing.T) {
	const tpl = `SELECT * FROM {holders} WHERE lock_key = @key AND (token = @token OR @token = 0) AND lease_id = @lease_id`
	for _, tc := range []struct {
		numbered bool
		sql      string
		params   []string
	}{
		{true, "SELECT * FROM `sqlease_holders` WHERE lock_key = $1 AND (token = $2 OR $2 = 0) AND lease_id = $3", []string{"key", "token", "lease_id"}},
		{false, "SELECT * FROM `sqlease_holders` WHERE lock_key = ? AND (token = ? OR ? = 0) AND lease_id = ?", []string{"key", "token", "token", "lease_id"}},
	} {
		st, err := dialect.Compile(fakeDialect{tc.numbered}, dialect.Namespace{}, tpl, allowed)
		if err != nil {
			t.Fatal(err)
		}
		if st.SQL != tc.sql || !slices.Equal(st.Params, tc.params) {
			t.Errorf("numbered=%v: got %q %v, want %q %v", tc.numbered, st.SQL, st.Params, tc.sql, tc.params)
		}
		args := st.Args(map[string]any{"key": "k", "token": int64(7), "lease_id": "l"})
		if !tc.numbered && len(args) != strings.Count(st.SQL, "?") {
			t.Errorf("%d ? placeholders, %d args", strings.Count(st.SQL, "?"), len(args))
		}
		if !tc.numbered && !slices.Equal(args, []any{"k", int64(7), int64(7), "l"}) {
			t.Errorf("args %v", args)
		}
	}
}

func TestCompileLeavesQuotedTextAndVariablesAlone(t *testing.T) {
	for _, tc := range []struct{ tpl, want string }{
		{`SELECT '@key {holders}', @key`, `SELECT '@key {holders}', ?`},
		{`SELECT 'it''s @key', @key`, `SELECT 'it''s @key', ?`},
		{`SELECT "col@key" FROM {holders}`, "SELECT \"col@key\" FROM `sqlease_holders`"},
		{"SELECT `a@key{x}` , @key", "SELECT `a@key{x}` , ?"},
		{"SELECT @key -- @token {nothing\nFROM t", "SELECT ? -- @token {nothing\nFROM t"},
		{"SELECT /* @token {x} */ @key", "SELECT /* @token {x} */ ?"},
		{"SELECT @@session.innodb_lock_wait_timeout, @@version, @key", "SELECT @@session.innodb_lock_wait_timeout, @@version, ?"},
		{"SET @v = @key; SELECT @v, @key_prefix", "SET @v = ?; SELECT @v, @key_prefix"},
	} {
		st, err := dialect.Compile(fakeDialect{}, dialect.Namespace{}, tc.tpl, allowed)
		if err != nil {
			t.Errorf("%q: %v", tc.tpl, err)
			continue
		}
		if st.SQL != tc.want {
			t.Errorf("%q: got %q, want %q", tc.tpl, st.SQL, tc.want)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tpl := range []string{
		`SELECT 'open`,
		"SELECT `open",
		`SELECT /* open`,
		`SELECT {holders`,
		`SELECT {Bad}`,
		`SELECT @ x`,
	} {
		if _, err := dialect.Compile(fakeDialect{}, dialect.Namespace{}, tpl, allowed); err == nil {
			t.Errorf("%q: want an error", tpl)
		}
	}
}
