package mysqldialect

// Arguments written into the statement text (dialect.Inliner), so that
// go-sql-driver/mysql sends the engine's hot statements in one round trip
// instead of preparing each (docs/performance.md, "MySQL and MariaDB").

import (
	"database/sql/driver"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/sqlease/sqlease/dialect"
)

var _ dialect.Inliner = Dialect{}

// Inline replaces each ? of query with a literal of the argument at its
// position (dialect.Inliner): integers in decimal, booleans as 1 or 0, NULL,
// and strings and byte slices as hexadecimal literals (X'6b31'), which no
// sql_mode or character set reads differently; a hexadecimal literal is a
// binary string, which MySQL and MariaDB assign to a VARBINARY parameter as
// is and to a utf8mb4 one as its UTF-8 bytes. ok is false for any other
// value type, for a query with a string literal or comment (only
// back-quoted identifiers are skipped), and when the number of ? differs
// from len(args).
func (Dialect) Inline(query string, args []driver.NamedValue) (string, bool) {
	if strings.ContainsAny(query, `'"#`) || strings.Contains(query, "--") || strings.Contains(query, "/*") {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(query) + 24*len(args))
	n, quoted := 0, false
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '`':
			quoted = !quoted
		case c == '?' && !quoted:
			if n == len(args) || !writeLiteral(&b, args[n].Value) {
				return "", false
			}
			n++
			continue
		}
		b.WriteByte(c)
	}
	if n != len(args) || quoted {
		return "", false
	}
	return b.String(), true
}

// writeLiteral writes v as a SQL literal and reports whether it could.
func writeLiteral(b *strings.Builder, v driver.Value) bool {
	switch v := v.(type) {
	case nil:
		b.WriteString("NULL")
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(v, 10))
	case bool:
		if v {
			b.WriteString("1")
		} else {
			b.WriteString("0")
		}
	case string:
		writeHex(b, []byte(v))
	case []byte:
		writeHex(b, v)
	default:
		return false
	}
	return true
}

// writeHex writes p as a hexadecimal literal (an empty one for no bytes).
func writeHex(b *strings.Builder, p []byte) {
	b.WriteString("X'")
	var buf [64]byte
	for len(p) > 0 {
		k := min(len(p), len(buf)/2)
		hex.Encode(buf[:], p[:k])
		b.Write(buf[:2*k])
		p = p[k:]
	}
	b.WriteString("'")
}
