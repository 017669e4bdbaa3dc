package dialect_test

import (
	"testing"

	"github.com/sqlease/sqlease/dialect"
)

// A release notification's payload names the key and, optionally, the
// marked waiter to wake (SPEC W1, W2); the encoding round-trips.
func TestWakePayloadRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		w       dialect.Wake
		payload string
	}{
		{dialect.Wake{Key: "jobs/a"}, "jobs/a"},
		{dialect.Wake{Key: "jobs/a", WaiterID: "W1"}, "\x1eW1\x1ejobs/a"},
		{dialect.Wake{Key: "", WaiterID: "W1"}, "\x1eW1\x1e"},
		{dialect.Wake{Key: "a\x1eb"}, "a\x1eb"},
	} {
		if got := tc.w.Payload(); got != tc.payload {
			t.Errorf("%+v.Payload() = %q, want %q", tc.w, got, tc.payload)
		}
		if got := dialect.ParseWake(tc.payload); got != tc.w {
			t.Errorf("ParseWake(%q) = %+v, want %+v", tc.payload, got, tc.w)
		}
	}
	// A payload with one separator only is a key.
	if got := dialect.ParseWake("\x1eonly"); got != (dialect.Wake{Key: "\x1eonly"}) {
		t.Errorf("ParseWake of an unframed payload = %+v, want the key alone", got)
	}
}
