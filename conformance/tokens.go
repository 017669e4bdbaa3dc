package conformance

import (
	"time"

	"github.com/sqlease/sqlease/lock"
)

// Cases for SPEC S7: tokens never go back. A dialect proves the part every
// database shares here: a grant's token is at least the database clock at
// the grant, in microseconds, so a server that lost grants (a promoted
// asynchronous standby, a restored backup or dump) still issues tokens
// above every lost one once its clock has passed them. The failover and
// restore themselves are proved per dialect on real replica clusters.

func init() {
	register(
		Case{Name: "S7_TokenIsAtLeastDatabaseClock", Rule: "S7", Run: s7TokenAtLeastClock},
	)
}

// s7TokenAtLeastClock: every grant, exclusive or shared, first or after a
// release, takes a token no smaller than the database's clock before the
// grant (read just before the acquire, in database time; SPEC S7). The
// grant's own time (GrantedAt) is read later in the statement, so it only
// bounds the token from above under load.
func s7TokenAtLeastClock(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	dbNow := clkDBClock(e)
	for i, m := range []lock.Mode{lock.Exclusive, lock.Shared, lock.Exclusive} {
		before := dbNow()
		le, err := l.TryAcquire(ctx, "s7/k", m)
		e.Must(err, "grant %d (%s)", i, m)
		floor := before.Add(-clkResolution).UnixMicro()
		e.Check(le.Token() >= floor, "grant %d (%s): token %d is below the database clock before the grant, %s = %d µs since the epoch: a server that lost grants could reissue it (SPEC S7)", i, m, le.Token(), before.UTC().Format(time.RFC3339Nano), before.UnixMicro())
		e.Must(le.Release(ctx), "release %d", i)
	}
}
