package mysqldialect_test

import (
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/sqlease/sqlease/dialect/mysqldialect"
)

// TestRenewBatchReturnsExactlyTheRenewed_MySQL (SPEC H2, S4): the
// renew_batch procedure (migration 00005) renews a listed lease exactly
// when it is live and its token matches, and returns exactly the leases it
// renewed, each with the expiry now in the table, while other sessions
// release listed leases and take over expired ones at the same time.
func TestRenewBatchReturnsExactlyTheRenewed_MySQL(t *testing.T) {
	ctx := t.Context()
	db, ns, _ := tokenSchema(t, "sqlease_rb_", 0)
	d := mysqldialect.New()
	call := func(name string) string { return "CALL " + ns.Object(d, name) }
	type lease struct {
		id, key string
		token   int64
		expires int64
	}
	grant := func(key string, ttlUS int64) (lease, error) {
		var rnd [16]byte
		_, _ = crand.Read(rnd[:])
		le := lease{id: hex.EncodeToString(rnd[:]), key: key}
		var granted int
		var id, mode, owner string
		var now int64
		err := db.QueryRowContext(ctx, call("acquire")+"(?, 'x', ?, 'test', ?, 0, 0)", key, le.id, ttlUS).
			Scan(&granted, &id, &mode, &owner, &le.token, &le.expires, &now)
		if err == nil && granted != 1 {
			err = fmt.Errorf("not granted")
		}
		if err != nil {
			return le, fmt.Errorf("acquire %s: %w", key, err)
		}
		return le, nil
	}
	// Keys i%3: 0 live, 1 expired (taken over meanwhile), 2 live but
	// listed with a wrong token. Live keys with i%6 == 0 are released
	// meanwhile.
	const n, ttl = 300, int64(30_000_000)
	leases := make([]lease, n)
	var list []string
	for i := range leases {
		ttl := int64(60_000_000)
		if i%3 == 1 {
			ttl = 1
		}
		le, err := grant(fmt.Sprintf("rb/%d", i), ttl)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = le
		tok := le.token
		if i%3 == 2 {
			tok++
		}
		list = append(list, fmt.Sprintf("%s:%d", le.id, tok))
	}
	arg, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // takeovers of the expired leases
		defer wg.Done()
		for i := 1; i < n; i += 3 {
			if _, err := grant(leases[i].key, 60_000_000); err != nil {
				t.Errorf("takeover: %v", err)
			}
		}
	}()
	go func() { // releases of some live ones
		defer wg.Done()
		for i := 0; i < n; i += 6 {
			if _, err := db.ExecContext(ctx, call("release")+"(?, ?)", leases[i].id, leases[i].token); err != nil {
				t.Errorf("release %s: %v", leases[i].key, err)
			}
		}
	}()
	renew := func() (map[string]int64, int64) {
		t.Helper()
		rows, err := db.QueryContext(ctx, call("renew_batch")+"(?, ?)", string(arg), ttl)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got, now := map[string]int64{}, int64(0)
		for rows.Next() {
			var id string
			var exp int64
			if err := rows.Scan(&id, &exp, &now); err != nil {
				t.Fatal(err)
			}
			if exp != now+ttl {
				t.Errorf("lease %s returned with expiry %d, want now %d + ttl", id, exp, now)
			}
			got[id] = exp
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got, now
	}
	released := map[string]bool{}
	var last map[string]int64
	var lastNow int64
	for round := 0; round < 20; round++ {
		last, lastNow = renew()
		for i, le := range leases {
			_, ok := last[le.id]
			switch {
			case i%3 != 0 && ok:
				t.Errorf("round %d: lease %s (kind %d: expired or wrong token) was renewed", round, le.key, i%3)
			case i%6 == 3 && !ok:
				t.Errorf("round %d: live lease %s was not renewed", round, le.key)
			case i%6 == 0 && !ok:
				released[le.id] = true
			case i%6 == 0 && ok && released[le.id]:
				t.Errorf("round %d: lease %s renewed after a round found it released", round, le.key)
			}
		}
	}
	wg.Wait()

	// Once the releases and takeovers are done, the table agrees with one
	// more call's reply: every lease it returned has the expiry it
	// returned, and no listed lease it did not return has the expiry that
	// call set.
	last, lastNow = renew()
	expiry := map[string]int64{}
	rows, err := db.QueryContext(ctx, "SELECT lease_id, expires_us FROM "+ns.Object(d, "expiry"))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var exp int64
		if err := rows.Scan(&id, &exp); err != nil {
			t.Fatal(err)
		}
		expiry[id] = exp
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	for i, le := range leases {
		exp, inTable := expiry[le.id]
		got, returned := last[le.id]
		switch {
		case returned != (i%6 == 3):
			t.Errorf("lease %s (kind %d): returned %v by the call after the releases", le.key, i%6, returned)
		case returned && exp != got:
			t.Errorf("lease %s: the last call returned expiry %d, the table has %d", le.key, got, exp)
		case !returned && inTable && exp == lastNow+ttl:
			t.Errorf("lease %s: renewed by the last call but not returned", le.key)
		case i%3 == 2 && exp != le.expires:
			t.Errorf("lease %s listed with a wrong token: expiry moved from %d to %d", le.key, le.expires, exp)
		case i%3 == 1 && inTable:
			t.Errorf("expired lease %s is still in the table after its takeover", le.key)
		}
	}
}
