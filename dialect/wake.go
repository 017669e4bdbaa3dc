package dialect

import "strings"

// wakeSep frames the waiter ID of a Wake payload: ASCII record separator,
// chr(30) in SQL.
const wakeSep = "\x1e"

// Wake is what a release notification says (Statements.Release, Listener;
// SPEC W1, W2): the key released and, when a live pending-writer marker
// claims it, the marked waiter to wake. Wake-ups are hints: a waiter that
// misses one finds the key free at its next poll.
type Wake struct {
	// Key is the key released.
	Key string
	// WaiterID is the waiter ID of the key's live pending-writer marker:
	// only that waiter is woken. Empty: every waiter of Key is.
	WaiterID string
}

// Payload encodes w as the notification payload the dialect's Release
// sends: Key alone when WaiterID is empty, else "\x1e" + WaiterID + "\x1e" +
// Key (in SQL: chr(30) || waiter_id || chr(30) || key). Waiter IDs never
// contain "\x1e".
func (w Wake) Payload() string {
	if w.WaiterID == "" {
		return w.Key
	}
	return wakeSep + w.WaiterID + wakeSep + w.Key
}

// ParseWake decodes a notification payload that Wake.Payload encodes. A
// payload not of the framed form is a key alone; a key that itself starts
// with "\x1e" and contains another may be misread, which costs its waiters
// a poll interval, never a grant.
func ParseWake(payload string) Wake {
	if rest, ok := strings.CutPrefix(payload, wakeSep); ok {
		if id, key, ok := strings.Cut(rest, wakeSep); ok {
			return Wake{Key: key, WaiterID: id}
		}
	}
	return Wake{Key: payload}
}
