package pgdialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// TestAcquireRefusesOtherIsolation: with sessions defaulting to REPEATABLE
// READ or SERIALIZABLE, the acquire function raises SQLStateWrongIsolation
// (classified ErrorIsolation) having done nothing, and a Locker on such a
// pool still grants and refuses correctly (SPEC S6).
func TestAcquireRefusesOtherIsolation(t *testing.T) {
	base := conftest.PostgresDSN(t)
	d := pgdialect.New()
	for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(iso.String(), func(t *testing.T) {
			ctx := context.Background()
			dsn, err := conftest.PostgresIsolationDSN(base, iso)
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var level string
			if err := db.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&level); err != nil {
				t.Fatal(err)
			}
			want := map[sql.IsolationLevel]string{sql.LevelRepeatableRead: "repeatable read", sql.LevelSerializable: "serializable"}[iso]
			if level != want {
				t.Fatalf("session isolation %q, want %q: the DSN option did not apply", level, want)
			}
			var rnd [6]byte
			_, _ = crand.Read(rnd[:])
			ns := dialect.Namespace{Schema: "sqlease_iso_" + hex.EncodeToString(rnd[:])}
			_, _ = db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+d.QuoteIdent(ns.Schema)+" CASCADE")
			defer db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+d.QuoteIdent(ns.Schema)+" CASCADE")
			if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			_, err = db.ExecContext(ctx, "SELECT * FROM "+ns.Object(d, "acquire")+"('k', 'x', 'id', 'o', 1000000, 0, 0)")
			if d.Classify(err) != dialect.ErrorIsolation {
				t.Fatalf("acquire function under %s = %v (class %v), want SQLSTATE %s (class isolation)", level, err, d.Classify(err), pgdialect.SQLStateWrongIsolation)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+ns.Object(d, "holders")).Scan(&n); err != nil || n != 0 {
				t.Fatalf("refused call left %d rows (%v)", n, err)
			}
			a, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			b, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(ctx)
			le, err := a.TryAcquire(ctx, "k", lock.Exclusive)
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if _, err := b.TryAcquire(ctx, "k", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
				t.Fatalf("second acquire = %v, want ErrLocked", err)
			}
			if err := le.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			le, err = b.TryAcquire(ctx, "k", lock.Exclusive)
			if err != nil {
				t.Fatalf("acquire after release: %v", err)
			}
			_ = le.Release(ctx)
		})
	}
}
