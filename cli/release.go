package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// releaseJSON is the object `sqlease release --json` prints.
type releaseJSON struct {
	Key      string       `json:"key"`
	Released []holderJSON `json:"released"` // as status prints them, read just before the release
}

// releaseMore is `sqlease help release` after the summary.
const releaseMore = `release deletes every lease, exclusive or shared, of exactly KEY
(lock.Locker.ForceRelease): for a holder that is hung, or a process known
dead whose lease should not wait for its expiry. Pending-writer markers and
FIFO tickets of KEY are left alone: their waiters keep their places, and
the first of them is granted next.

The holder is not told at once: it finds its lease gone at its next
renewal (about a third of its TTL later) and its context ends with
lock.ErrLeaseLost. Until then it runs on, but its fenced transactions
(Lease.RunInTx) commit nothing, and the next grant of KEY has a greater
fencing token, so storage that refuses older tokens refuses it. What it
does outside the database, unfenced, nothing stops.

Without --yes it lists the leases it would release and asks on a terminal;
when stdin is not a terminal it exits 2 saying so. Exit codes: 0 released;
1 nothing held under KEY (or not confirmed); 2 bad usage.`

func setupRelease(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var c dbCmd
	var yes bool
	c.register(fs, `print one JSON object {"key", "released": [leases as status prints them]} instead of text`)
	fs.BoolVar(&yes, "yes", false, "release without asking (required when stdin is not a terminal)")
	return func(ctx context.Context, args []string) error {
		switch {
		case len(args) == 0:
			return argErr("missing KEY: the key whose leases to release")
		case len(args) > 1:
			return argErr("unexpected argument %q", args[1])
		}
		key := args[0]
		if err := lock.CheckKey(key); err != nil {
			return inputUsageErr(err)
		}
		l, closeAll, err := c.locker(ctx)
		if err != nil {
			return err
		}
		defer closeAll()
		held, waiters, now, err := leasesOf(ctx, l, key)
		if err != nil {
			return err
		}
		if len(held) == 0 {
			return nothingHeld(out, c.asJSON, key, waiters)
		}
		if !yes {
			if err := holdersTable(out.stderr, held, now, nil); err != nil {
				return err
			}
			what := fmt.Sprintf("release %s of key %s listed above", plural(len(held), "lease"), strconv.Quote(key))
			if err := confirm(out, what, yes); err != nil {
				return err
			}
		}
		removed, err := l.ForceRelease(ctx, key)
		switch {
		case len(removed) == 0 && err != nil:
			return err
		case len(removed) == 0:
			// Each ended on its own between the listing and the release.
			return nothingHeld(out, c.asJSON, key, waiters)
		}
		if werr := printReleased(out, c.asJSON, key, removed, now, waiters); werr != nil && err == nil {
			err = werr
		}
		return err
	}
}

// leasesOf returns the leases of exactly key, the number of its waiters'
// markers and tickets, and the database's time.
func leasesOf(ctx context.Context, l *lock.Locker, key string) (held []lock.Holder, waiters int, now time.Time, err error) {
	hs, now, err := l.Holders(ctx, key)
	if err != nil {
		return nil, 0, now, err
	}
	for _, h := range hs {
		switch {
		case h.Key != key:
		case h.Mode == lock.Exclusive || h.Mode == lock.Shared:
			held = append(held, h)
		default:
			waiters++
		}
	}
	return held, waiters, now, nil
}

// nothingHeld reports that no lease holds key: exit 1, and with --json an
// empty "released" list.
func nothingHeld(out *output, asJSON bool, key string, waiters int) error {
	if asJSON {
		if err := writeJSON(out.stdout, releaseJSON{Key: key, Released: []holderJSON{}}); err != nil {
			return err
		}
	}
	return &exitError{code: exitFailed, err: fmt.Errorf("nothing held under key %s; nothing was changed%s", strconv.Quote(key), waitersLeft(waiters))}
}

// printReleased prints the leases removed from key, as read at the
// database time now.
func printReleased(out *output, asJSON bool, key string, removed []lock.Holder, now time.Time, waiters int) error {
	if asJSON {
		res := releaseJSON{Key: key, Released: []holderJSON{}}
		for _, h := range removed {
			res.Released = append(res.Released, newHolderJSON(h, now, 0))
		}
		return writeJSON(out.stdout, res)
	}
	if err := holdersTable(out.stdout, removed, now, nil); err != nil {
		return err
	}
	fmt.Fprintf(out.stdout, "released %s of key %s: each holder finds it gone at its next renewal, its fenced writes are refused, and the next grant has a greater token%s\n",
		plural(len(removed), "lease"), strconv.Quote(key), waitersLeft(waiters))
	return nil
}

// waitersLeft says how many waiters of the key were left alone.
func waitersLeft(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%s left waiting: pending writers and FIFO tickets are not released)", plural(n, "waiter"))
}

// plural renders "1 lease", "2 leases".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
