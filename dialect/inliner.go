package dialect

import "database/sql/driver"

// Inliner is an optional interface for a dialect whose driver prepares
// every statement sent with arguments (go-sql-driver/mysql without
// interpolateParams answers driver.ErrSkip and database/sql then sends a
// prepare, an execute and a close: two round trips and a server-side parse
// per statement). The engine then sends its hot statements (acquire,
// release, the marker refresh) with their arguments written into the text
// by Inline, in one round trip; the statements mean the same.
type Inliner interface {
	// Inline returns query with each placeholder replaced by a literal of
	// the argument at its position, values already converted by the
	// driver's checker. ok is false when it cannot do so safely (a value
	// type it does not write, a quote or comment in query, or a count that
	// does not match); the engine then lets the driver bind them.
	Inline(query string, args []driver.NamedValue) (inlined string, ok bool)
}
