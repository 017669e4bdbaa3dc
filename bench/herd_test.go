package main

import (
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// TestHerdAttemptMark: the herd children count acquire attempts by a mark
// in the statement text; when the mark drifts from the dialect's SQL the
// children never report their waiters queued and the figure fails after a
// minute (it did on SQLite after the Probe was rewritten).
func TestHerdAttemptMark(t *testing.T) {
	ns := dialect.Namespace{}
	pg := pgdialect.New()
	acquire, err := dialect.Compile(pg, ns, pg.Statements().Acquire[0], []string{"key", "mode", "lease_id", "owner", "ttl_us", "marker_us", "watch_us"})
	if err != nil {
		t.Fatal(err)
	}
	if m := herdAttemptMark(pg); !strings.Contains(acquire.SQL, m) {
		t.Errorf("PostgreSQL: the acquire statement does not contain %q:\n%s", m, acquire.SQL)
	}
	my := mysqldialect.New()
	acquire, err = dialect.Compile(my, ns, my.Statements().Acquire[0], []string{"key", "mode", "lease_id", "owner", "ttl_us", "marker_us", "watch_us"})
	if err != nil {
		t.Fatal(err)
	}
	if m := herdAttemptMark(my); !strings.Contains(acquire.SQL, m) {
		t.Errorf("MySQL: the acquire statement does not contain %q:\n%s", m, acquire.SQL)
	}
	sq := sqlitedialect.New()
	if m := herdAttemptMark(sq); !strings.HasPrefix(sq.FastPath().Probe, m) {
		t.Errorf("SQLite: the Probe does not start with %q:\n%s", m, sq.FastPath().Probe)
	}
	for _, s := range []string{sq.FastPath().Grant, sq.FastPath().Mark} {
		if strings.Contains(s, herdAttemptMark(sq)) {
			t.Errorf("SQLite: %q also marks a statement that is not a poll:\n%s", herdAttemptMark(sq), s)
		}
	}
}
