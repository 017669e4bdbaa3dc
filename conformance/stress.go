package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// childEnv carries a child process's work (JSON).
const childEnv = "SQLEASE_CONFORMANCE_CHILD"

// IsChild reports whether this process was started by a multi-process case
// to do a share of its work. Test binaries reach it through Run; other
// programs that run cases (sqlease check) must call ChildMain first thing.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// ChildMain does a child process's work and returns its exit code.
func ChildMain() int {
	var spec StressSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "conformance child: bad spec:", err)
		return 2
	}
	d, err := dialect.Lookup(spec.Dialect)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance child:", err)
		return 2
	}
	db, err := sql.Open(spec.Driver, spec.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance child:", err)
		return 2
	}
	defer db.Close()
	db.SetMaxOpenConns(6)
	db.SetMaxIdleConns(6)
	ctx := context.Background()
	role := childRoles[spec.Role]
	if role == nil {
		fmt.Fprintf(os.Stderr, "conformance child: unknown role %q\n", spec.Role)
		return 2
	}
	if err := role(ctx, db, d, spec); err != nil {
		fmt.Fprintln(os.Stderr, "conformance child:", err)
		return 1
	}
	return 0
}

// childRoles maps StressSpec.Role to the work a child process does.
// Register roles in an init function of this package.
var childRoles = map[string]func(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error{
	"": func(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
		return RunStressWorkers(ctx, db, d, spec, nil)
	},
}

// StressSpec describes contention work: Workers goroutines that for
// Duration take leases on Keys keys (mode mixed by SharedPercent), hold them
// briefly and log each grant to LogTable. CrashPercent of grants are
// orphaned (the holder "crashes") instead of released.
type StressSpec struct {
	// Role picks the child's work ("" = RunStressWorkers).
	Role string
	// Extra carries role-specific settings.
	Extra                map[string]string
	Dialect, Driver, DSN string
	Namespace            dialect.Namespace
	LogTable             string
	Worker               string
	Workers, Keys        int
	SharedPercent        int
	CrashPercent         int
	Duration, TTL, Hold  time.Duration
	WaitTimeout          time.Duration

	// FIFOPercent of acquires wait in the key's FIFO queue (lock.FIFO,
	// SPEC W6); the dialect must have dialect.CapFIFO when it is > 0.
	FIFOPercent int
	// Limit, when > 0, makes every shared acquire a semaphore acquire of
	// at most Limit holders (lock.Limit, SPEC W7); the dialect must
	// support it (dialect.SupportsLimit).
	Limit int
}

// CreateLogTable creates the grant log table used by stress cases. Its
// last two columns may be left out (NULL): detail, how the hold ended
// (for a violation's message), and seen (see Grant.Seen).
func CreateLogTable(ctx context.Context, db *sql.DB, table string) error {
	_, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (lock_key TEXT NOT NULL, token BIGINT NOT NULL, mode TEXT NOT NULL, acquired_us BIGINT NOT NULL, released_us BIGINT NOT NULL, worker TEXT NOT NULL, detail TEXT, seen TEXT)`)
	return err
}

// grantInsert is the statement that logs one grant to table (see
// CreateLogTable), with d's placeholders.
func grantInsert(d dialect.Dialect, table string) string {
	return fmt.Sprintf(`INSERT INTO %s (lock_key, token, mode, acquired_us, released_us, worker) VALUES (%s, %s, %s, %s, %s, %s)`,
		table, d.Placeholder(1), d.Placeholder(2), d.Placeholder(3), d.Placeholder(4), d.Placeholder(5), d.Placeholder(6))
}

// grantInsertDetail is grantInsert with the detail and seen columns.
func grantInsertDetail(d dialect.Dialect, table string) string {
	return fmt.Sprintf(`INSERT INTO %s (lock_key, token, mode, acquired_us, released_us, worker, detail, seen) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)`,
		table, d.Placeholder(1), d.Placeholder(2), d.Placeholder(3), d.Placeholder(4), d.Placeholder(5), d.Placeholder(6), d.Placeholder(7), d.Placeholder(8))
}

// endOfHold is when a lease's hold ends, for the grant log: the database's
// current time, or the lease's expiry if that came first.
func endOfHold(ctx context.Context, l *lock.Locker, lease *lock.Lease) (int64, error) {
	row, err := readRow(ctx, l, lease)
	if err != nil {
		return 0, err
	}
	return row.end(lease), nil
}

// leaseRow is what the database held for a lease at one moment (read with
// Locker.Holders): its row's expiry, whether the row was there, the
// database time of the read (zero when the key had no row at all), and
// the key's live leases then (markers and tickets left out).
type leaseRow struct {
	expiry time.Time
	found  bool
	now    time.Time
	live   []lock.Holder
}

// readRow reads lease's row.
func readRow(ctx context.Context, l *lock.Locker, lease *lock.Lease) (leaseRow, error) {
	hs, now, err := l.Holders(ctx, lease.Key())
	if err != nil {
		return leaseRow{}, fmt.Errorf("holders: %w", err)
	}
	r := leaseRow{now: now}
	for _, h := range hs {
		if h.Key != lease.Key() || (h.Mode != lock.Exclusive && h.Mode != lock.Shared) {
			continue
		}
		if h.LeaseID == lease.LeaseID() {
			r.expiry, r.found = h.Expiry, true
		}
		if h.Expiry.After(now) {
			r.live = append(r.live, h)
		}
	}
	return r, nil
}

// end is the end of a hold released now: the database's time of the read,
// or the lease's expiry as the holder knows it if that came first or the
// time is unknown (the key had no row: then the lease's own row was gone
// too, which violation reports).
func (r leaseRow) end(lease *lock.Lease) int64 {
	exp := lease.Expiry().UnixMicro()
	if r.now.IsZero() {
		return exp
	}
	return min(r.now.UnixMicro(), exp)
}

// violation returns what the read shows that breaks S1 by itself, or "":
// the lease's row gone while the expiry its holder knew (exp) was still ahead
// (in a stress case nothing may delete a live row: takeover and sweep
// delete expired rows, a release the holder's own; so the database either
// did not keep a grant it reported or deleted a live lease), or a live
// exclusive lease alongside another live lease of the key in one snapshot.
func (r leaseRow) violation(exp time.Time) string {
	var v []string
	if !r.found && !r.now.IsZero() && r.now.Before(exp) {
		v = append(v, fmt.Sprintf("its row was gone at %d, before the expiry %d its holder knew", r.now.UnixMicro(), exp.UnixMicro()))
	}
	for _, h := range r.live {
		if h.Mode == lock.Exclusive && len(r.live) > 1 {
			v = append(v, fmt.Sprintf("at %d the database held exclusive lease %s (token %d) and %d other live leases of the key: %v", r.now.UnixMicro(), h.LeaseID, h.Token, len(r.live)-1, r.live))
			break
		}
	}
	return strings.Join(v, "; ")
}

// describe says how a hold ended, for the grant log's detail: the lease ID
// and owner, how it ended, the expiry the holder knew (a renewal moved it
// past the grant's), the row's expiry in the database then ("gone" when it
// had no row) and the database time of that read, and the lease's error.
func (r leaseRow) describe(lease *lock.Lease, ended string) string {
	db := "gone"
	if r.found {
		db = fmt.Sprint(r.expiry.UnixMicro())
	}
	var now int64
	if !r.now.IsZero() {
		now = r.now.UnixMicro()
	}
	return fmt.Sprintf("lease=%s owner=%s end=%s exp=%d db_exp=%s db_now=%d err=%v",
		lease.LeaseID(), lease.Owner(), ended, lease.Expiry().UnixMicro(), db, now, lease.Err())
}

// joinErrs closes errs and joins what was sent on it.
func joinErrs(errs chan error) error {
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// RunStressWorkers runs spec.Workers workers against db. newLocker may be
// nil (lock.New).
func RunStressWorkers(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec, newLocker func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error)) error {
	return runStressWorkers(ctx, db, d, spec, newLocker, nil)
}

// runStressWorkers is RunStressWorkers; onShared, when not nil, is called
// with +1 once a shared lease is granted and with -1 before it is released
// or orphaned, so a case can count the shared holds in its process.
func runStressWorkers(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec, newLocker func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error), onShared func(delta int)) error {
	if onShared == nil {
		onShared = func(int) {}
	}
	if newLocker == nil {
		newLocker = lock.New
	}
	insert := grantInsertDetail(d, spec.LogTable)
	deadline := time.Now().Add(spec.Duration)
	var wg sync.WaitGroup
	errs := make(chan error, spec.Workers)
	for w := 0; w < spec.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker is its own holder (own Locker), as separate
			// replicas would be.
			restarts := 0
			start := func() (*lock.Locker, error) {
				restarts++
				return newLocker(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
					lock.WithTTL(spec.TTL), lock.WithoutSchemaCheck(), lock.WithMaxBackoff(20*time.Millisecond),
					lock.WithOwner(fmt.Sprintf("%s/%d/%d", spec.Worker, w, restarts)), lock.WithLogger(discard))
			}
			l, err := start()
			if err != nil {
				errs <- err
				return
			}
			defer func() { l.Close(context.Background()) }()
			for time.Now().Before(deadline) {
				key := fmt.Sprintf("stress/%d", rand.IntN(spec.Keys))
				mode := lock.Exclusive
				if rand.IntN(100) < spec.SharedPercent {
					mode = lock.Shared
				}
				opts := []lock.AcquireOption{lock.WaitTimeout(spec.WaitTimeout)}
				if rand.IntN(100) < spec.FIFOPercent {
					opts = append(opts, lock.FIFO())
				}
				if mode == lock.Shared && spec.Limit > 0 {
					opts = append(opts, lock.Limit(spec.Limit))
				}
				lease, err := l.Acquire(ctx, key, mode, opts...)
				if errors.Is(err, lock.ErrLocked) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("acquire: %w", err)
					return
				}
				acquired := lease.GrantedAt().UnixMicro()
				if mode == lock.Shared {
					onShared(1)
				}
				time.Sleep(time.Duration(rand.Int64N(int64(spec.Hold) + 1)))
				if mode == lock.Shared {
					onShared(-1)
				}
				crash := rand.IntN(100) < spec.CrashPercent
				released, detail, seen, err := endStressHold(ctx, l, lease, crash)
				if err != nil {
					errs <- err
					return
				}
				if crash {
					// The holder "crashed": the worker restarts as a new
					// holder.
					next, err := start()
					if err != nil {
						errs <- err
						return
					}
					l = next
				}
				if _, err := db.ExecContext(ctx, insert, key, lease.Token(), lease.Mode().String(), acquired, released, spec.Worker, detail, nullIfEmpty(seen)); err != nil {
					errs <- fmt.Errorf("log: %w", err)
					return
				}
				if lease.Err() != nil && !errors.Is(lease.Err(), lock.ErrReleased) && !errors.Is(lease.Err(), lock.ErrLeaseLost) {
					errs <- fmt.Errorf("unexpected lease end: %w", lease.Err())
					return
				}
			}
		}()
	}
	wg.Wait()
	return joinErrs(errs)
}

// endStressHold ends a stress worker's hold of lease: with crash, the
// holder "crashes" (Orphan: the lease is never renewed or released again
// and ends by expiry), else it is released. It returns the end of the hold
// for the grant log (a crashed lease's expiry: the one the holder knew, or
// its row's in the database read just after Orphan if a renewal in flight
// moved it later), the log's detail (leaseRow.describe) and what the
// database showed that breaks S1 by itself (leaseRow.violation).
func endStressHold(ctx context.Context, l *lock.Locker, lease *lock.Lease, crash bool) (released int64, detail, seen string, err error) {
	if crash {
		lease.Orphan()
		row, err := readRow(ctx, l, lease)
		if err != nil {
			return 0, "", "", err
		}
		released = lease.Expiry().UnixMicro()
		if row.found {
			released = max(released, row.expiry.UnixMicro())
		}
		return released, row.describe(lease, "orphaned"), row.violation(lease.Expiry()), nil
	}
	row, err := readRow(ctx, l, lease)
	if err != nil {
		return 0, "", "", err
	}
	ended := "released"
	if err := lease.Release(ctx); errors.Is(err, lock.ErrNotHeld) {
		ended = "released (not held)"
	} else if err != nil {
		return 0, "", "", fmt.Errorf("release: %w", err)
	}
	return row.end(lease), row.describe(lease, ended), row.violation(lease.Expiry()), nil
}

// nullIfEmpty is s, or NULL for "".
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Grant is one logged lease.
type Grant struct {
	Key                string
	Token              int64
	Mode               string
	Acquired, Released int64 // database microseconds
	Worker             string
	// Detail says how the hold ended (see leaseRow.describe); may be
	// empty.
	Detail string
	// Seen is what the holder saw in the database at the end of its hold
	// that breaks S1 by itself, whether or not another logged grant
	// overlaps it (see leaseRow.violation); "": nothing.
	Seen string
}

// ReadLog reads the grant log.
func ReadLog(ctx context.Context, db *sql.DB, table string) ([]Grant, error) {
	rows, err := db.QueryContext(ctx, `SELECT lock_key, token, mode, acquired_us, released_us, worker, detail, seen FROM `+table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Grant
	for rows.Next() {
		var g Grant
		var detail, seen sql.NullString
		if err := rows.Scan(&g.Key, &g.Token, &g.Mode, &g.Acquired, &g.Released, &g.Worker, &detail, &seen); err != nil {
			return nil, err
		}
		g.Detail, g.Seen = detail.String, seen.String
		out = append(out, g)
	}
	return out, rows.Err()
}

// CheckLog verifies S1 and S3 on a grant log: per key, no exclusive
// interval overlaps any other interval, no holder saw the database break S1
// (Grant.Seen), and ordered by token, grants
// never go back in time and tokens never repeat. It returns one line per
// violation (at most 20), with each grant's worker and detail.
func CheckLog(grants []Grant) []string {
	var bad []string
	byKey := map[string][]Grant{}
	for _, g := range grants {
		byKey[g.Key] = append(byKey[g.Key], g)
		if g.Seen != "" {
			bad = append(bad, fmt.Sprintf("S1 %s: %s token %d [%d,%d]: %s%s", g.Key, g.Mode, g.Token, g.Acquired, g.Released, g.Seen, g.about()))
		}
	}
	for key, gs := range byKey {
		sort.Slice(gs, func(i, j int) bool { return gs[i].Token < gs[j].Token })
		for i := range gs {
			if i > 0 && gs[i].Token == gs[i-1].Token {
				bad = append(bad, fmt.Sprintf("S3 %s: token %d granted twice", key, gs[i].Token))
			}
			if i > 0 && gs[i].Acquired < gs[i-1].Acquired {
				bad = append(bad, fmt.Sprintf("S3 %s: token %d granted at %d%s, before token %d at %d%s", key, gs[i].Token, gs[i].Acquired, gs[i].about(), gs[i-1].Token, gs[i-1].Acquired, gs[i-1].about()))
			}
			for j := i + 1; j < len(gs); j++ {
				a, b := gs[i], gs[j]
				if a.Mode != "exclusive" && b.Mode != "exclusive" {
					continue
				}
				if a.Acquired < b.Released && b.Acquired < a.Released {
					bad = append(bad, fmt.Sprintf("S1 %s: %s token %d [%d,%d]%s overlaps %s token %d [%d,%d]%s", key, a.Mode, a.Token, a.Acquired, a.Released, a.about(), b.Mode, b.Token, b.Acquired, b.Released, b.about()))
				}
			}
			if len(bad) >= 20 {
				return bad
			}
		}
	}
	return bad
}

// about is g's worker and detail for a violation's message.
func (g Grant) about() string {
	if g.Detail == "" {
		return fmt.Sprintf(" (worker %s)", g.Worker)
	}
	return fmt.Sprintf(" (worker %s, %s)", g.Worker, g.Detail)
}

// childCommand starts a child process doing spec's work: under go test it
// re-runs this test binary (only the case's top-level test), elsewhere
// os.Args. Its output is collected in the returned builder.
func childCommand(e *Env, spec StressSpec) (*exec.Cmd, *strings.Builder) {
	e.T.Helper()
	exe, err := os.Executable()
	e.Must(err, "executable")
	var args []string
	if testing.Testing() {
		top, _, _ := strings.Cut(e.T.Name(), "/")
		args = []string{"-test.run=^" + top + "$", "-test.count=1"}
	} else {
		args = os.Args[1:]
	}
	b, err := json.Marshal(spec)
	e.Must(err, "child spec")
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	e.Must(cmd.Start(), "start child")
	return cmd, out
}

// SpawnChildren starts n child processes doing spec's work (each its own
// worker name) and returns a function that waits for them and returns
// their combined error. Under go test the children re-run this test
// binary; elsewhere they re-run os.Args.
func SpawnChildren(e *Env, n int, spec StressSpec) (wait func() error) {
	e.T.Helper()
	type proc struct {
		cmd *exec.Cmd
		out *strings.Builder
	}
	var procs []proc
	for i := 0; i < n; i++ {
		s := spec
		s.Worker = fmt.Sprintf("proc%d", i)
		cmd, out := childCommand(e, s)
		procs = append(procs, proc{cmd, out})
	}
	return func() error {
		var errs []error
		for i, p := range procs {
			if err := p.cmd.Wait(); err != nil {
				errs = append(errs, fmt.Errorf("child %d: %v: %s", i, err, p.out.String()))
			}
		}
		return errors.Join(errs...)
	}
}

// runStress runs a multi-process contention case: it creates the grant log
// table, starts n children doing childSpec's work (LogTable set), runs
// inproc in this process meanwhile, waits for the children, and returns
// the log after reporting every S1/S3 violation CheckLog finds.
func runStress(e *Env, n int, childSpec StressSpec, inproc func(table string) error) []Grant {
	e.T.Helper()
	ctx := e.Ctx()
	table := e.Table("grants")
	e.Must(CreateLogTable(ctx, e.DB, table), "create log")
	childSpec.LogTable = table
	wait := SpawnChildren(e, n, childSpec)
	err := inproc(table)
	if cerr := wait(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	e.Must(err, "stress workers")
	grants, err := ReadLog(ctx, e.DB, table)
	e.Must(err, "read log")
	for _, line := range CheckLog(grants) {
		e.T.Errorf("%s", line)
	}
	return grants
}

// stressSpec is the part of a StressSpec that locates the case's database.
func (e *Env) stressSpec() StressSpec {
	return StressSpec{Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: e.Namespace}
}

// stressCase contends Workers goroutines plus 2 processes on 4 keys.
func stressCase(e *Env, sharedPercent, crashPercent int) {
	stressCaseFIFO(e, sharedPercent, crashPercent, 0)
}

// stressCaseFIFO is stressCase with fifoPercent of acquires in FIFO mode.
func stressCaseFIFO(e *Env, sharedPercent, crashPercent, fifoPercent int) {
	dur := 4 * time.Second
	if e.Config.Short {
		dur = 1500 * time.Millisecond
	}
	child := e.stressSpec()
	child.Workers, child.Keys, child.SharedPercent, child.CrashPercent, child.FIFOPercent = 4, 4, sharedPercent, crashPercent, fifoPercent
	child.Duration, child.TTL, child.Hold, child.WaitTimeout = dur, 400*time.Millisecond, 10*time.Millisecond, time.Second
	clkWatch(e)
	grants := runStress(e, 2, child, func(table string) error {
		spec := child
		spec.LogTable, spec.Worker, spec.Workers = table, "inproc", 16
		return RunStressWorkers(e.Ctx(), e.OpenDB(), e.Dialect, spec, e.Config.NewLocker)
	})
	perWorker := map[string]int{}
	modes := map[string]int{}
	for _, g := range grants {
		perWorker[g.Worker]++
		modes[g.Mode]++
	}
	e.T.Logf("%d grants: %v by mode, %v by worker", len(grants), modes, perWorker)
	// Unloaded, a run makes hundreds of grants. The bound only catches a
	// run that never contended: at load 15 and more, children under -race
	// spend most of a short run starting, and 16-19 grants were seen.
	if minGrants := 10; len(grants) < minGrants {
		e.T.Errorf("only %d grants in %s (want >= %d); the stress did not stress", len(grants), dur, minGrants)
	}
	for _, w := range []string{"inproc", "proc0", "proc1"} {
		e.Check(perWorker[w] != 0, "worker %s got no grant", w)
	}
	e.Check(sharedPercent <= 0 || modes["shared"] != 0 && modes["exclusive"] != 0, "want both modes granted, got %v", modes)
}
