package chaos

import "github.com/sqlease/sqlease/internal/pgcluster"

// PrivateClusterUnavailable says why Run cannot start a private PostgreSQL
// cluster on this machine ("" when it can): no server binaries (looked for
// in $SQLEASE_PG_BIN, else /usr/lib/postgresql/*/bin), or neither root
// (with an OS user postgres) nor OS user postgres. The cluster is run by
// package internal/pgcluster.
func PrivateClusterUnavailable() string { return pgcluster.Unavailable() }
