package lock_test

import (
	"context"
	"testing"

	"github.com/sqlease/sqlease/lock"
)

// The context Do hands its function, and the lease's own context, carry the
// lease: code that receives only a context can fence with it.
func TestLeaseFromContext(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	l, err := lock.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, ok := lock.LeaseFrom(ctx); ok {
		t.Fatal("LeaseFrom found a lease in a plain context")
	}
	err = l.Do(ctx, "leasefrom/k", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
		for name, c := range map[string]context.Context{"Do's context": ctx, "Lease.Context": lease.Context()} {
			got, ok := lock.LeaseFrom(c)
			if !ok || got != lease {
				t.Errorf("LeaseFrom(%s) = %v, %v; want the lease with token %d", name, got, ok, lease.Token())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
