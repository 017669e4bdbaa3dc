package lock

import "github.com/sqlease/sqlease/dialect"

// Binding the named values of the engine's statements (dialect.Stmt.Params)
// to their placeholders. The hot statements (acquire, release) bind from
// small structs whose fixed values are boxed once per Locker; the others
// from maps. Either way a name without a value binds nil, as
// dialect.Stmt.Args does.

// namedArgs gives a statement's named values by name.
type namedArgs interface{ arg(name string) any }

// argMap is namedArgs from a map, for the statements off the hot path.
type argMap map[string]any

func (m argMap) arg(name string) any { return m[name] }

// bindArgs orders a's values for s's placeholders.
func bindArgs(s dialect.Stmt, a namedArgs) []any {
	out := make([]any, len(s.Params))
	for i, p := range s.Params {
		out[i] = a.arg(p)
	}
	return out
}

// boxed holds a Locker's statement values that never change, converted to
// interface values once (each conversion of a string or a large integer
// allocates).
type boxed struct {
	owner, ttlUS, channel any
}

// modeArgs are the mode codes (Mode.code) as interface values.
var modeArgs = [2]any{Exclusive.code(), Shared.code()}

// arg returns m.code() as an interface value, without allocating.
func (m Mode) arg() any {
	if m == Exclusive {
		return modeArgs[0]
	}
	return modeArgs[1]
}

// acquireArgs are the named values of the acquire statements (Acquire,
// Grant, Probe, Mark and their FIFO forms).
type acquireArgs struct {
	key, mode, leaseID, owner, ttlUS, markerUS, watchUS, ticketID, ticketUS, limit any
}

func (a *acquireArgs) arg(name string) any {
	switch name {
	case "key":
		return a.key
	case "mode":
		return a.mode
	case "lease_id":
		return a.leaseID
	case "owner":
		return a.owner
	case "ttl_us":
		return a.ttlUS
	case "marker_us":
		return a.markerUS
	case "watch_us":
		return a.watchUS
	case "ticket_id":
		return a.ticketID
	case "ticket_us":
		return a.ticketUS
	case limitParam:
		return a.limit
	}
	return nil
}

// acquireVals returns the named values of one acquire attempt: key in
// mode under leaseID, with the marker and watch TTLs in microseconds (0:
// none), the semaphore limit (0: none; SPEC W7), and the FIFO ticket when
// tk is not nil.
func (l *Locker) acquireVals(key string, mode Mode, leaseID string, markerUS, watchUS, limit int64, tk *ticketArgs) *acquireArgs {
	a := &acquireArgs{
		key: key, mode: mode.arg(), leaseID: leaseID, owner: l.boxed.owner,
		ttlUS: l.boxed.ttlUS, markerUS: markerUS, watchUS: watchUS, limit: limit,
	}
	if tk != nil {
		a.ticketID, a.ticketUS = tk.id, tk.us
	}
	return a
}

// releaseArgs are the named values of the Release statement.
type releaseArgs struct{ leaseID, token, channel any }

// releaseVals returns the named values of a release of lease leaseID
// whose token is token (0: whatever its token).
func (l *Locker) releaseVals(leaseID string, token int64) *releaseArgs {
	return &releaseArgs{leaseID: leaseID, token: token, channel: l.boxed.channel}
}

func (a *releaseArgs) arg(name string) any {
	switch name {
	case "lease_id":
		return a.leaseID
	case "token":
		return a.token
	case "channel":
		return a.channel
	}
	return nil
}
