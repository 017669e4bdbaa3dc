package mysqldialect

import "time"

// SetListenTiming sets the listening session's sleep and registration TTL
// for a test and returns the function that puts them back.
func SetListenTiming(sleep, ttl time.Duration) func() {
	s, l := listenSleep, listenTTL
	listenSleep, listenTTL = sleep, ttl
	return func() { listenSleep, listenTTL = s, l }
}
