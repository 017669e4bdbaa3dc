package pgdialect_test

import (
	"testing"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
)

// TestConformancePgBouncer runs the whole SPEC suite through PgBouncer in
// pool_mode=transaction (when SQLEASE_PGBOUNCER_DSN is set; required in CI
// through SQLEASE_REQUIRE_PGBOUNCER=1), each case in its own schema. No
// engine statement may depend on session state there.
func TestConformancePgBouncer(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{})
	}
	cfg := conftest.Postgres(conftest.PgBouncerDSN(t))
	cfg.Short = testing.Short()
	// PgBouncer refuses the startup parameter "options" that makes sessions
	// default to an isolation level, and its pooled server connections
	// cannot carry a per-client default: the S6 cases skip here with that
	// reason (they run on direct connections in TestConformance).
	cfg.IsolationDSN = nil
	conformance.Run(t, cfg)
}
