package dialect_test

import (
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// edited is a dialect with its statements or declared flags changed. It
// embeds the interface, so it implements no optional interface (Listener).
type edited struct {
	dialect.Dialect
	caps dialect.Capabilities
	edit func(*dialect.Statements)
}

func (e edited) Capabilities() dialect.Capabilities { return e.caps }

// noFIFO removes the FIFO statements (what gives CapFIFO).
func noFIFO(s *dialect.Statements) { s.AcquireFIFO, s.Dequeue = nil, "" }
func (e edited) Statements() dialect.Statements {
	s := e.Dialect.Statements()
	if e.edit != nil {
		e.edit(&s)
	}
	return s
}

// CapNotify and CapFIFO come from what a dialect implements (SPEC W2, W6).
func TestCapabilitiesOfDerivesNotifyAndFIFO(t *testing.T) {
	for _, tc := range []struct {
		d    dialect.Dialect
		want dialect.Capabilities
	}{
		{pgdialect.New(), dialect.CapSchemas | dialect.CapRowLockFence | dialect.CapConcurrentWriters | dialect.CapNotify | dialect.CapFIFO | dialect.CapFenceIdleTimeout},
		{sqlitedialect.New(), dialect.CapWriteLockFence | dialect.CapFIFO},
		{mysqldialect.New(), dialect.CapSchemas | dialect.CapRowLockFence | dialect.CapConcurrentWriters | dialect.CapNotify | dialect.CapFIFO | dialect.CapFenceIdleTimeout},
		// A declared flag without what gives it is dropped.
		{edited{Dialect: mysqldialect.New(), caps: dialect.CapNotify | dialect.CapFIFO, edit: noFIFO}, 0},
	} {
		if got := dialect.CapabilitiesOf(tc.d); got != tc.want {
			t.Errorf("CapabilitiesOf(%s) = %s, want %s", tc.d.Name(), got, tc.want)
		}
		if tc.want != 0 {
			if err := dialect.CheckConsistent(tc.d); err != nil {
				t.Errorf("CheckConsistent(%s): %v", tc.d.Name(), err)
			}
		}
	}
}

func TestCheckConsistentRefusesHalfFIFOAndFalseClaims(t *testing.T) {
	pg, lite := pgdialect.New(), sqlitedialect.New()
	for _, tc := range []struct {
		d    dialect.Dialect
		want string
	}{
		{edited{Dialect: lite, edit: func(s *dialect.Statements) { s.Dequeue = "" }}, "AcquireFIFO but no Dequeue"},
		{edited{Dialect: lite, edit: func(s *dialect.Statements) { s.AcquireFIFO = nil }}, "no AcquireFIFO"},
		{edited{Dialect: pg, caps: dialect.CapNotify}, "declares notify without implementing it"},
		{edited{Dialect: mysqldialect.New(), caps: dialect.CapFIFO, edit: noFIFO}, "declares fifo without implementing it"},
	} {
		err := dialect.CheckConsistent(tc.d)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckConsistent: got %v, want an error containing %q", err, tc.want)
		}
	}
	// Declaring a derived flag that the dialect implements is redundant,
	// not wrong.
	if err := dialect.CheckConsistent(edited{Dialect: lite, caps: dialect.CapFIFO}); err != nil {
		t.Errorf("CheckConsistent with a redundant CapFIFO: %v", err)
	}
}

// SQLite's one-statement shortcuts sit behind FastPather; the other
// dialects have none, and a wrapper that hides the interface has none.
func TestFastPathOf(t *testing.T) {
	fp := dialect.FastPathOf(sqlitedialect.New())
	if fp.Probe == "" || fp.ProbeFIFO == "" || fp.Grant == "" || fp.Mark == "" {
		t.Errorf("SQLite fast path has an empty statement: %+v", fp)
	}
	for _, d := range []dialect.Dialect{pgdialect.New(), mysqldialect.New(), edited{Dialect: sqlitedialect.New()}} {
		if fp := dialect.FastPathOf(d); fp != (dialect.FastPath{}) {
			t.Errorf("FastPathOf(%s) = %+v, want none", d.Name(), fp)
		}
	}
}
