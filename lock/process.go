package lock

import "sync"

// process is all the state the Lockers of one process share; nothing else
// in the engine outlives a Locker. Each piece is keyed so that Lockers on
// different databases or namespaces never meet.
var process = struct {
	// leading serializes fn calls of every Lead in this process on one
	// key and namespace, across Lockers (elect.go). Campaigning is not
	// serialized: only the run of fn, which waits, holding its lease, for
	// the previous fn to return.
	leading sync.Map // dialect, channel and key -> chan struct{} (a one-slot semaphore)

	// gates queues the write statements of one process per database on
	// dialects that serialize writers (gate.go).
	gates sync.Map // *sql.DB -> chan struct{}

	// hub holds every blocked acquire, so that a notification or a
	// release in this process wakes the right waiter (wake.go).
	hub hubState

	// listeners holds one listening connection per pool and channel
	// (wake.go).
	listeners listenerState
}{
	hub:       hubState{waiters: map[hubKey][]*hubWaiter{}},
	listeners: listenerState{m: map[listenerKey]*listener{}, verdict: map[listenerKey]pushVerdict{}},
}
