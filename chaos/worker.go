package chaos

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"
	_ "modernc.org/sqlite"             // registers driver "sqlite" (pure Go)

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
)

// The churn loop's blocking acquires: WaitTimeout and context deadline.
const (
	acquireWait    = 2 * time.Second
	acquireContext = 3 * time.Second
)

// workerEnv names the environment variable that turns a process into a
// chaos worker; its value is the worker's spec as JSON.
const workerEnv = "SQLEASE_CHAOS_WORKER"

// Broken worker modes, for proving that the checker catches a misbehaving
// holder (Config.Broken).
const (
	// BrokenUnfenced: worker w0 orphans each lease it gets and keeps
	// writing to the ledger in plain, unfenced transactions for three TTLs.
	BrokenUnfenced = "unfenced"
	// BrokenPhantom: worker w0 claims leases it does not hold: it logs a
	// grant of another holder's live lease (same token) as its own.
	BrokenPhantom = "phantom"
)

// workerSpec is what the driver passes to a worker process.
type workerSpec struct {
	Name        string          `json:"name"`
	Incarnation int             `json:"inc"`
	Dialect     string          `json:"dialect"`
	DSN         string          `json:"dsn"`
	Schema      string          `json:"schema,omitempty"`
	Keys        []string        `json:"keys"`
	TTLs        []time.Duration `json:"ttls"` // one Locker per TTL
	MaxBackoff  time.Duration   `json:"max_backoff"`
	ProbeBound  time.Duration   `json:"probe_bound"` // a probe acquire's limit
	LogPath     string          `json:"log"`
	Broken      string          `json:"broken,omitempty"`
	// FailoverPause, when not 0, builds every Locker with
	// lock.WithFailoverPause(FailoverPause) (the promote fault's pause
	// mode).
	FailoverPause time.Duration `json:"failover_pause,omitempty"`
	Seed          uint64        `json:"seed"`
}

// IsWorker reports whether this process was started by Run as a chaos
// worker. A program that calls Run (a test binary's TestMain, the sqlease
// command) must call WorkerMain first thing when it does.
func IsWorker() bool { return os.Getenv(workerEnv) != "" }

// WorkerMain does a chaos worker's work (acquire, fenced ledger writes,
// release, until told to stop on stdin) and returns the process exit code:
// 0 when it was told to exit, 1 when it could not start.
func WorkerMain() int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker: bad %s: %v\n", workerEnv, err)
		return 1
	}
	if err := runWorker(spec); err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker %s: %v\n", spec.Name, err)
		return 1
	}
	return 0
}

func dialectOf(name string) (dialect.Dialect, string, error) {
	switch name {
	case "postgres":
		return pgdialect.New(), "pgx", nil
	case "sqlite":
		return sqlitedialect.New(), sqliteDriver(), nil
	}
	return nil, "", fmt.Errorf("chaos: dialect %q is not supported (allowed: postgres, sqlite)", name)
}

type worker struct {
	spec    workerSpec
	db      *sql.DB
	q       ledgerSQL
	log     *eventLog
	lockers []*lock.Locker
	rng     *rand.Rand
	writes  int
}

func runWorker(spec workerSpec) error {
	d, driver, err := dialectOf(spec.Dialect)
	if err != nil {
		return err
	}
	q, err := newLedgerSQL(spec.Dialect, spec.Schema)
	if err != nil {
		return err
	}
	el, err := openEventLog(spec.LogPath, spec.Name, spec.Incarnation)
	if err != nil {
		return err
	}
	defer el.close()
	db, err := sql.Open(driver, spec.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	if spec.Dialect == "postgres" {
		db.SetMaxOpenConns(8)
	}
	w := &worker{spec: spec, db: db, q: q, log: el, rng: rand.New(rand.NewPCG(spec.Seed, uint64(spec.Incarnation)))}
	start := event{Ev: evStart}
	if spec.Dialect == "postgres" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = db.QueryRowContext(ctx, `SHOW default_transaction_isolation`).Scan(&start.Iso)
		cancel()
	}
	el.log(start)
	// Engine warnings go to stderr, which the driver keeps in a file.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i, ttl := range spec.TTLs {
		var l *lock.Locker
		// The database may be restarting or cut off: keep trying.
		deadline := time.Now().Add(60 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			opts := []lock.Option{lock.WithTTL(ttl), lock.WithMaxBackoff(spec.MaxBackoff),
				lock.WithOwner(fmt.Sprintf("%s.%d.%d", spec.Name, spec.Incarnation, i)), lock.WithLogger(logger.With("locker", i))}
			if spec.Schema != "" {
				opts = append(opts, lock.WithSchema(spec.Schema))
			}
			if spec.FailoverPause > 0 {
				opts = append(opts, lock.WithFailoverPause(spec.FailoverPause))
			}
			l, err = lock.New(ctx, db, d, opts...)
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("locker %d: %w", i, err)
		}
		w.lockers = append(w.lockers, l)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, l := range w.lockers {
			_ = l.Close(ctx)
		}
	}()

	// Commands come on stdin, one per line; replies go to stdout.
	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	reply := func(s string) { fmt.Fprintln(os.Stdout, s) }

	churnCtx, stopChurn := context.WithCancel(context.Background())
	var churnDone sync.WaitGroup
	churnDone.Add(1)
	go func() {
		defer churnDone.Done()
		w.churn(churnCtx)
	}()
	reply("ready")
	for cmd := range cmds {
		switch cmd {
		case "quiesce":
			stopChurn()
			churnDone.Wait()
			el.log(event{Ev: evIdle})
			reply("idle")
		case "probe":
			stopChurn()
			churnDone.Wait()
			w.probe()
			reply("probed")
		case "exit":
			stopChurn()
			churnDone.Wait()
			return nil
		}
	}
	// The driver is gone.
	stopChurn()
	churnDone.Wait()
	return nil
}

func modeName(m lock.Mode) string {
	if m == lock.Exclusive {
		return "x"
	}
	return "s"
}

// churn loops acquire → fenced writes → release until ctx ends.
func (w *worker) churn(ctx context.Context) {
	for ctx.Err() == nil {
		li := w.rng.IntN(len(w.lockers))
		key := w.spec.Keys[w.rng.IntN(len(w.spec.Keys))]
		mode := lock.Exclusive
		if w.rng.IntN(100) < 40 {
			mode = lock.Shared
		}
		switch {
		case w.spec.Broken == BrokenPhantom && w.rng.IntN(2) == 0:
			w.phantom(ctx, li, key)
		default:
			w.cycle(ctx, li, key, mode)
		}
		sleepCtx(ctx, time.Duration(w.rng.IntN(20))*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lock.ErrReentrant):
		return "reentrant"
	case errors.Is(err, lock.ErrLocked):
		return "locked"
	case errors.Is(err, lock.ErrLeaseLost):
		return "lost"
	case errors.Is(err, lock.ErrNotHeld):
		return "not_held"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	}
	return "error"
}

// pauseRefusal reports whether err is a refusal naming the failover pause
// of a new primary (lock.FailoverPause) among the holders.
func pauseRefusal(err error) bool {
	var le *lock.LockedError
	if !errors.As(err, &le) {
		return false
	}
	for _, h := range le.Holders {
		if h.Mode == lock.FailoverPause {
			return true
		}
	}
	return false
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// cycle is one acquire → 1..3 fenced writes → release.
func (w *worker) cycle(ctx context.Context, li int, key string, mode lock.Mode) {
	l := w.lockers[li]
	ttl := l.TTL()
	actx, cancel := context.WithTimeout(ctx, acquireContext)
	start := time.Now()
	le, err := l.Acquire(actx, key, mode, lock.WaitTimeout(acquireWait))
	cancel()
	if err != nil {
		class := errClass(err)
		if class == "reentrant" && w.spec.Broken == BrokenUnfenced {
			class = "reentrant-orphaned" // it orphaned its last lease of the key
		}
		// A refusal for the failover pause of a new primary is an
		// ordinary refusal (class locked, no backoff), marked Pause.
		w.log.log(event{Ev: evAcquireErr, Locker: li, Key: key, Mode: modeName(mode), Class: class, Err: errText(err), WaitMS: time.Since(start).Milliseconds(), Pause: pauseRefusal(err)})
		if ctx.Err() == nil && !errors.Is(err, lock.ErrLocked) {
			sleepCtx(ctx, 50*time.Millisecond)
		}
		return
	}
	base := event{Locker: li, Key: key, Mode: modeName(mode), Lease: le.LeaseID(), Token: le.Token(), TTLMS: ttl.Milliseconds()}
	g := base
	g.Ev, g.Granted, g.Expiry, g.WaitMS = evGrant, le.GrantedAt().UnixMicro(), le.Expiry().UnixMicro(), time.Since(start).Milliseconds()
	w.log.log(g)
	lastExpiry := le.Expiry()

	if w.spec.Broken == BrokenUnfenced {
		w.unfenced(ctx, le, base)
		return
	}
	lost := false
	// signal asks the engine whether the lease is still held and logs the
	// answer: a loss signal, or evHeld stamped with the time before it
	// asked (so a "held" answer stamped after a stop was given after it).
	// It reports whether the lease must no longer be used.
	signal := func() bool {
		asked := time.Now().UnixNano()
		if exp := le.Expiry(); exp.After(lastExpiry) {
			lastExpiry = exp
			e := base
			e.Ev, e.Expiry = evRenewed, exp.UnixMicro()
			w.log.log(e)
		}
		if err := le.Err(); err != nil && errors.Is(err, lock.ErrLeaseLost) {
			e := base
			e.Ev, e.Err = evLost, errText(err)
			w.log.log(e)
			return true
		}
		if le.Remaining() == 0 {
			e := base
			e.Ev = evWindowEnded
			w.log.log(e)
			return true
		}
		e := base
		e.Ev, e.T = evHeld, asked
		w.log.log(e)
		return false
	}
	n := 1 + w.rng.IntN(3)
	// Half the holds are quick (more grants and contention), half dwell
	// up to TTL/4 between writes (so stops and renewals fall inside).
	dwell := ttl / 4
	if w.rng.IntN(2) == 0 {
		dwell = 0
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		if dwell > 0 {
			sleepCtx(ctx, time.Duration(w.rng.Int64N(int64(dwell))))
		}
		// Ask even when ctx ended (quiesce): every release follows an
		// answer, which the loss-signal check relies on.
		if signal() {
			lost = true
			break
		}
		if ctx.Err() != nil {
			break
		}
		w.writes++
		id := fmt.Sprintf("%s.%d.%d", w.spec.Name, w.spec.Incarnation, w.writes)
		var gotN, at int64
		// One write in four dwells inside its transaction (up to TTL/4),
		// so stops also land inside fenced transactions.
		var inTx time.Duration
		if w.rng.IntN(4) == 0 {
			inTx = time.Duration(w.rng.Int64N(int64(ttl / 4)))
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := le.RunInTx(wctx, w.db, nil, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			gotN, at, err = w.q.writeLedger(ctx, tx, ledgerRow{WriteID: id, Key: key, Token: le.Token(), Lease: le.LeaseID(), Worker: w.spec.Name, Mode: modeName(mode)})
			if err == nil && inTx > 0 {
				sleepCtx(ctx, inTx)
			}
			return err
		})
		cancel()
		e := base
		e.WriteID = id
		switch {
		case err == nil:
			e.Ev, e.N, e.At = evAck, gotN, at
			w.log.log(e)
		case errors.Is(err, lock.ErrLeaseLost):
			e.Ev, e.Err = evWriteLost, errText(err)
			w.log.log(e)
			lost = true
		default:
			e.Ev, e.Class, e.Err = evWriteErr, errClass(err), errText(err)
			w.log.log(e)
		}
		if lost {
			break
		}
	}
	if !lost {
		lost = signal()
	}
	e := base
	e.Ev = evReleasing
	w.log.log(e)
	err = le.Release(context.Background())
	e.Ev, e.Class, e.Err = evReleased, errClass(err), errText(err)
	w.log.log(e)
	if cause := le.Err(); cause != nil && errors.Is(cause, lock.ErrLeaseLost) && !lost {
		e.Ev, e.Class, e.Err = evLost, "", errText(cause)
		w.log.log(e)
	}
}

// unfenced is the broken worker of BrokenUnfenced: it stops renewing the
// lease and keeps writing, unfenced, past its expiry.
func (w *worker) unfenced(ctx context.Context, le *lock.Lease, base event) {
	le.Orphan()
	end := time.Now().Add(3 * le.Remaining())
	if le.Remaining() == 0 {
		end = time.Now().Add(time.Second)
	}
	for time.Now().Before(end) && ctx.Err() == nil {
		w.writes++
		id := fmt.Sprintf("%s.%d.%d", w.spec.Name, w.spec.Incarnation, w.writes)
		var gotN, at int64
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		tx, err := w.db.BeginTx(wctx, nil)
		if err == nil {
			gotN, at, err = w.q.writeLedger(wctx, tx, ledgerRow{WriteID: id, Key: base.Key, Token: base.Token, Lease: base.Lease, Worker: w.spec.Name, Mode: base.Mode})
			if err == nil {
				err = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
		cancel()
		e := base
		e.WriteID, e.Unfenced = id, true
		if err == nil {
			e.Ev, e.N, e.At = evAck, gotN, at
		} else {
			e.Ev, e.Class, e.Err = evWriteErr, errClass(err), errText(err)
		}
		w.log.log(e)
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// phantom is the broken worker of BrokenPhantom: it claims a live lease of
// another holder as its own grant.
func (w *worker) phantom(ctx context.Context, li int, key string) {
	l := w.lockers[li]
	end := time.Now().Add(2 * time.Second)
	for ctx.Err() == nil && time.Now().Before(end) {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		hs, now, err := l.Holders(hctx, key)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "phantom: holders: %v\n", err)
			return
		}
		for _, h := range hs {
			if h.Key != key || h.Mode == lock.PendingWriter || !h.Expiry.After(now) {
				continue
			}
			e := event{Ev: evGrant, Locker: li, Key: key, Mode: "x", Lease: "phantom-" + h.LeaseID, Token: h.Token,
				TTLMS: l.TTL().Milliseconds(), Granted: now.UnixMicro(), Expiry: now.Add(l.TTL()).UnixMicro(), Phantom: true}
			w.log.log(e)
			sleepCtx(ctx, l.TTL()/3)
			e.Ev = evReleasing
			w.log.log(e)
			e.Ev, e.Class = evReleased, "ok"
			w.log.log(e)
			return
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// probe acquires every key with every Locker, one at a time, each within
// the probe bound: the longest TTL plus one backoff step plus a grace
// (liveness after faults).
func (w *worker) probe() {
	for li, l := range w.lockers {
		bound := w.spec.ProbeBound
		for _, key := range w.spec.Keys {
			ctx, cancel := context.WithTimeout(context.Background(), bound+time.Second)
			start := time.Now()
			var le *lock.Lease
			var err error
			for {
				// ErrReentrant is retried within the bound: the undo of an
				// acquire abandoned at quiesce may still be running.
				le, err = l.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(max(bound-time.Since(start), time.Millisecond)))
				if !errors.Is(err, lock.ErrReentrant) || time.Since(start) > bound {
					break
				}
				sleepCtx(ctx, 20*time.Millisecond)
			}
			wait := time.Since(start)
			cancel()
			e := event{Ev: evProbe, Locker: li, Key: key, Mode: "x", TTLMS: l.TTL().Milliseconds(), WaitMS: wait.Milliseconds(), Class: errClass(err), Err: errText(err)}
			if err == nil {
				e.OK, e.Lease, e.Token, e.Granted, e.Expiry = wait <= bound, le.LeaseID(), le.Token(), le.GrantedAt().UnixMicro(), le.Expiry().UnixMicro()
				w.log.log(e)
				re := event{Ev: evReleasing, Locker: li, Key: key, Mode: "x", Lease: le.LeaseID(), Token: le.Token()}
				w.log.log(re)
				rerr := le.Release(context.Background())
				re.Ev, re.Class, re.Err = evReleased, errClass(rerr), errText(rerr)
				w.log.log(re)
				continue
			}
			w.log.log(e)
		}
	}
}

// sqliteDriver is the database/sql driver of the SQLite runs: mattn's
// "sqlite3" when the program registered it (the chaos tests do in cgo
// builds: modernc.org/sqlite is compiled Go, which the race detector slows
// too much for the suite's timing), else modernc's "sqlite" (pure Go, what
// the sqlease command uses). Workers re-execute the same binary, so they
// pick the same driver.
func sqliteDriver() string {
	if slices.Contains(sql.Drivers(), "sqlite3") {
		return "sqlite3"
	}
	return "sqlite"
}
