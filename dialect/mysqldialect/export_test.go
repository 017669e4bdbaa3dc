package mysqldialect

import (
	"testing"
	"time"
)

// SetListenTiming sets the listening session's sleep and registration TTL
// for a test. The old values come back in a t.Cleanup, which runs after the
// cleanups registered later (the test's Lockers and their listeners), so no
// listener reads them while they are put back.
func SetListenTiming(t testing.TB, sleep, ttl time.Duration) {
	s, l := listenSleep, listenTTL
	listenSleep, listenTTL = sleep, ttl
	t.Cleanup(func() { listenSleep, listenTTL = s, l })
}
