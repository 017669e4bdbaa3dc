package dialect

// FastPather is an optional interface for a dialect whose Acquire script is
// costly for the common cases (SQLite: a script in a write transaction that
// takes the database's one write lock). FastPath returns one-statement
// shortcuts that the engine runs, each alone in autocommit, instead of the
// script when they fit; every one of them is optional, and a dialect
// without FastPather always runs its Acquire script (SPEC S1, W1).
type FastPather interface {
	FastPath() FastPath
}

// FastPath holds the shortcut statements of a FastPather. Parameters and
// result rows are Acquire's (AcquireFIFO's for ProbeFIFO).
type FastPath struct {
	// Probe is a read-only query run before the Acquire script when the
	// attempt has no marker or watch to write (@marker_us and @watch_us
	// are 0), or when Mark can write the marker: it returns the same
	// refusal rows as Acquire for the live leases and markers that block
	// the request, and no row when the key looks free (the engine then
	// runs Grant or Acquire). A refused poll then takes no write lock.
	Probe string
	// ProbeFIFO is Probe for AcquireFIFO, run only when @ticket_us,
	// @marker_us and @watch_us are 0: the refusal rows, ticket rows
	// included, or no row when the request looks grantable. It needs
	// Statements.AcquireFIFO.
	ProbeFIFO string
	// Grant is the uncontended grant in one statement: it grants the
	// request exactly when Acquire would, taking over expired holders and
	// markers of @key and clearing the caller's own marker, and returns
	// Acquire's granted row; otherwise it returns no row and changes
	// nothing that blocks or grants (SPEC S1, S2, S3, W1). The engine runs
	// it before Acquire (after a Probe that found no blocker, or first on a
	// blocking acquire's first attempt) and runs Acquire when it returns no
	// row. Not used for FIFO acquires.
	Grant string
	// Mark refreshes a marker in one statement, run by a blocked exclusive
	// waiter after Probe reported blockers and @marker_us > 0 (with Grant
	// set): it sets or refreshes the caller's pending-writer marker on @key
	// (@lease_id, @owner, expiry now + @marker_us) unless another waiter's
	// live marker holds the claim (an expired one is taken over), and
	// returns one row (expires_us, now_us) when the caller's marker is set,
	// none otherwise (SPEC W1). Without it the engine runs the Acquire
	// script to refresh a marker.
	Mark string
}

// FastPathOf returns d's fast path, or the zero FastPath (no shortcut)
// when d does not implement FastPather.
func FastPathOf(d Dialect) FastPath {
	if f, ok := d.(FastPather); ok {
		return f.FastPath()
	}
	return FastPath{}
}
