package cli

import (
	"context"
	"database/sql"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/advice"
)

// lockTablesElsewhere is advice.Elsewhere in the command's flags:
//
//	found nc_db_version: did you mean --prefix nc_?
func lockTablesElsewhere(ctx context.Context, db *sql.DB, d dialect.Dialect, ns dialect.Namespace) string {
	return advice.Elsewhere(ctx, db, d, ns, advice.Flags)
}
