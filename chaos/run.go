package chaos

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/pgcluster"
	"github.com/sqlease/sqlease/migrate"
)

// Fault kinds, as counted in Report.Faults and named in Config.Faults.
const (
	FaultKill      = "kill"      // SIGKILL a worker, restart it after 100-500 ms
	FaultStop      = "stop"      // SIGSTOP a worker for 100 ms to 2 x the longest TTL, then SIGCONT
	FaultTerminate = "terminate" // pg_terminate_backend of workers' backends (PostgreSQL)
	FaultLatency   = "latency"   // the TCP proxy delays every chunk by 50-400 ms for 0.5-2.5 s (PostgreSQL)
	FaultCut       = "cut"       // the TCP proxy closes every open connection (PostgreSQL)
	FaultRestart   = "restart"   // restart of the private cluster: fast (SIGINT) or immediate (SIGQUIT) shutdown, then start (PostgreSQL)
	// FaultPromote fails the private cluster over to its asynchronous hot
	// standby, once per run: replication is cut, the primary goes on
	// granting (more than 100 grants that the standby never sees), then it
	// is killed, the standby is promoted and the workers' proxy is
	// re-pointed at it, its open connections cut (PostgreSQL, opt-in).
	FaultPromote = "promote"
)

// Modes of the promote fault (Config.PromoteMode).
const (
	// PromoteAsync: the standby streams asynchronously and the workers
	// have no failover pause; overlaps of a lost lease with a lease of the
	// new primary are counted, not S1 violations (the residual risk of an
	// asynchronous promotion), and acknowledged writes after the standby
	// last caught up may be lost.
	PromoteAsync = "async"
	// PromotePause: as PromoteAsync, but every worker's Locker is built
	// with lock.WithFailoverPause(MaxTTL), so the promoted standby grants
	// nothing until MaxTTL after it is first seen: every overlap across
	// the promotion is an S1 violation.
	PromotePause = "pause"
	// PromoteSync: the primary waits for its standby (synchronous_commit
	// on); replication is not cut, the primary is killed while the
	// standby is connected. Every overlap across the promotion is an S1
	// violation, every acknowledged write missing from the new primary is
	// a violation, and so is every lease live at the kill that the new
	// primary does not have (RuleLostGrant).
	PromoteSync = "sync"
)

// DefaultFaults lists the fault kinds a run injects when Config.Faults is
// nil (those its dialect supports). FaultPromote is not among them: it
// needs a standby, and it loses acknowledged commits by design (see
// Report.Promotion).
var DefaultFaults = []string{FaultKill, FaultStop, FaultTerminate, FaultLatency, FaultCut, FaultRestart}

// AllFaults lists every fault kind.
var AllFaults = append(append([]string(nil), DefaultFaults...), FaultPromote)

// Short and long forms of a run's fault phase.
const (
	// ShortDuration is the fault phase of the short form (CI): with setup,
	// quiesce and probes a run takes about a minute.
	ShortDuration = 40 * time.Second
	// MinTTL and MaxTTL bound the workers' lease TTLs.
	MinTTL = 300 * time.Millisecond
	MaxTTL = 2 * time.Second
)

// Config describes one chaos run. The zero value of each field means its
// default.
type Config struct {
	// Dialect is "sqlite" or "postgres".
	Dialect string
	// Duration is the length of the fault phase (default ShortDuration;
	// at least 5s).
	Duration time.Duration
	// Workers is the number of worker processes (default 4, 2..32).
	Workers int
	// Keys is the number of lock keys the workers contend on (default 3,
	// 1..64).
	Keys int
	// Lockers is the number of Lockers per worker, each with its own TTL
	// in MinTTL..MaxTTL (default 2, 1..8).
	Lockers int
	// Faults lists the fault kinds to inject (default: DefaultFaults, the
	// kinds the dialect supports; SQLite: kill and stop). Kinds that cannot
	// run here are skipped with a reason in Report.Skipped. FaultPromote
	// (PostgreSQL private cluster only) is opt-in.
	Faults []string
	// PromoteMode is the mode of the promote fault: PromoteAsync (the
	// default), PromotePause or PromoteSync.
	PromoteMode string
	// Seed makes the schedule of faults and workers' choices repeatable
	// (default: random; the report prints it).
	Seed uint64
	// Dir keeps the run's files (worker logs, SQLite database, driver
	// log). Default: a temporary directory, removed after a clean run.
	Dir string
	// PostgresDSN is used for PostgreSQL only when no private cluster can
	// be started here (no server binaries or no OS user postgres); the run
	// then uses a fresh schema there, removed afterwards, and skips the
	// restart fault. Never restarted.
	PostgresDSN string
	// MaxBackoff is the workers' WithMaxBackoff (default 200ms).
	MaxBackoff time.Duration
	// ProbeGrace is added to MaxTTL (the longest a leftover lease of a
	// killed worker blocks a key) plus MaxBackoff to bound a liveness
	// probe, for a loaded machine (default 1.5s).
	ProbeGrace time.Duration
	// Isolation is the default transaction isolation of the workers'
	// PostgreSQL sessions (default_transaction_isolation): "read
	// committed", "repeatable read", "serializable", or "mixed" (the
	// default: worker i gets the (i mod 3)th of those), for rule S6.
	Isolation string
	// Broken makes worker w0 misbehave (BrokenUnfenced, BrokenPhantom),
	// to prove that the checker fails; "" for none.
	Broken string
	// Log receives progress lines (default: none).
	Log io.Writer
}

// Report is the outcome of a run.
type Report struct {
	Dialect    string
	Isolation  string // PostgreSQL only
	Seed       uint64
	Length     time.Duration // whole run, setup to check
	FaultPhase time.Duration
	Workers    int
	Lockers    int
	Keys       int
	// Grants is the number of grants checked; Writes the ledger rows;
	// Acked the acknowledged writes; StopsChecked the leases held across
	// a stop longer than their TTL; Probes the liveness acquires.
	Grants, Writes, Acked, StopsChecked, Probes int
	// MaxBackoff and ProbeGrace are the liveness bound beyond the longest
	// TTL, MaxTTL (Config.MaxBackoff, Config.ProbeGrace).
	MaxBackoff, ProbeGrace time.Duration
	// Faults counts injected faults by kind; Skipped gives the reason for
	// each kind that could not run.
	Faults  map[string]int
	Skipped map[string]string
	// AcquireErrors and ReleaseErrors count failed calls by class
	// (locked, reentrant, lost, not_held, context, error).
	AcquireErrors, ReleaseErrors map[string]int
	// Violations lists broken rules (details capped at 25 per rule);
	// ViolationsByRule counts all of them.
	Violations       []Violation
	ViolationsByRule map[string]int
	// Stuck lists the keys not acquired in the liveness phase.
	Stuck []string
	// Problems are driver-side troubles (a worker that exited by itself,
	// a fault that failed): not violations, but worth reading.
	Problems []string
	// Promotion is what the promote fault did and what the checker found
	// across it (nil when no promotion happened).
	Promotion *PromotionReport
	// Dir is where the run's files are ("" when removed).
	Dir string
}

// PromotionReport describes the run's failover to the standby (the
// promote fault) and what the history shows across it.
type PromotionReport struct {
	// Mode is Config.PromoteMode.
	Mode string
	// Synced: the standby had replayed everything the primary had
	// acknowledged before this instant (zero when WaitCaughtUp failed);
	// Cut: replication was cut; Killed: the primary was killed;
	// Switched: the standby was promoted and the proxy re-pointed at it
	// (local wall clock, the database's clock too: same machine).
	Synced, Cut, Killed, Switched time.Time
	// GrantsLost is the number of grants the old primary made after the
	// cut (the standby never saw them); AckedLost the acknowledged writes
	// missing on the new primary, acknowledged after Synced (lost with the
	// promotion, not violations).
	GrantsLost, AckedLost int
	// TokensCompared is the number of grants after the promotion whose
	// token was compared with the greatest token granted on its key
	// before it (S7); S7 counts those that did not exceed it.
	TokensCompared, S7 int
	// Refused is the number of fenced writes refused (ErrLeaseLost) after
	// the switch to holders of leases granted before it.
	Refused int
	// Overlaps counts pairs of conflicting leases, one granted before the
	// promotion and one after, that overlapped (the holder of a lease the
	// new primary never saw, or whose renewal it never saw, kept trusting
	// it until its next renewal or its expiry): the residual risk of an
	// asynchronous promotion, not S1 violations. LongestOverlap is the
	// longest of them.
	Overlaps       int
	LongestOverlap time.Duration
	// S1 counts the S1 violations across the promotion: overlaps in the
	// pause and sync modes (where none may happen), and in every mode
	// those where the promoted standby had the earlier lease's row live.
	S1 int
	// LiveChecked is the number of leases live at the kill (granted, not
	// released, their last acknowledged expiry past it) looked up on the
	// promoted standby before any worker reached it; LiveLost those it did
	// not have (violations in the sync mode only).
	LiveChecked, LiveLost int
	// PauseRefusals counts the acquires refused for the failover pause
	// (ErrLocked with a holder of mode lock.FailoverPause), logged as
	// ordinary refusals.
	PauseRefusals int
	// ClockTokens reports whether every token granted after the promotion
	// is at least the database clock in µs at its grant (the hybrid-clock
	// tokens that make S7 hold).
	ClockTokens bool
}

// ViolationCount is the number of violations found.
func (r *Report) ViolationCount() int {
	n := 0
	for _, c := range r.ViolationsByRule {
		n += c
	}
	return n
}

// OK reports whether the run found no violation and no stuck key.
func (r *Report) OK() bool { return r.ViolationCount() == 0 && len(r.Stuck) == 0 }

// String formats the report's figures, one per line.
func (r *Report) String() string {
	var b strings.Builder
	iso := ""
	if r.Isolation != "" {
		iso = " (isolation: " + r.Isolation + ")"
	}
	fmt.Fprintf(&b, "chaos %s%s: run %v (faults %v), %d workers x %d lockers, %d keys, seed %d\n",
		r.Dialect, iso, r.Length.Round(100*time.Millisecond), r.FaultPhase.Round(100*time.Millisecond), r.Workers, r.Lockers, r.Keys, r.Seed)
	fmt.Fprintf(&b, "  grants checked %d, ledger writes %d (acknowledged %d), stops past the TTL checked %d\n",
		r.Grants, r.Writes, r.Acked, r.StopsChecked)
	fmt.Fprintf(&b, "  liveness probes %d, each bounded by the longest TTL (%v) + one backoff step (%v) + grace (%v)\n", r.Probes, MaxTTL, r.MaxBackoff, r.ProbeGrace)
	total := 0
	for _, n := range r.Faults {
		total += n
	}
	fmt.Fprintf(&b, "  faults injected %d: %s\n", total, fmtCounts(r.Faults))
	for _, k := range sortedKeys(r.Skipped) {
		fmt.Fprintf(&b, "  skipped fault %s: %s\n", k, r.Skipped[k])
	}
	fmt.Fprintf(&b, "  acquire errors: %s; release errors: %s\n", fmtCounts(r.AcquireErrors), fmtCounts(r.ReleaseErrors))
	fmt.Fprintf(&b, "  violations %d (%s), stuck keys %d\n", r.ViolationCount(), fmtCounts(r.ViolationsByRule), len(r.Stuck))
	if len(r.Violations) < r.ViolationCount() {
		fmt.Fprintf(&b, "  (the first %d violations of each rule follow)\n", maxDetails)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  violation %s\n", v)
	}
	for _, s := range r.Stuck {
		fmt.Fprintf(&b, "  stuck %s\n", s)
	}
	if p := r.Promotion; p != nil {
		synced := "the standby not known to have caught up"
		if !p.Synced.IsZero() {
			synced = fmt.Sprintf("%v after the standby caught up", p.Cut.Sub(p.Synced).Round(time.Millisecond))
		}
		if p.Mode == PromoteSync {
			fmt.Fprintf(&b, "  promotion (mode %s): synchronous standby connected (%v after the last catch-up check), primary killed, standby serving %v after the kill\n",
				p.Mode, p.Killed.Sub(p.Synced).Round(time.Millisecond), p.Switched.Sub(p.Killed).Round(time.Millisecond))
		} else {
			fmt.Fprintf(&b, "  promotion (mode %s): replication cut (%s), primary killed %v later, standby serving %v after the kill\n",
				p.Mode, synced, p.Killed.Sub(p.Cut).Round(time.Millisecond), p.Switched.Sub(p.Killed).Round(time.Millisecond))
		}
		fmt.Fprintf(&b, "  promotion: grants lost %d, acknowledged writes lost %d, live leases lost %d of %d, tokens compared %d, S7 violations %d (clock tokens: %v), fenced writes refused %d, overlaps across the promotion %d (longest %v), S1 violations across it %d, failover-pause refusals %d\n",
			p.GrantsLost, p.AckedLost, p.LiveLost, p.LiveChecked, p.TokensCompared, p.S7, p.ClockTokens, p.Refused, p.Overlaps, p.LongestOverlap.Round(time.Millisecond), p.S1, p.PauseRefusals)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "  problem: %s\n", p)
	}
	if r.Dir != "" {
		fmt.Fprintf(&b, "  files kept in %s\n", r.Dir)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// ErrInvalidConfig matches every error Run returns for a bad Config.
var ErrInvalidConfig = errors.New("chaos: invalid config")

func configErr(field, value, allowed string) error {
	return fmt.Errorf("%w: %s %s (allowed: %s)", ErrInvalidConfig, field, value, allowed)
}

func (c *Config) fill() error {
	switch c.Dialect {
	case "postgres", "sqlite":
	default:
		return configErr("dialect", fmt.Sprintf("%q", c.Dialect), "postgres, sqlite")
	}
	if c.Duration == 0 {
		c.Duration = ShortDuration
	}
	if c.Duration < 5*time.Second || c.Duration > 24*time.Hour {
		return configErr("duration", c.Duration.String(), "5s..24h")
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Workers < 2 || c.Workers > 32 {
		return configErr("workers", fmt.Sprint(c.Workers), "2..32")
	}
	if c.Keys == 0 {
		c.Keys = 3
	}
	if c.Keys < 1 || c.Keys > 64 {
		return configErr("keys", fmt.Sprint(c.Keys), "1..64")
	}
	if c.Lockers == 0 {
		c.Lockers = 2
	}
	if c.Lockers < 1 || c.Lockers > 8 {
		return configErr("lockers", fmt.Sprint(c.Lockers), "1..8")
	}
	if c.Faults == nil {
		c.Faults = DefaultFaults
		if c.Dialect == "sqlite" {
			c.Faults = []string{FaultKill, FaultStop}
		}
	}
	for _, f := range c.Faults {
		ok := false
		for _, a := range AllFaults {
			ok = ok || f == a
		}
		if !ok {
			return configErr("fault", fmt.Sprintf("%q", f), strings.Join(AllFaults, ", "))
		}
	}
	switch c.Isolation {
	case "":
		c.Isolation = "mixed"
	case "mixed", "read committed", "repeatable read", "serializable":
	default:
		return configErr("isolation", fmt.Sprintf("%q", c.Isolation), `"read committed", "repeatable read", "serializable", "mixed"`)
	}
	switch c.PromoteMode {
	case "":
		c.PromoteMode = PromoteAsync
	case PromoteAsync, PromotePause, PromoteSync:
	default:
		return configErr("promote mode", fmt.Sprintf("%q", c.PromoteMode), strings.Join([]string{PromoteAsync, PromotePause, PromoteSync}, ", "))
	}
	switch c.Broken {
	case "", BrokenUnfenced, BrokenPhantom:
	default:
		return configErr("broken mode", fmt.Sprintf("%q", c.Broken), `"", unfenced, phantom`)
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 200 * time.Millisecond
	}
	if c.ProbeGrace == 0 {
		c.ProbeGrace = 1500 * time.Millisecond
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return nil
}

// proc is one incarnation of a worker process.
type proc struct {
	name      string
	inc       int
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	replies   chan string
	exited    chan struct{}
	killed    bool // by the driver
	stopped   bool
	stopStart int64
}

// driver runs one chaos run.
type driver struct {
	cfg     Config
	dir     string
	rngMu   sync.Mutex
	rng     *rand.Rand
	report  *Report
	exe     string
	args    []string
	spec    workerSpec // template
	ttls    map[string][]time.Duration
	faultCh chan struct{} // closed when the fault phase ends

	mu       sync.Mutex
	procs    map[string]*proc
	stops    []stopFault
	problems []string
	bg       sync.WaitGroup
	probers  map[string]bool
	faultLog *os.File

	// PostgreSQL
	cluster *pgcluster.Cluster // the primary (the promoted standby after the promote fault)
	standby *pgcluster.Cluster // for the promote fault
	px      *pgcluster.Proxy
	adminMu sync.Mutex
	admin   *sql.DB    // to the primary (adminDB)
	restart sync.Mutex // held by a restart or a promotion of the cluster

	promotions []promotion // under mu
	latency    sync.Mutex
}

// adminDB returns the driver's pool to the primary.
func (d *driver) adminDB() *sql.DB {
	d.adminMu.Lock()
	defer d.adminMu.Unlock()
	return d.admin
}

// intN, int64N and uint64 draw from the run's seeded generator.
func (d *driver) intN(n int) int {
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	return d.rng.IntN(n)
}

func (d *driver) int64N(n int64) int64 {
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	return d.rng.Int64N(n)
}

func (d *driver) uint64() uint64 {
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	return d.rng.Uint64()
}

func (d *driver) logf(format string, args ...any) {
	fmt.Fprintf(d.cfg.Log, "chaos: "+format+"\n", args...)
}

func (d *driver) problem(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.problems) < 50 {
		d.problems = append(d.problems, fmt.Sprintf(format, args...))
	}
}

func (d *driver) count(kind string) { d.record(kind, "", 0) }

// record counts one injected fault and logs it (logFault).
func (d *driver) record(kind, target string, dur time.Duration) {
	d.mu.Lock()
	d.report.Faults[kind]++
	d.mu.Unlock()
	d.logFault(kind, target, dur)
}

// logFault appends an event of the fault schedule to faults.jsonl in the
// run's directory (target: the worker, if any; dur: how long it lasts).
func (d *driver) logFault(kind, target string, dur time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.faultLog == nil {
		d.faultLog, _ = os.OpenFile(filepath.Join(d.dir, "faults.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	}
	if d.faultLog != nil {
		b, _ := json.Marshal(map[string]any{"t": time.Now().UnixNano(), "fault": kind, "target": target, "dur_ms": dur.Milliseconds()})
		_, _ = d.faultLog.Write(append(b, '\n'))
	}
}

// Run runs the chaos suite once: it sets up the database (a SQLite file,
// or a private PostgreSQL cluster behind a TCP proxy), starts cfg.Workers
// worker processes, injects faults for cfg.Duration, stops the faults,
// probes liveness, and checks the recorded history. Workers re-execute
// this program: the program must call WorkerMain when IsWorker reports
// true (a test binary in its TestMain).
//
// When ctx ends, the fault phase ends early and the run finishes in order
// (quiesce, probes, check). It returns the report (violations are in the
// report, not an error);
// errors are a bad Config (ErrInvalidConfig) or a setup that failed.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	start := time.Now()
	d := &driver{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 1)), procs: map[string]*proc{}, ttls: map[string][]time.Duration{}}
	d.report = &Report{Dialect: cfg.Dialect, Seed: cfg.Seed, Workers: cfg.Workers, Lockers: cfg.Lockers, Keys: cfg.Keys,
		MaxBackoff: cfg.MaxBackoff, ProbeGrace: cfg.ProbeGrace,
		Faults: map[string]int{}, Skipped: map[string]string{}, AcquireErrors: map[string]int{}, ReleaseErrors: map[string]int{}}
	if cfg.Dialect == "postgres" {
		d.report.Isolation = cfg.Isolation
		if cfg.Isolation == "mixed" {
			d.report.Isolation = "mixed: w0 " + isolations[0] + ", w1 " + isolations[1] + ", w2 " + isolations[2] + ", ..."
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	d.exe = exe
	if testing.Testing() {
		d.args = []string{"-test.run=^$"}
	}
	keep := cfg.Dir != ""
	if keep {
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, err
		}
		d.dir = cfg.Dir
	} else if d.dir, err = os.MkdirTemp("", "sqlease-chaos-"); err != nil {
		return nil, err
	}
	cleanup, err := d.setup(ctx)
	defer func() {
		if cleanup != nil {
			cleanup()
		}
	}()
	if err != nil {
		if !keep {
			os.RemoveAll(d.dir)
		}
		return nil, err
	}
	if err := d.run(ctx); err != nil {
		d.killAll()
		return nil, err
	}
	// A cancelled ctx only cut the fault phase short: the history is
	// still checked.
	err = d.check(context.WithoutCancel(ctx))
	if d.faultLog != nil {
		d.faultLog.Close()
	}
	if err != nil {
		return nil, err
	}
	d.report.Length = time.Since(start)
	d.report.Problems = d.problems
	if keep || !d.report.OK() {
		d.report.Dir = d.dir
	} else {
		os.RemoveAll(d.dir)
	}
	return d.report, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// setup prepares the database and the ledger, and returns what undoes it.
func (d *driver) setup(ctx context.Context) (cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	enabled := map[string]bool{}
	for _, f := range d.cfg.Faults {
		enabled[f] = true
	}
	if !signalsSupported {
		for _, f := range []string{FaultStop} {
			if enabled[f] {
				d.report.Skipped[f] = "SIGSTOP/SIGCONT are not available on this OS"
			}
		}
	}
	var adminDSN, workerDSN, schema string
	dl, driverName, _ := dialectOf(d.cfg.Dialect)
	switch d.cfg.Dialect {
	case "sqlite":
		for _, f := range []string{FaultTerminate, FaultLatency, FaultCut, FaultRestart, FaultPromote} {
			if enabled[f] {
				d.report.Skipped[f] = "no server connection on SQLite (several processes share one WAL file)"
			}
		}
		path := filepath.Join(d.dir, "chaos.db")
		adminDSN = "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000"
		workerDSN = adminDSN
	case "postgres":
		// In the sync mode of the promote fault the primary waits for its
		// standby from the start: every commit, the migrations' too,
		// waits until the standby is connected, so it is started at once.
		syncPromote := enabled[FaultPromote] && d.cfg.PromoteMode == PromoteSync && pgcluster.Unavailable() == "" && pgcluster.ReplicationUnavailable() == ""
		var ccfg pgcluster.Config
		if syncPromote {
			ccfg = pgcluster.Config{SynchronousStandby: standbyName, SynchronousCommit: "on"}
		}
		d.logf("starting a private PostgreSQL cluster")
		c, cerr := pgcluster.New(ctx, ccfg)
		if cerr != nil {
			if d.cfg.PostgresDSN == "" {
				return cleanup, fmt.Errorf("chaos: cannot start a private PostgreSQL cluster (%v), and no fallback PostgreSQL DSN was given", cerr)
			}
			if enabled[FaultRestart] {
				d.report.Skipped[FaultRestart] = "no private cluster (" + cerr.Error() + "); the shared server is never restarted"
			}
			if enabled[FaultPromote] {
				d.report.Skipped[FaultPromote] = "no private cluster (" + cerr.Error() + "); the shared server is never failed over"
			}
			adminDSN = d.cfg.PostgresDSN
			schema = "sqlease_t_chaos_" + randHex(4)
		} else {
			d.cluster = c
			undo = append(undo, c.Remove)
			adminDSN = c.DSN()
			if syncPromote {
				d.logf("starting a synchronous hot standby for the promote fault")
				sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				st, err := pgcluster.StartStandby(sctx, c, standbyName)
				cancel()
				if err != nil {
					return cleanup, fmt.Errorf("chaos: start a synchronous standby for the promote fault: %w", err)
				}
				d.standby = st
				undo = append(undo, st.Remove)
			}
		}
		upstream, perr := hostPort(adminDSN)
		if perr != nil {
			return cleanup, perr
		}
		px, perr := pgcluster.StartProxy(upstream)
		if perr != nil {
			return cleanup, perr
		}
		d.px = px
		undo = append(undo, px.Close)
		workerDSN = strings.Replace(adminDSN, upstream, px.Addr(), 1)
		workerDSN += sepFor(workerDSN) + "connect_timeout=5"
	}
	db, err := sql.Open(driverName, adminDSN)
	if err != nil {
		return cleanup, err
	}
	d.admin = db
	undo = append(undo, func() { d.adminDB().Close() })
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if schema != "" {
		if _, err := db.ExecContext(sctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
			return cleanup, err
		}
		undo = append(undo, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = db.ExecContext(ctx, `DROP SCHEMA "`+schema+`" CASCADE`)
		})
	}
	if _, err := migrate.Up(sctx, db, dl, migrate.WithNamespace(dialect.Namespace{Schema: schema})); err != nil {
		return cleanup, fmt.Errorf("chaos: migrate: %w", err)
	}
	q, err := newLedgerSQL(d.cfg.Dialect, schema)
	if err != nil {
		return cleanup, err
	}
	for _, s := range q.create {
		if _, err := db.ExecContext(sctx, s); err != nil {
			return cleanup, fmt.Errorf("chaos: create ledger: %w", err)
		}
	}
	keys := make([]string, d.cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("chaos/k%d", i)
		if _, err := db.ExecContext(sctx, q.seed, keys[i]); err != nil {
			return cleanup, fmt.Errorf("chaos: seed counter: %w", err)
		}
	}
	if enabled[FaultPromote] && d.cluster != nil && d.standby == nil {
		if why := pgcluster.ReplicationUnavailable(); why != "" {
			d.report.Skipped[FaultPromote] = why
		} else {
			// A hot standby streaming asynchronously from the primary,
			// through a proxy of its own (CutReplication); it has the
			// schema and the ledger already, or will once it replays.
			d.logf("starting a hot standby for the promote fault")
			st, err := pgcluster.StartStandby(sctx, d.cluster, standbyName)
			if err != nil {
				return cleanup, fmt.Errorf("chaos: start a standby for the promote fault: %w", err)
			}
			d.standby = st
			undo = append(undo, st.Remove)
		}
	}
	d.spec = workerSpec{Dialect: d.cfg.Dialect, DSN: workerDSN, Schema: schema, Keys: keys, MaxBackoff: d.cfg.MaxBackoff,
		ProbeBound: MaxTTL + d.cfg.MaxBackoff + d.cfg.ProbeGrace}
	if d.cfg.Dialect == "postgres" && enabled[FaultPromote] && d.cfg.PromoteMode == PromotePause {
		// At least every worker's TTL (they are in MinTTL..MaxTTL).
		d.spec.FailoverPause = MaxTTL
	}
	for _, f := range d.cfg.Faults {
		if _, skip := d.report.Skipped[f]; !skip {
			d.report.Faults[f] = 0
		}
	}
	return cleanup, nil
}

// standbyName is the application_name of the promote fault's standby
// (the name a synchronous primary waits for).
const standbyName = "chaos_standby"

func sepFor(dsn string) string {
	if strings.Contains(dsn, "?") {
		return "&"
	}
	return "?"
}

// hostPort extracts host:port from a postgres:// URL DSN.
func hostPort(dsn string) (string, error) {
	rest, ok := strings.CutPrefix(dsn, "postgres://")
	if !ok {
		rest, ok = strings.CutPrefix(dsn, "postgresql://")
	}
	if !ok {
		return "", fmt.Errorf("%w: PostgreSQL DSN %q is not a postgres:// URL", ErrInvalidConfig, dsn)
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	if !strings.Contains(rest, ":") {
		rest += ":5432"
	}
	if !strings.HasPrefix(rest, "127.0.0.1:") && !strings.HasPrefix(rest, "localhost:") {
		return "", fmt.Errorf("%w: PostgreSQL DSN host %q: the chaos suite only talks to 127.0.0.1", ErrInvalidConfig, rest)
	}
	return rest, nil
}

// workerTTLs draws a worker's Locker TTLs, spread over MinTTL..MaxTTL.
func (d *driver) workerTTLs() []time.Duration {
	n := d.cfg.Lockers
	ttls := make([]time.Duration, n)
	span := (MaxTTL - MinTTL) / time.Duration(n)
	for i := range ttls {
		ttls[i] = (MinTTL + time.Duration(i)*span + time.Duration(d.int64N(int64(span)+1))).Round(10 * time.Millisecond)
	}
	return ttls
}

// spawn starts a new incarnation of worker name.
func (d *driver) spawn(name string, inc int) (*proc, error) {
	spec := d.spec
	spec.Name, spec.Incarnation = name, inc
	d.mu.Lock()
	spec.Seed = d.uint64()
	if d.ttls[name] == nil {
		d.ttls[name] = d.workerTTLs()
	}
	spec.TTLs = d.ttls[name]
	d.mu.Unlock()
	if name == "w0" {
		spec.Broken = d.cfg.Broken
	}
	if d.cfg.Dialect == "postgres" {
		spec.DSN += "&application_name=chaosw-" + name + "&default_transaction_isolation=" + url.PathEscape(d.isolationOf(name))
	}
	spec.LogPath = filepath.Join(d.dir, name+".jsonl")
	b, _ := json.Marshal(spec)
	cmd := exec.Command(d.exe, d.args...)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
	dieWithParent(cmd)
	stderr, err := os.OpenFile(filepath.Join(d.dir, name+".stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		stderr.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stderr.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return nil, err
	}
	p := &proc{name: name, inc: inc, cmd: cmd, stdin: stdin, replies: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.replies <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		stderr.Close()
		d.mu.Lock()
		killed := p.killed
		d.mu.Unlock()
		if !killed && err != nil {
			d.problem("%s.%d exited by itself: %v (see %s.stderr)", name, inc, err, name)
		}
		close(p.exited)
	}()
	return p, nil
}

// await waits for reply from p, for at most timeout.
func (p *proc) await(reply string, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case r := <-p.replies:
			if r == reply {
				return nil
			}
		case <-p.exited:
			return fmt.Errorf("%s.%d exited while the driver waited for %q", p.name, p.inc, reply)
		case <-t.C:
			return fmt.Errorf("%s.%d did not answer %q within %v", p.name, p.inc, reply, timeout)
		}
	}
}

func (p *proc) send(cmd string) { _, _ = io.WriteString(p.stdin, cmd+"\n") }

func (d *driver) killAll() {
	d.mu.Lock()
	ps := make([]*proc, 0, len(d.procs))
	for _, p := range d.procs {
		p.killed = true
		ps = append(ps, p)
	}
	d.mu.Unlock()
	for _, p := range ps {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// isolations are the levels Config.Isolation "mixed" deals out.
var isolations = []string{"read committed", "repeatable read", "serializable"}

// isolationOf returns worker name's default transaction isolation.
func (d *driver) isolationOf(name string) string {
	if d.cfg.Isolation != "mixed" {
		return d.cfg.Isolation
	}
	var i int
	fmt.Sscanf(name, "w%d", &i)
	return isolations[i%len(isolations)]
}

func workerName(i int) string { return fmt.Sprintf("w%d", i) }

// run starts the workers, injects faults, quiesces and probes.
func (d *driver) run(ctx context.Context) error {
	d.logf("%s: starting %d workers", d.cfg.Dialect, d.cfg.Workers)
	for i := 0; i < d.cfg.Workers; i++ {
		p, err := d.spawn(workerName(i), 0)
		if err != nil {
			return err
		}
		d.procs[p.name] = p
	}
	for _, p := range d.procs {
		if err := p.await("ready", 90*time.Second); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
	}
	d.logf("injecting faults for %v (seed %d)", d.cfg.Duration, d.cfg.Seed)
	faultStart := time.Now()
	d.faultCh = make(chan struct{})
	d.faults(ctx)
	close(d.faultCh)
	d.bg.Wait()
	d.report.FaultPhase = time.Since(faultStart)
	if d.px != nil {
		d.px.SetDelay(0)
	}
	d.logf("faults stopped; restarting dead workers and quiescing")
	// Every worker alive and not stopped.
	var fresh []*proc
	for i := 0; i < d.cfg.Workers; i++ {
		name := workerName(i)
		d.mu.Lock()
		p := d.procs[name]
		d.mu.Unlock()
		select {
		case <-p.exited:
			np, err := d.spawn(name, p.inc+1)
			if err != nil {
				return err
			}
			d.mu.Lock()
			d.procs[name] = np
			d.mu.Unlock()
			fresh = append(fresh, np)
		default:
		}
	}
	for _, p := range fresh {
		if err := p.await("ready", 90*time.Second); err != nil {
			d.problem("%v", err)
		}
	}
	var wg sync.WaitGroup
	for _, p := range d.snapshot() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.send("quiesce")
			if err := p.await("idle", 60*time.Second); err != nil {
				d.problem("quiesce: %v", err)
			}
		}()
	}
	wg.Wait()
	d.logf("probing liveness")
	probers := map[string]bool{}
	perProbe := d.spec.ProbeBound + 2*time.Second
	for _, p := range d.snapshot() {
		p.send("probe")
		err := p.await("probed", time.Duration(d.cfg.Lockers*d.cfg.Keys)*perProbe+30*time.Second)
		probers[p.name] = err == nil
		if err != nil {
			d.problem("probe: %v", err)
		}
	}
	d.probers = probers
	for _, p := range d.snapshot() {
		p.send("exit")
	}
	for _, p := range d.snapshot() {
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			d.problem("%s.%d did not exit within 30s; killed", p.name, p.inc)
			d.mu.Lock()
			p.killed = true
			d.mu.Unlock()
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	return nil
}

func (d *driver) snapshot() []*proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ps []*proc
	for i := 0; i < d.cfg.Workers; i++ {
		ps = append(ps, d.procs[workerName(i)])
	}
	return ps
}
