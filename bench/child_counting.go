package main

import (
	"database/sql"
	"os"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
)

// childCountingDB opens, in a child process, a pool on the parent's
// database (from the child environment) whose statements an Injector
// counts, and returns the environment its Lockers are built in.
func childCountingDB() (*env, *sql.DB, *faultdb.Injector, error) {
	var d dialect.Dialect = sqlitedialect.New()
	drv := "sqlite3"
	if os.Getenv(childDialectEnv) == pgdialect.Name {
		d, drv = pgdialect.New(), "pgx"
	}
	dsn := os.Getenv(childDSNEnv)
	raw, err := sql.Open(drv, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		return nil, nil, nil, err
	}
	inj := faultdb.New()
	e := &env{d: d, ns: dialect.Namespace{Schema: os.Getenv(childSchemaEnv)}, quiet: quietLogger()}
	return e, sql.OpenDB(inj.Connector(conn)), inj, nil
}
