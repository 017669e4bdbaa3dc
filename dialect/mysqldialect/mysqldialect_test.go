package mysqldialect_test

import (
	"testing"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
)

// TestConformance runs the whole SPEC suite on MySQL or MariaDB, each case
// in its own database, when SQLEASE_MYSQL_DSN is set (required in CI
// through SQLEASE_REQUIRE_MYSQL=1).
func TestConformance(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{})
	}
	cfg := conftest.MySQL(conftest.MySQLDSN(t))
	cfg.Short = testing.Short()
	conformance.Run(t, cfg)
}
