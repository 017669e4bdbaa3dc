//go:build race

package sqlitedialect_test

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
