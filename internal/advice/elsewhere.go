package advice

// Lock tables under another prefix or schema: a forgotten --prefix or
// --schema (lock.WithTablePrefix, lock.WithSchema) finds no lock tables,
// and migrating then would make a second, disjoint set (SPEC D1).

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/sqlease/sqlease/dialect"
)

// maxElsewhere is how many other namespaces the advice names.
const maxElsewhere = 3

// Elsewhere looks in db for sqlease lock tables outside ns: a
// version table <prefix>db_version next to a <prefix>holders table in the
// same schema. It returns advice such as
//
//	found nc_db_version: did you mean --prefix nc_?
//
// where names spells the settings that reach that namespace: command flags
// in the sqlease command (Flags), Locker options in lock (Options).
// (a sentence per namespace found, each but the first capitalised) naming
// at most maxElsewhere of them (the nearest to ns first), or "" when
// there are none or the database cannot list its tables. Tables are
// listed from information_schema.tables (PostgreSQL, MySQL), else
// sqlite_master (SQLite).
func Elsewhere(ctx context.Context, db *sql.DB, d dialect.Dialect, ns dialect.Namespace, names Names) string {
	current, tables := listLockLikeTables(ctx, db)
	if len(tables) == 0 {
		return ""
	}
	schema := ns.Schema
	if schema == "" {
		schema = current
	}
	prefix := ns.Prefix
	if prefix == "" {
		prefix = dialect.DefaultPrefix
	}
	var found []dialect.Namespace
	for st := range tables {
		p, ok := strings.CutSuffix(st.name, "db_version")
		if !ok || p == "" || !tables[schemaTable{st.schema, p + "holders"}] || (st.schema == schema && p == prefix) {
			continue
		}
		f := dialect.Namespace{Schema: st.schema, Prefix: p}
		if st.schema == current {
			f.Schema = "" // checked as the default schema
		}
		if f.Validate(d) != nil {
			continue // not a namespace the flags can name
		}
		found = append(found, dialect.Namespace{Schema: st.schema, Prefix: p})
	}
	// The nearest first: differing from ns in the prefix only, then in
	// the schema only (the default schema first), then in both; then by
	// name.
	rank := func(f dialect.Namespace) int {
		r := 0
		if f.Schema != schema {
			r += 3
			if f.Schema != current {
				r++
			}
		}
		if f.Prefix != prefix {
			r += 2
		}
		return r
	}
	sort.Slice(found, func(i, j int) bool {
		a, b := found[i], found[j]
		if rank(a) != rank(b) {
			return rank(a) < rank(b)
		}
		return a.Schema+"."+a.Prefix < b.Schema+"."+b.Prefix
	})
	var parts []string
	for i, f := range found {
		if i == maxElsewhere {
			parts = append(parts, fmt.Sprintf("(and %d more namespaces with lock tables.)", len(found)-i))
			break
		}
		table := f.Prefix + "db_version"
		if f.Schema != current {
			table = f.Schema + "." + table
		}
		found := "found "
		if i > 0 {
			found = "Found "
		}
		parts = append(parts, found+table+": did you mean "+names.meant(f, schema, prefix, current)+"?")
	}
	return strings.Join(parts, " ")
}

// schemaTable is a table of a schema ("" on SQLite).
type schemaTable struct{ schema, name string }

// listLockLikeTables returns the connection's default schema ("" on
// SQLite) and the tables whose names end in db_version or holders; no
// tables when the database cannot list them.
func listLockLikeTables(ctx context.Context, db *sql.DB) (current string, tables map[schemaTable]bool) {
	tables = map[schemaTable]bool{}
	servers := true
	rows, err := db.QueryContext(ctx, `SELECT table_schema, table_name FROM information_schema.tables WHERE table_name LIKE '%db_version' OR table_name LIKE '%holders'`)
	if err != nil {
		servers = false
		rows, err = db.QueryContext(ctx, `SELECT '', name FROM sqlite_master WHERE type = 'table' AND (name LIKE '%db_version' OR name LIKE '%holders')`)
		if err != nil {
			return "", nil
		}
	}
	defer rows.Close()
	for rows.Next() {
		var st schemaTable
		if rows.Scan(&st.schema, &st.name) == nil {
			tables[st] = true
		}
	}
	if rows.Err() != nil {
		return "", nil
	}
	// PostgreSQL names the default schema current_schema(), MySQL DATABASE().
	if servers && db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&current) != nil {
		_ = db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&current)
	}
	return current, tables
}

// Names spells the schema and prefix settings in advice: Schema and Prefix
// format a value (fmt verbs), SchemaName and PrefixName name the setting
// left out, Sep joins two settings.
type Names struct {
	Schema, Prefix, SchemaName, PrefixName, Sep string
}

// Flags are the sqlease command's: "--schema app --prefix nc_".
var Flags = Names{Schema: "--schema %s", Prefix: "--prefix %s", SchemaName: "--schema", PrefixName: "--prefix", Sep: " "}

// Options are lock's: `lock.WithSchema("app") with lock.WithTablePrefix("nc_")`.
var Options = Names{Schema: "lock.WithSchema(%q)", Prefix: "lock.WithTablePrefix(%q)", SchemaName: "lock.WithSchema", PrefixName: "lock.WithTablePrefix", Sep: " with "}

// meant names the settings that reach the namespace f from one whose
// schema and prefix resolve to schema and prefix; current is the
// connection's default schema: "--prefix nc_", "--schema app --prefix
// nc_", "to leave out --prefix (the default is sqlease_)".
func (n Names) meant(f dialect.Namespace, schema, prefix, current string) string {
	var set, leave []string
	if f.Schema != schema {
		if f.Schema == current {
			leave = append(leave, n.SchemaName+" (the default is "+current+")")
		} else {
			set = append(set, fmt.Sprintf(n.Schema, f.Schema))
		}
	}
	if f.Prefix != prefix {
		if f.Prefix == dialect.DefaultPrefix {
			leave = append(leave, n.PrefixName+" (the default is "+dialect.DefaultPrefix+")")
		} else {
			set = append(set, fmt.Sprintf(n.Prefix, f.Prefix))
		}
	}
	text := strings.Join(set, n.Sep)
	switch {
	case len(leave) == 0:
	case text == "":
		text = "to leave out " + strings.Join(leave, " and ")
	default:
		text += ", leaving out " + strings.Join(leave, " and ")
	}
	return text
}
