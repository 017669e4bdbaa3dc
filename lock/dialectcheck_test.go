package lock_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
)

// noDequeue is SQLite's dialect with AcquireFIFO but no Dequeue.
type noDequeue struct{ dialect.Dialect }

func (d noDequeue) Statements() dialect.Statements {
	s := d.Dialect.Statements()
	s.Dequeue = ""
	return s
}

// lock.New refuses a dialect whose parts contradict each other, naming what
// is missing, and a listen pool on a dialect without dialect.Listener.
func TestNewRefusesInconsistentDialect(t *testing.T) {
	db := setupSQLite(t)
	_, err := lock.New(t.Context(), db, noDequeue{sqlitedialect.New()})
	if err == nil || !strings.Contains(err.Error(), `dialect "sqlite" has AcquireFIFO but no Dequeue statement`) {
		t.Fatalf("New with AcquireFIFO and no Dequeue: got %v", err)
	}
	_, err = lock.New(t.Context(), db, sqlitedialect.New(), lock.WithListenDB(db))
	if !errors.Is(err, lock.ErrInvalidInput) || !strings.Contains(err.Error(), "dialect.Listener") {
		t.Fatalf("New with a listen pool on SQLite: got %v", err)
	}
	l, err := lock.New(t.Context(), db, sqlitedialect.New())
	if err != nil {
		t.Fatalf("New after refusals: %v", err)
	}
	defer l.Close(t.Context())
	le, err := l.TryAcquire(t.Context(), "k", lock.Exclusive, lock.FIFO())
	if err != nil {
		t.Fatalf("FIFO acquire: %v", err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
