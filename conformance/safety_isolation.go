package conformance

import (
	"database/sql"
	"errors"

	"github.com/sqlease/sqlease/internal/faultdb"
)

// Safety (docs/contract.md): S1-S5 at every default isolation level (S6).
func init() {
	levels := []struct {
		name string
		iso  sql.IsolationLevel
	}{
		{"ReadCommitted", sql.LevelReadCommitted},
		{"RepeatableRead", sql.LevelRepeatableRead},
		{"Serializable", sql.LevelSerializable},
	}
	for _, lv := range levels {
		register(
			Case{Name: "S6_" + lv.name + "_StressWithCrashedHolders", Rule: "S6", Run: func(e *Env) {
				e.isolate(lv.iso)
				stressCase(e, 30, 10)
			}},
			Case{Name: "S6_" + lv.name + "_TokensIncreasePerKey", Rule: "S6", Run: func(e *Env) {
				e.isolate(lv.iso)
				s3TokensIncrease(e)
			}},
			Case{Name: "S6_" + lv.name + "_FencedCounterAcrossProcesses", Rule: "S6", Run: func(e *Env) {
				e.isolate(lv.iso)
				f2FencedCounter(e)
			}},
		)
	}
}

// isolate points the case at sessions defaulting to iso: e.DSN (used by
// OpenDB and child processes) and e.DB (still through e.Faults) are
// replaced. It skips the case when the Config cannot provide iso.
func (e *Env) isolate(iso sql.IsolationLevel) {
	e.T.Helper()
	if e.Config.IsolationDSN == nil {
		e.T.Skipf("Config.IsolationDSN is nil: the suite cannot make sessions default to %s", iso)
	}
	dsn, err := e.Config.IsolationDSN(e.DSN, iso)
	if errors.Is(err, errors.ErrUnsupported) {
		e.T.Skipf("sessions cannot default to %s: %v", iso, err)
	}
	e.Must(err, "isolation DSN for %s", iso)
	raw, err := sql.Open(e.Config.DriverName, dsn)
	e.Must(err, "open %s", e.Config.DriverName)
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	e.Must(err, "connector")
	old := e.DB
	e.T.Cleanup(func() { _ = old.Close() })
	db := sql.OpenDB(e.Faults.Connector(conn))
	db.SetMaxOpenConns(12)
	db.SetMaxIdleConns(12)
	e.DB, e.DSN = db, dsn
	e.T.Logf("sessions default to %s", iso)
}
