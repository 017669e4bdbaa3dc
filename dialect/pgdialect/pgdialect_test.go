package pgdialect_test

import (
	"testing"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
)

// TestConformance runs the whole SPEC suite on PostgreSQL, each case in its
// own schema, when SQLEASE_POSTGRES_DSN is set (required in CI through
// SQLEASE_REQUIRE_POSTGRES=1).
func TestConformance(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{})
	}
	cfg := conftest.Postgres(conftest.PostgresDSN(t))
	cfg.Short = testing.Short()
	conformance.Run(t, cfg)
}
