package conformance

import (
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// TestLeaseRowViolation: a holder's read of the database breaks S1 by
// itself when its live lease's row is gone, or when one snapshot holds a
// live exclusive lease beside another live lease; expired rows and rows
// gone after the expiry the holder knew do not.
func TestLeaseRowViolation(t *testing.T) {
	now := time.UnixMicro(1000)
	x := lock.Holder{Key: "k", Mode: lock.Exclusive, LeaseID: "x", Token: 1, Expiry: now.Add(time.Second)}
	s := lock.Holder{Key: "k", Mode: lock.Shared, LeaseID: "s", Token: 2, Expiry: now.Add(time.Second)}
	for _, tc := range []struct {
		name string
		row  leaseRow
		exp  time.Time
		want string
	}{
		{"held", leaseRow{found: true, now: now, live: []lock.Holder{x}}, x.Expiry, ""},
		{"gone after its expiry", leaseRow{now: now}, now.Add(-time.Millisecond), ""},
		{"gone while live", leaseRow{now: now}, now.Add(time.Millisecond), "its row was gone at 1000, before the expiry 2000"},
		{"no row at all, time unknown", leaseRow{}, now.Add(time.Millisecond), ""},
		{"exclusive beside shared", leaseRow{found: true, now: now, live: []lock.Holder{s, x}}, s.Expiry, "held exclusive lease x (token 1) and 1 other live leases"},
		{"shared beside shared", leaseRow{found: true, now: now, live: []lock.Holder{s, s}}, s.Expiry, ""},
	} {
		got := tc.row.violation(tc.exp)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: violation = %q, want %q", tc.name, got, tc.want)
		}
	}
}
