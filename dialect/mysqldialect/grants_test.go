package mysqldialect_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// TestUpgradesKeepExecuteGrants_MySQL: migrations 00008-00010 re-create
// the acquire and release procedures with CREATE OR REPLACE on MariaDB, so
// a service account granted EXECUTE on them per procedure keeps its
// grants, up and down (DROP PROCEDURE revokes every grant on the procedure
// while automatic_sp_privileges is on, the default; MySQL 8 has no CREATE
// OR REPLACE PROCEDURE, operations.md).
func TestUpgradesKeepExecuteGrants_MySQL(t *testing.T) {
	ctx := t.Context()
	db, ns, p := tokenSchema(t, "sqlease_t_grant_", 7)
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	user := "sqlease_t_" + hex.EncodeToString(rnd[:])
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'") })
	if _, err := db.ExecContext(ctx, "CREATE USER '"+user+"'@'%'"); err != nil {
		t.Fatal(err)
	}
	procs := []string{"sqlease_acquire_limit", "sqlease_release", "sqlease_acquire_fifo"}
	for _, proc := range procs {
		if _, err := db.ExecContext(ctx, "GRANT EXECUTE ON PROCEDURE `"+ns.Schema+"`.`"+proc+"` TO '"+user+"'@'%'"); err != nil {
			t.Fatal(err)
		}
	}
	granted := func(when string) {
		t.Helper()
		rows, err := db.QueryContext(ctx, "SHOW GRANTS FOR '"+user+"'@'%'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var all []string
		for rows.Next() {
			var g string
			if err := rows.Scan(&g); err != nil {
				t.Fatal(err)
			}
			all = append(all, g)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for _, proc := range procs {
			if !strings.Contains(strings.Join(all, "\n"), "`"+proc+"`") {
				t.Errorf("%s: EXECUTE on %s is gone; grants: %q", when, proc, all)
			}
		}
	}
	for v := int64(8); v <= 10; v++ {
		if _, err := p.UpByOne(ctx); err != nil {
			t.Fatal(err)
		}
		granted(fmt.Sprintf("after %05d up", v))
	}
	for v := int64(10); v >= 8; v-- {
		if _, err := p.Down(ctx); err != nil {
			t.Fatal(err)
		}
		granted(fmt.Sprintf("after %05d down", v))
	}
}
