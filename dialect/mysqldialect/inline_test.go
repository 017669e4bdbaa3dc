package mysqldialect_test

import (
	"database/sql/driver"
	"testing"

	"github.com/sqlease/sqlease/dialect/mysqldialect"
)

// TestInline: arguments are written as decimal integers, 1/0, NULL and
// hexadecimal literals; back-quoted identifiers may hold a ?; a query with
// a string literal or a comment, an unknown value type or a wrong count is
// refused (the driver then binds the arguments).
func TestInline(t *testing.T) {
	nv := func(vs ...driver.Value) []driver.NamedValue {
		out := make([]driver.NamedValue, len(vs))
		for i, v := range vs {
			out[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
		}
		return out
	}
	d := mysqldialect.New()
	ok := []struct {
		q    string
		args []driver.NamedValue
		want string
	}{
		{"CALL `d?b`.`p``?`(?, ?, ?, ?, ?, ?)", nv("k/é'\\", []byte{0, 0xff}, int64(-7), uint64(18446744073709551615), true, nil),
			"CALL `d?b`.`p``?`(X'6b2fc3a9275c', X'00ff', -7, 18446744073709551615, 1, NULL)"},
		{"SELECT ?, ?", nv("", false), "SELECT X'', 0"},
	}
	for _, c := range ok {
		got, good := d.Inline(c.q, c.args)
		if !good || got != c.want {
			t.Errorf("Inline(%q) = %q, %v; want %q", c.q, got, good, c.want)
		}
	}
	refused := []struct {
		q    string
		args []driver.NamedValue
	}{
		{"SELECT '?', ?", nv(int64(1))},
		{`SELECT "x", ?`, nv(int64(1))},
		{"SELECT ? -- x", nv(int64(1))},
		{"SELECT ? # x", nv(int64(1))},
		{"SELECT ? /* x */", nv(int64(1))},
		{"SELECT ?", nv(1.5)},
		{"SELECT ?, ?", nv(int64(1))},
		{"SELECT ?", nv(int64(1), int64(2))},
		{"SELECT `?, ?", nv(int64(1))},
	}
	for _, c := range refused {
		if got, good := d.Inline(c.q, c.args); good {
			t.Errorf("Inline(%q) = %q, want refused", c.q, got)
		}
	}
}
