package conftest

import "testing"

// PgBouncerDSN returns $SQLEASE_PGBOUNCER_DSN, a DSN of the test database
// through PgBouncer in pool_mode=transaction (for example
// postgres://root@127.0.0.1:6432/test?sslmode=disable&default_query_exec_mode=cache_describe),
// or skips t with the reason. With SQLEASE_REQUIRE_PGBOUNCER=1 a missing DSN
// or an unreachable PgBouncer fails t instead. The DSN must not use pgx's
// default statement cache unless PgBouncer tracks prepared statements
// (max_prepared_statements, PgBouncer 1.21 and later); see
// docs/operations.md.
func PgBouncerDSN(t testing.TB) string {
	t.Helper()
	return serverDSN(t, "PGBOUNCER", "pgx", "PgBouncer",
		"postgres://root@127.0.0.1:6432/test?sslmode=disable&default_query_exec_mode=cache_describe, as .ci/pgbouncer start prints")
}
