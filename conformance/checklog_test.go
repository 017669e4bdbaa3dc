package conformance_test

import (
	"strings"
	"testing"

	"github.com/sqlease/sqlease/conformance"
)

// TestCheckLogNamesBothGrants: an S1 violation names each grant's worker
// and detail (how its hold ended, the expiry its holder knew and its row's
// in the database), so one occurrence says which path it took; what a
// holder saw in the database that breaks S1 (Grant.Seen) is a violation
// by itself.
func TestCheckLogNamesBothGrants(t *testing.T) {
	x := conformance.Grant{Key: "k", Token: 1, Mode: "exclusive", Acquired: 100, Released: 500, Worker: "proc0", Detail: "lease=a end=orphaned"}
	s := conformance.Grant{Key: "k", Token: 2, Mode: "shared", Acquired: 400, Released: 450, Worker: "inproc", Detail: "lease=b end=released"}
	bad := conformance.CheckLog([]conformance.Grant{x, s})
	if len(bad) != 1 || !strings.Contains(bad[0], "worker proc0, lease=a end=orphaned") || !strings.Contains(bad[0], "worker inproc, lease=b end=released") {
		t.Errorf("overlap: %q, want one line naming both grants' workers and details", bad)
	}
	s.Acquired, s.Released, s.Seen = 600, 650, "its row was gone at 620, before the expiry 800 its holder knew"
	bad = conformance.CheckLog([]conformance.Grant{x, s})
	if len(bad) != 1 || !strings.Contains(bad[0], "row was gone at 620") || !strings.Contains(bad[0], "lease=b") {
		t.Errorf("row gone while live: %q, want one line naming it", bad)
	}
	if bad := conformance.CheckLog([]conformance.Grant{x, {Key: "k", Token: 2, Mode: "shared", Acquired: 500, Released: 550}}); len(bad) != 0 {
		t.Errorf("back-to-back grants: %q, want no violation", bad)
	}
}
