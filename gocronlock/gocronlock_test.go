package gocronlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/gocronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

// TestLocker: Lock takes the job's key (prefixed) so another replica's
// Lock fails with lock.ErrLocked (gocron skips that run), Job hands the
// run's lease to the task, Unlock frees the key, and a task without a
// lease does not run.
func TestLocker(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		ctx := context.Background()
		a, err := gocronlock.NewLocker(b.Locker(t, "a"), gocronlock.WithKeyPrefix("gocron/"))
		if err != nil {
			t.Fatal(err)
		}
		other, err := gocronlock.NewLocker(b.Locker(t, "b"), gocronlock.WithKeyPrefix("gocron/"))
		if err != nil {
			t.Fatal(err)
		}
		jl, err := a.Lock(ctx, "report")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Lock(ctx, "report"); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("Lock while another replica runs the job = %v, want lock.ErrLocked", err)
		}
		var key string
		err = a.Job("report", func(ctx context.Context, lease *lock.Lease) error {
			if got, ok := lock.LeaseFrom(ctx); !ok || got != lease {
				t.Errorf("LeaseFrom(job context) = %v, %v; want the run's lease", got, ok)
			}
			key = lease.Key()
			return nil
		})(ctx)
		if err != nil || key != "gocron/report" {
			t.Fatalf("Job ran with the lease of %q, err %v; want gocron/report, nil", key, err)
		}
		if err := jl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		ran := false
		err = a.Job("report", func(context.Context, *lock.Lease) error { ran = true; return nil })(ctx)
		if ran || !errors.Is(err, gocronlock.ErrNoLease) {
			t.Fatalf("Job without a lease: ran %v, err %v; want no run, ErrNoLease", ran, err)
		}
		jl, err = other.Lock(ctx, "report")
		if err != nil {
			t.Fatalf("Lock after Unlock: %v", err)
		}
		_ = jl.Unlock(ctx)
	})
}

// TestElectorFollower: of two Electors on one key only one leads; the
// follower's IsLeader fails with ErrNotLeader and its Job does not run.
func TestElectorFollower(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		ctx := context.Background()
		lead, err := gocronlock.NewElector(b.Locker(t, "a"), "gocron/leader")
		if err != nil {
			t.Fatal(err)
		}
		defer lead.Close()
		for lead.IsLeader(ctx) != nil {
			time.Sleep(10 * time.Millisecond)
		}
		follow, err := gocronlock.NewElector(b.Locker(t, "b"), "gocron/leader")
		if err != nil {
			t.Fatal(err)
		}
		defer follow.Close()
		time.Sleep(100 * time.Millisecond)
		if err := follow.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) {
			t.Fatalf("follower IsLeader = %v, want ErrNotLeader", err)
		}
		ran := false
		err = follow.Job(func(context.Context, *lock.Lease) error { ran = true; return nil })(ctx)
		if ran || !errors.Is(err, gocronlock.ErrNotLeader) || !errors.Is(err, gocronlock.ErrNoLease) {
			t.Fatalf("follower Job: ran %v, err %v; want no run, ErrNotLeader and ErrNoLease", ran, err)
		}
	})
}

// TestBadInput: nil Lockers, bad keys and nil options are refused with
// lock.ErrInvalidInput (SPEC I1).
func TestBadInput(t *testing.T) {
	if _, err := gocronlock.NewLocker(nil); !errors.Is(err, lock.ErrInvalidInput) {
		t.Errorf("NewLocker(nil) = %v, want ErrInvalidInput", err)
	}
	if _, err := gocronlock.NewElector(nil, "k"); !errors.Is(err, lock.ErrInvalidInput) {
		t.Errorf("NewElector(nil, k) = %v, want ErrInvalidInput", err)
	}
	schedtest.EachOf(t, []string{"sqlite"}, func(t *testing.T, b schedtest.Backend) {
		l := b.Locker(t, "a")
		if _, err := gocronlock.NewElector(l, ""); !errors.Is(err, lock.ErrInvalidInput) {
			t.Errorf(`NewElector(l, "") = %v, want ErrInvalidInput`, err)
		}
		if _, err := gocronlock.NewLocker(l, nil); !errors.Is(err, lock.ErrInvalidInput) {
			t.Errorf("NewLocker(l, nil) = %v, want ErrInvalidInput", err)
		}
		_, err := gocronlock.NewElector(l, "k", gocronlock.WithLogger(nil))
		if !errors.Is(err, lock.ErrInvalidInput) || !strings.Contains(err.Error(), "logger nil") {
			t.Errorf("NewElector(l, k, WithLogger(nil)) = %v, want ErrInvalidInput naming the nil logger", err)
		}
		// Refused when built, not at each run.
		for _, tc := range []struct {
			what string
			opts []gocronlock.Option
			want string
		}{
			{"a nil acquire option", []gocronlock.Option{gocronlock.WithAcquireOptions(lock.HoldAtLeast(time.Second), nil)}, "WithAcquireOptions: option 2 of 2 is nil"},
			{"a prefix with NUL", []gocronlock.Option{gocronlock.WithKeyPrefix("jobs\x00/")}, `WithKeyPrefix("jobs\x00/")`},
			{"a prefix as long as a key", []gocronlock.Option{gocronlock.WithKeyPrefix(strings.Repeat("p", lock.MaxKeyLength))}, "no job's key could start with it"},
		} {
			if _, err := gocronlock.NewLocker(l, tc.opts...); !errors.Is(err, lock.ErrInvalidInput) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewLocker with %s = %v, want ErrInvalidInput with %q", tc.what, err, tc.want)
			}
		}
		_, err = gocronlock.NewElector(l, "k", gocronlock.WithKeyPrefix("jobs/"))
		if !errors.Is(err, lock.ErrInvalidInput) || !strings.Contains(err.Error(), `put it in the key instead ("jobs/k")`) {
			t.Errorf("NewElector with WithKeyPrefix = %v, want ErrInvalidInput suggesting the key jobs/k", err)
		}
		// The default prefix, given explicitly, is no prefix.
		if el, err := gocronlock.NewElector(l, "k", gocronlock.WithKeyPrefix("")); err != nil {
			t.Errorf(`NewElector with WithKeyPrefix("") = %v, want the default`, err)
		} else {
			el.Close()
		}
		// A good prefix still works after the refusals.
		gl, err := gocronlock.NewLocker(l, gocronlock.WithKeyPrefix("jobs/"))
		if err != nil {
			t.Fatal(err)
		}
		jl, err := gl.Lock(t.Context(), "nightly")
		if err != nil {
			t.Fatal(err)
		}
		if hs, _, err := l.Holders(t.Context(), "jobs/"); err != nil || len(hs) != 1 || hs[0].Key != "jobs/nightly" {
			t.Errorf("holders under jobs/: %+v, %v; want the lease on jobs/nightly", hs, err)
		}
		if err := jl.Unlock(t.Context()); err != nil {
			t.Error(err)
		}
	})
}
