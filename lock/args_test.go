package lock

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/migrate"
)

// The hot statements bind from structs instead of maps (args.go). Each
// struct must answer exactly the names its statements were given before,
// with the value set for each, and nil for every other parameter name, as
// a map without the name did.
func TestHotArgsAnswerTheirNames(t *testing.T) {
	acq := &acquireArgs{key: "k", mode: "x", leaseID: "id", owner: "o", ttlUS: int64(1), markerUS: int64(2),
		watchUS: int64(3), ticketID: "t", ticketUS: int64(4)}
	rel := &releaseArgs{leaseID: "id", token: int64(7), channel: "ch"}
	for _, c := range []struct {
		name string
		args namedArgs
		want map[string]any
	}{
		{"acquire", acq, map[string]any{"key": "k", "mode": "x", "lease_id": "id", "owner": "o", "ttl_us": int64(1),
			"marker_us": int64(2), "watch_us": int64(3), "ticket_id": "t", "ticket_us": int64(4)}},
		{"release", rel, map[string]any{"lease_id": "id", "token": int64(7), "channel": "ch"}},
	} {
		for _, p := range append(paramNames, "no_such_name") {
			if got, want := c.args.arg(p), c.want[p]; got != want {
				t.Errorf("%s: @%s binds %v, want %v", c.name, p, got, want)
			}
		}
		for p := range c.want {
			found := false
			for _, q := range paramNames {
				found = found || q == p
			}
			if !found {
				t.Errorf("%s: @%s is not a parameter name statements may use (paramNames)", c.name, p)
			}
		}
	}
	s := dialect.Stmt{SQL: "x", Params: []string{"owner", "key", "owner", "limit"}}
	got := bindArgs(s, acq)
	if len(got) != 4 || got[0] != "o" || got[1] != "k" || got[2] != "o" || got[3] != nil {
		t.Errorf("bindArgs = %v, want [o k o <nil>]", got)
	}
	if got := bindArgs(s, argMap{"key": "m"}); got[1] != "m" || got[0] != nil {
		t.Errorf("bindArgs(argMap) = %v, want [<nil> m <nil> <nil>]", got)
	}
	if Exclusive.arg() != Exclusive.code() || Shared.arg() != Shared.code() {
		t.Errorf("Mode.arg: %v, %v; want the codes %q, %q", Exclusive.arg(), Shared.arg(), Exclusive.code(), Shared.code())
	}
}

// A Locker's acquire and release values are the ones its maps held before:
// the caller's key, mode code, lease ID, marker, watch and ticket values,
// and the Locker's owner, TTL and channel, as the same Go types.
func TestLockerBindsItsOwnValues(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "args.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := sqlitedialect.New()
	if _, err := migrate.Up(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, db, d, WithOwner("worker-7"), WithTTL(7*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	check := func(what string, a namedArgs, want map[string]any) {
		t.Helper()
		for _, p := range paramNames {
			if got := a.arg(p); got != want[p] {
				t.Errorf("%s: @%s binds %#v, want %#v", what, p, got, want[p])
			}
		}
	}
	check("exclusive acquire", l.acquireVals("k", Exclusive, "id", 2, 3, 0, nil), map[string]any{
		"key": "k", "mode": "x", "lease_id": "id", "owner": "worker-7", "ttl_us": int64(7_000_000),
		"marker_us": int64(2), "watch_us": int64(3), "shared_limit": int64(0)})
	check("shared FIFO acquire", l.acquireVals("k", Shared, "id", 0, 0, 3, &ticketArgs{id: "t", us: 4}), map[string]any{
		"key": "k", "mode": "s", "lease_id": "id", "owner": "worker-7", "ttl_us": int64(7_000_000),
		"marker_us": int64(0), "watch_us": int64(0), "ticket_id": "t", "ticket_us": int64(4), "shared_limit": int64(3)})
	check("release", l.releaseVals("id", 9), map[string]any{"lease_id": "id", "token": int64(9), "channel": l.channel})
	if l.channel == "" {
		t.Error("the Locker has no notification channel")
	}
}
