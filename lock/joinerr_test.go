package lock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// sqliteLocker returns a Locker with the default options on a fresh
// migrated SQLite file, and the file's database; t closes both.
func sqliteLocker(t *testing.T) (*Locker, *sql.DB) {
	t.Helper()
	db := migratedSQLite(t)
	l, err := New(t.Context(), db, sqlitedialect.New())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, db
}

// loseLease deletes le's row from db and renews it, so le is lost with
// reason LossNotOurs (SPEC S4, H3).
func loseLease(t *testing.T, db *sql.DB, le *Lease) {
	t.Helper()
	holders := dialect.Namespace{}.Object(sqlitedialect.New(), "holders")
	if _, err := db.ExecContext(context.Background(), "DELETE FROM "+holders+" WHERE lease_id = ?", le.LeaseID()); err != nil {
		t.Fatal(err)
	}
	if err := le.Renew(context.Background()); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renew of a deleted lease: %v, want ErrLeaseLost", err)
	}
}

// TestDoLossErrorIsOneLine: Do's error after a loss is one line that
// names the loss once, whether fn returns an error of its own (a write
// cut short by its ended context), the loss from a fenced transaction, or
// the loss itself (context.Cause(ctx), as the README's Lead example
// returns), and
// errors.Is still sees every part (SPEC H3).
func TestDoLossErrorIsOneLine(t *testing.T) {
	ctx := t.Context()
	l, db := sqliteLocker(t)
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, le *Lease) error
		also error // a second part errors.Is must find
	}{
		{"own error", func(ctx context.Context, le *Lease) error {
			return fmt.Errorf("job: write: %w", ctx.Err())
		}, context.Canceled},
		{"fenced transaction", func(ctx context.Context, le *Lease) error {
			return le.RunInTx(ctx, db, nil, func(context.Context, *sql.Tx) error { return nil })
		}, nil},
		{"context.Cause", func(ctx context.Context, le *Lease) error { return context.Cause(ctx) }, nil},
	} {
		err := l.Do(ctx, "oneline/"+tc.name, Exclusive, func(fctx context.Context, le *Lease) error {
			loseLease(t, db, le)
			<-fctx.Done() // ended by the loss, asynchronously
			return tc.fn(fctx, le)
		})
		if !errors.Is(err, ErrLeaseLost) || (tc.also != nil && !errors.Is(err, tc.also)) {
			t.Errorf("%s: Do: %v, want ErrLeaseLost and %v", tc.name, err, tc.also)
		}
		if err == nil {
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || strings.Count(msg, "lost") != 1 {
			t.Errorf("%s: Do's error spans lines or repeats the loss: %q", tc.name, msg)
		}
	}
}
