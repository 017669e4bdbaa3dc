package cli

import (
	"context"
	"database/sql"
	"strings"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/advice"
)

// lockTablesElsewhere is advice.Elsewhere in the command's flags:
//
//	found nc_db_version: did you mean --prefix nc_?
func lockTablesElsewhere(ctx context.Context, db *sql.DB, d dialect.Dialect, ns dialect.Namespace) string {
	return advice.Elsewhere(ctx, db, d, ns, meantFlags)
}

// meantFlags names the flags that reach the namespace f from the flags of
// ns, whose schema and prefix resolve to schema and prefix; current is the
// connection's default schema: "--prefix nc_", "--schema app --prefix
// nc_", "to leave out --prefix (the default is sqlease_)".
func meantFlags(f dialect.Namespace, schema, prefix, current string) string {
	var flags, leave []string
	if f.Schema != schema {
		if f.Schema == current {
			leave = append(leave, "--schema (the default is "+current+")")
		} else {
			flags = append(flags, "--schema "+f.Schema)
		}
	}
	if f.Prefix != prefix {
		if f.Prefix == dialect.DefaultPrefix {
			leave = append(leave, "--prefix (the default is "+dialect.DefaultPrefix+")")
		} else {
			flags = append(flags, "--prefix "+f.Prefix)
		}
	}
	text := strings.Join(flags, " ")
	switch {
	case len(leave) == 0:
	case text == "":
		text = "to leave out " + strings.Join(leave, " and ")
	default:
		text += ", leaving out " + strings.Join(leave, " and ")
	}
	return text
}
