package mysqldialect_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// The replica test bed: private MariaDB servers started as root on spare
// loopback ports, each in a temporary directory of its test, killed and
// removed when the test ends. They never touch the shared server.

// mariaServer is one private server.
type mariaServer struct {
	t    *testing.T
	dir  string
	port int
	cmd  *exec.Cmd
	DB   *sql.DB // root, parseTime, on database test
	DSN  string
}

// mariaBinaries returns the paths of mariadb-install-db and mariadbd, or
// skips t (fails it with SQLEASE_REQUIRE_MYSQL=1) when one is missing.
func mariaBinaries(t *testing.T) (install, server string) {
	t.Helper()
	if conformance.IsChild() {
		t.Skip("child process")
	}
	find := func(name string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin"} {
			if p := filepath.Join(dir, name); fileExists(p) {
				return p
			}
		}
		return ""
	}
	install, server = find("mariadb-install-db"), find("mariadbd")
	if install == "" || server == "" {
		msg := "the replica tests need MariaDB's mariadb-install-db and mariadbd (e.g. apt-get install mariadb-server) to start private servers"
		if os.Getenv("SQLEASE_REQUIRE_MYSQL") == "1" {
			t.Fatal("SQLEASE_REQUIRE_MYSQL=1 but " + msg)
		}
		t.Skip(msg)
	}
	return install, server
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// A data directory is initialized once per test binary and copied for
// every server (mariadb-install-db takes seconds, a copy a fraction).
var (
	templateOnce sync.Once
	templateDir  string
	templateErr  error
)

func dataTemplate(install string) (string, error) {
	templateOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sqlease-mariadb-template-")
		if err != nil {
			templateErr = err
			return
		}
		templateDir = filepath.Join(dir, "data")
		out, err := exec.Command(install, "--no-defaults", "--datadir="+templateDir, "--user=root",
			"--auth-root-authentication-method=normal").CombinedOutput()
		if err != nil {
			templateErr = fmt.Errorf("%s: %v\n%s", install, err, out)
		}
	})
	return templateDir, templateErr
}

// removeDataTemplate is called by TestMain after the tests.
func removeDataTemplate() {
	if templateDir != "" {
		os.RemoveAll(filepath.Dir(templateDir))
	}
}

// freePort returns a loopback port no one listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startMaria starts a private server with server ID id, binary log in ROW
// format (GTIDs are always on in MariaDB) and the extra options, and waits
// until it accepts root over TCP.
func startMaria(t *testing.T, id int, extra ...string) *mariaServer {
	t.Helper()
	install, server := mariaBinaries(t)
	tmpl, err := dataTemplate(install)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if out, err := exec.Command("cp", "-a", tmpl, data).CombinedOutput(); err != nil {
		t.Fatalf("copy the data directory: %v\n%s", err, out)
	}
	s := &mariaServer{t: t, dir: dir, port: freePort(t)}
	args := append([]string{"--no-defaults", "--datadir=" + data, fmt.Sprintf("--port=%d", s.port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"), "--user=root",
		fmt.Sprintf("--server-id=%d", id), "--log-bin=" + filepath.Join(dir, "bin"), "--binlog-format=ROW",
		"--log-slave-updates", "--gtid-strict-mode=1", "--skip-name-resolve",
		"--innodb-buffer-pool-size=32M", "--log-error=" + filepath.Join(dir, "error.log")}, extra...)
	s.cmd = exec.Command(server, args...)
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", server, err)
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(s.Kill)
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName, cfg.ParseTime = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", s.port), "test", true
	cfg.Timeout = 2 * time.Second
	s.DSN = cfg.FormatDSN()
	s.DB, err = sql.Open("mysql", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DB.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = s.DB.PingContext(t.Context())
		if err == nil {
			break
		}
		if time.Now().After(deadline) || s.cmd.ProcessState != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("private MariaDB on port %d did not start: %v\n%s", s.port, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// Kill ends the server at once (SIGKILL), as a crash. Its pool is closed
// first, so that no idle connection is written to after the crash.
func (s *mariaServer) Kill() {
	if s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	if s.DB != nil {
		s.DB.Close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
}

// Exec runs statements, failing the test on the first error.
func (s *mariaServer) Exec(stmts ...string) {
	s.t.Helper()
	for _, q := range stmts {
		if _, err := s.DB.ExecContext(s.t.Context(), q); err != nil {
			s.t.Fatalf("server :%d: %s: %v", s.port, q, err)
		}
	}
}

// startPair starts a primary and a read-only GTID replica of it,
// replicating. Neither has written anything yet (the data directory's test
// database comes from mariadb-install-db), so the replica starts from the
// primary's first GTID.
func startPair(t *testing.T, opts ...pairOption) (primary, replica *mariaServer) {
	t.Helper()
	var c pairConfig
	for _, o := range opts {
		o(&c)
	}
	primary = startMaria(t, 1, c.primary...)
	replica = startMaria(t, 2, append([]string{"--read-only"}, c.replica...)...)
	replica.Exec(
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %d, MASTER_USER = 'root', MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1", primary.port),
		"START SLAVE",
	)
	if c.semiSync {
		waitSemiSync(t, primary)
	}
	return primary, replica
}

// pairConfig is what the pairOptions of startPair set.
type pairConfig struct {
	primary, replica []string // extra server options
	semiSync         bool
}

type pairOption func(*pairConfig)

// semiSync makes the pair semi-synchronous (built into MariaDB 10.3+, no
// plugin to load): the replica acknowledges each transaction once its I/O
// thread has written it to the relay log, and the primary waits for that
// acknowledgement before it answers the commit, for at most timeout, after
// which it falls back to asynchronous replication (Rpl_semi_sync_master_status
// OFF) and answers anyway. The wait point is MariaDB's default,
// AFTER_COMMIT: the transaction is committed, and visible to other sessions
// on the primary, before the wait. With no replica connected the primary
// still waits (rpl_semi_sync_master_wait_no_slave, default ON). startPair
// returns once the primary counts the replica as a semi-sync client.
func semiSync(timeout time.Duration) pairOption {
	return func(c *pairConfig) {
		c.semiSync = true
		c.primary = append(c.primary, "--rpl-semi-sync-master-enabled=ON",
			fmt.Sprintf("--rpl-semi-sync-master-timeout=%d", timeout.Milliseconds()),
			"--rpl-semi-sync-master-wait-point=AFTER_COMMIT")
		c.replica = append(c.replica, "--rpl-semi-sync-slave-enabled=ON")
	}
}

// waitSemiSync waits until primary has a semi-sync replica connected and
// semi-sync on.
func waitSemiSync(t *testing.T, primary *mariaServer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		clients, status := statusVar(t, primary, "Rpl_semi_sync_master_clients"), statusVar(t, primary, "Rpl_semi_sync_master_status")
		if clients == "1" && status == "ON" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("semi-sync did not start on the primary: Rpl_semi_sync_master_clients %q, Rpl_semi_sync_master_status %q", clients, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statusVar returns a global status variable of s.
func statusVar(t *testing.T, s *mariaServer, name string) string {
	t.Helper()
	var v string
	if err := s.DB.QueryRowContext(t.Context(), "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?", name).Scan(&v); err != nil {
		t.Fatalf("status variable %s: %v", name, err)
	}
	return v
}

// slaveStatus returns the named columns of the replica's SHOW SLAVE STATUS.
func slaveStatus(t *testing.T, replica *mariaServer, names ...string) map[string]string {
	t.Helper()
	rows, err := replica.DB.QueryContext(t.Context(), "SHOW SLAVE STATUS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatal("SHOW SLAVE STATUS: no replication configured")
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i, c := range cols {
		for _, n := range names {
			if c == n {
				out[n] = vals[i].String
			}
		}
	}
	return out
}

// promote makes replica a primary the way a failover tool does: it waits
// until the SQL thread has applied everything the I/O thread wrote to the
// relay log (Gtid_IO_Pos; a semi-sync acknowledgement means "in the relay
// log", not "applied", and RESET SLAVE ALL deletes the relay log), then
// stops replication, forgets the old primary and makes it writable.
func promote(t *testing.T, replica *mariaServer) {
	t.Helper()
	io := slaveStatus(t, replica, "Gtid_IO_Pos")["Gtid_IO_Pos"]
	var r int
	if err := replica.DB.QueryRowContext(t.Context(), "SELECT MASTER_GTID_WAIT(?, 10)", io).Scan(&r); err != nil || r != 0 {
		t.Fatalf("replica did not apply its relay log up to %q: result %d, %v (%s)", io, r, err, slaveErrors(t, replica))
	}
	replica.Exec("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
}

// catchUp waits until replica has applied everything primary logged.
func catchUp(t *testing.T, primary, replica *mariaServer) {
	t.Helper()
	var pos string
	if err := primary.DB.QueryRowContext(t.Context(), "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	var r int
	if err := replica.DB.QueryRowContext(t.Context(), "SELECT MASTER_GTID_WAIT(?, 10)", pos).Scan(&r); err != nil || r != 0 {
		var st string
		_ = replica.DB.QueryRowContext(t.Context(), "SELECT @@gtid_slave_pos").Scan(&st)
		t.Fatalf("replica did not reach the primary's GTID position %q: result %d, %v (replica at %q; %s)", pos, r, err, st, slaveErrors(t, replica))
	}
}

// slaveErrors returns the replica's last I/O and SQL thread errors.
func slaveErrors(t *testing.T, replica *mariaServer) string {
	rows, err := replica.DB.QueryContext(t.Context(), "SHOW SLAVE STATUS")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		return "no replication configured"
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for i, c := range cols {
		if c == "Last_IO_Error" || c == "Last_SQL_Error" {
			fmt.Fprintf(&b, "%s: %q ", c, vals[i].String)
		}
	}
	return b.String()
}

// readPrimary runs the dialect's Primary query on db.
func readPrimary(t *testing.T, db *sql.DB) (int, string) {
	t.Helper()
	var ro int
	var reason string
	if err := db.QueryRowContext(t.Context(), mysqldialect.New().Statements().Primary).Scan(&ro, &reason); err != nil {
		t.Fatalf("Primary query: %v", err)
	}
	return ro, reason
}

// TestFailoverAsyncTokensNeverGoBack_MySQL (SPEC S7, S3): a GTID replica
// stops replicating (an asynchronous replica falling behind), the primary
// grants 60 exclusive leases on one key and 60 shared ones on another, is
// killed (SIGKILL), and the replica is promoted: the grants it never
// received are lost, and still every new grant's token exceeds every token
// granted before on its key. With AUTO_INCREMENT tokens alone (migration
// 00001) the promoted replica issues the lost tokens again.
func TestFailoverAsyncTokensNeverGoBack_MySQL(t *testing.T) {
	ctx := t.Context()
	primary, replica := startPair(t)
	d := mysqldialect.New()
	if _, err := migrate.Up(ctx, primary.DB, d); err != nil {
		t.Fatal(err)
	}
	const xKey, sKey = "failover-x", "failover-s"
	maxTok := map[string]int64{}
	grants := func(l *lock.Locker, n int) {
		t.Helper()
		for i := range n {
			for _, g := range []struct {
				key  string
				mode lock.Mode
			}{{xKey, lock.Exclusive}, {sKey, lock.Shared}} {
				le, err := l.TryAcquire(ctx, g.key, g.mode)
				if err != nil {
					t.Fatalf("grant %d on %s: %v", i, g.key, err)
				}
				if tok := le.Token(); tok <= maxTok[g.key] {
					t.Errorf("%s: token %d after %d", g.key, tok, maxTok[g.key])
				} else {
					maxTok[g.key] = tok
				}
				if err := le.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	l, err := lock.New(ctx, primary.DB, d, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	grants(l, 5)
	catchUp(t, primary, replica)
	replica.Exec("STOP SLAVE")
	seen := map[string]int64{xKey: maxTok[xKey], sKey: maxTok[sKey]}
	grants(l, 60) // 120 grants the replica never receives
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("tokens before the failover: replicated up to %v, lost up to %v", seen, maxTok)

	primary.Kill()
	replica.Exec("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
	if ro, reason := readPrimary(t, replica.DB); ro != 0 || reason != "" {
		t.Errorf("Primary query on the promoted replica: (%d, %q), want (0, \"\")", ro, reason)
	}

	l2, err := lock.New(ctx, replica.DB, d, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close(context.Background())
	for _, g := range []struct {
		key  string
		mode lock.Mode
	}{{xKey, lock.Exclusive}, {sKey, lock.Shared}, {xKey, lock.Exclusive}, {sKey, lock.Shared}} {
		le, err := l2.TryAcquire(ctx, g.key, g.mode)
		if err != nil {
			t.Fatalf("grant on %s after the failover: %v", g.key, err)
		}
		if tok := le.Token(); tok <= maxTok[g.key] {
			t.Errorf("%s after the failover: token %d, want > %d (the greatest granted before, lost with the primary)", g.key, tok, maxTok[g.key])
		} else {
			maxTok[g.key] = tok
		}
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadOnlyReplicaQuery: the Primary query returns (1, a reason naming
// the server) on a read-only replica, (0, "") on its primary and on a
// private server once SET GLOBAL read_only = 1 is undone, and (0, "") on the
// shared server when SQLEASE_MYSQL_DSN is set.
func TestReadOnlyReplicaQuery(t *testing.T) {
	primary, replica := startPair(t)
	var host string
	if err := replica.DB.QueryRowContext(t.Context(), "SELECT @@hostname").Scan(&host); err != nil {
		t.Fatal(err)
	}
	ro, reason := readPrimary(t, replica.DB)
	if want := fmt.Sprintf("%s:%d", host, replica.port); ro != 1 || !strings.Contains(reason, want) || !strings.Contains(reason, "read_only") {
		t.Errorf("Primary query on the replica: (%d, %q), want 1 and a reason naming %s and read_only", ro, reason, want)
	} else {
		t.Logf("replica: (%d, %q)", ro, reason)
	}
	if ro, reason := readPrimary(t, primary.DB); ro != 0 || reason != "" {
		t.Errorf("Primary query on the primary: (%d, %q), want (0, \"\")", ro, reason)
	}
	// lock.New and migrate.Up refuse the replica before writing (SPEC S7).
	if _, err := migrate.Up(t.Context(), primary.DB, mysqldialect.New()); err != nil {
		t.Fatal(err)
	}
	if l, err := lock.New(t.Context(), replica.DB, mysqldialect.New()); !errors.Is(err, lock.ErrReadOnly) || !strings.Contains(err.Error(), fmt.Sprint(replica.port)) {
		if l != nil {
			l.Close(t.Context())
		}
		t.Errorf("lock.New on the replica: want ErrReadOnly naming port %d, got %v", replica.port, err)
	}
	if _, err := migrate.Up(t.Context(), replica.DB, mysqldialect.New()); !errors.Is(err, lock.ErrReadOnly) {
		t.Errorf("migrate.Up on the replica: want ErrReadOnly, got %v", err)
	}
	primary.Exec("SET GLOBAL read_only = 1")
	if ro, reason := readPrimary(t, primary.DB); ro != 1 || !strings.Contains(reason, fmt.Sprintf(":%d", primary.port)) {
		t.Errorf("Primary query on the primary after SET GLOBAL read_only = 1: (%d, %q), want 1 and a reason naming it", ro, reason)
	}
	primary.Exec("SET GLOBAL read_only = 0")
	if ro, reason := readPrimary(t, primary.DB); ro != 0 || reason != "" {
		t.Errorf("Primary query after SET GLOBAL read_only = 0: (%d, %q), want (0, \"\")", ro, reason)
	}
	if dsn := os.Getenv("SQLEASE_MYSQL_DSN"); dsn != "" {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if ro, reason := readPrimary(t, db); ro != 0 || reason != "" {
			t.Errorf("Primary query on the shared server: (%d, %q), want (0, \"\")", ro, reason)
		}
	}
}

// leaseEvents records a Locker's engine events for a test to wait on.
type leaseEvents chan lock.Event

func (ch leaseEvents) OnEvent(e lock.Event) {
	select {
	case ch <- e:
	default:
	}
}

// next returns the next event of kind on key, skipping others, or fails t
// after timeout.
func (ch leaseEvents) next(t *testing.T, key string, kind lock.EventKind, timeout time.Duration) lock.Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e := <-ch:
			if e.Key == key && e.Kind == kind {
				return e
			}
		case <-deadline:
			t.Fatalf("no %s event on %q within %s", kind, key, timeout)
		}
	}
}

// leaseRow reads lease leaseID's token and expiry (µs since the epoch, the
// database's clock) from the holders and expiry tables of db.
func leaseRow(t *testing.T, db *sql.DB, leaseID string) (token, expiresUS int64, found bool) {
	t.Helper()
	err := db.QueryRowContext(t.Context(), "SELECT h.token, e.expires_us FROM sqlease_holders h JOIN sqlease_expiry e ON e.lease_id = h.lease_id WHERE h.lease_id = ?", leaseID).Scan(&token, &expiresUS)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, false
	}
	if err != nil {
		t.Fatalf("read lease %s: %v", leaseID, err)
	}
	return token, expiresUS, true
}

// processList returns the client threads of s, for logs.
func processList(t *testing.T, s *mariaServer) string {
	t.Helper()
	rows, err := s.DB.QueryContext(t.Context(), "SELECT ID, COMMAND, TIME_MS, COALESCE(STATE, ''), COALESCE(INFO, '') FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() ORDER BY ID")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id int64
		var cmd, ms, state, info string
		if err := rows.Scan(&id, &cmd, &ms, &state, &info); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "[%d %s %sms %q %q] ", id, cmd, ms, state, info)
	}
	return b.String()
}

// keyRows returns the tokens of the holder rows of key on db.
func keyRows(ctx context.Context, db *sql.DB, key string) ([]int64, error) {
	rows, err := db.QueryContext(ctx, "SELECT token FROM sqlease_holders WHERE lock_key = ? ORDER BY token", key)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var toks []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			return nil, err
		}
		toks = append(toks, tok)
	}
	return toks, rows.Err()
}

// semiSyncLocker migrates primary and opens a Locker on a pool of its own
// (primary.DB is closed by Kill before the crash; the Locker's connections
// break with it, as in production) and renewals on another, of user
// renewer, recording events.
func semiSyncLocker(t *testing.T, primary *mariaServer, ttl time.Duration) (*lock.Locker, leaseEvents) {
	t.Helper()
	d := mysqldialect.New()
	if _, err := migrate.Up(t.Context(), primary.DB, d); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	// Renewals go through a pool of a user of their own, so that the
	// process list tells their server threads from the acquires'.
	primary.Exec("CREATE USER renewer@'%'", "GRANT ALL PRIVILEGES ON test.* TO renewer@'%'")
	cfg, err := mysql.ParseDSN(primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = "renewer"
	renewDB, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { renewDB.Close() })
	ev := make(leaseEvents, 1024)
	// A short release timeout: the last release goes to the dead primary.
	l, err := lock.New(t.Context(), db, d, lock.WithTTL(ttl), lock.WithObserver(ev), lock.WithRenewDB(renewDB), lock.WithReleaseTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Runs before db.Close: waits for the background undo of an abandoned
	// acquire (bounded by one TTL).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l, ev
}

// TestSemiSyncStallLosesNothingAcknowledged_MySQL (SPEC S7, H1): MariaDB
// semi-sync with rpl_semi_sync_master_timeout (60 s) longer than the renew
// timeout (TTL/5 = 600 ms) and the acquire deadline (1 s). A lease L is
// granted and renewed while the replica acknowledges; then the replica's
// I/O thread stops, so acknowledgements stall:
//
//   - a plain INSERT with a 300 ms deadline: go-sql-driver/mysql's context
//     watcher closes the connection when the context ends and the call
//     returns context.DeadlineExceeded (no KILL is sent); the row is
//     already committed and visible on the primary (AFTER_COMMIT), and the
//     server thread goes on waiting for the acknowledgement;
//   - an acquire of another key with a 1 s deadline: its grant is visible
//     on the primary before the acknowledgement, and the call ends with an
//     error and no lease;
//   - L's next renewal waits for the acknowledgement past its renew
//     timeout and extends nothing.
//
// The deadlines do not cut the wait of the acquire and renewal CALLs: their
// procedures send their result row before their COMMIT, and the driver
// stops watching the context once it has returned the rows (mysqlRows.Close
// calls finish before it reads the rest of the reply), so the OK packet
// that follows the COMMIT's acknowledgement wait is read without a deadline
// (v1.10.1; only the DSN's readTimeout bounds it). The acquire therefore
// returns when the wait ends (the acknowledgement, the fallback after
// rpl_semi_sync_master_timeout, or the primary's death), not at its
// deadline; the renewal likewise. What stays true is safety: a grant or
// renewal that reports success after its deadline is not trusted
// (errUnconfirmed), and the lease's trusted window is kept by the local
// watchdog, not by the renewal's return.
//
// The primary is killed (SIGKILL) and the replica promoted: L's row is
// there, with an expiry no earlier than the end of L's trusted window, the
// failed acquire's grant is not, and tokens granted on the new primary
// exceed every token granted before, on both keys. This holds while the
// primary is still semi-synchronous: once any transaction has waited out
// rpl_semi_sync_master_timeout, what it commits is asynchronous
// (TestSemiSyncAfterFallbackGrantsAreAsync_MySQL).
func TestSemiSyncStallLosesNothingAcknowledged_MySQL(t *testing.T) {
	ctx := t.Context()
	const ttl = 3 * time.Second
	const renewTimeout = ttl / 5 // the default
	const lKey, aKey = "semisync-L", "semisync-A"
	primary, replica := startPair(t, semiSync(60*time.Second))
	l, ev := semiSyncLocker(t, primary, ttl)
	primary.Exec("CREATE TABLE semisync_probe (id INT PRIMARY KEY)")
	yes0 := statusVar(t, primary, "Rpl_semi_sync_master_yes_tx")

	L, err := l.TryAcquire(ctx, lKey, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	ren := ev.next(t, lKey, lock.EventRenewOK, ttl)
	// No renewal succeeds from here on, so the trusted window stays put.
	trustedEnd := time.Now().Add(L.Remaining())
	t.Logf("L granted (token %d) and renewed (round trip %s) with acknowledgements: Rpl_semi_sync_master_yes_tx %s -> %s",
		L.Token(), ren.Latency.Round(time.Millisecond), yes0, statusVar(t, primary, "Rpl_semi_sync_master_yes_tx"))
	replica.Exec("STOP SLAVE IO_THREAD")
	stalled := time.Now()

	// The driver on a deadline during the acknowledgement wait.
	probeDB, err := sql.Open("mysql", primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer probeDB.Close()
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = probeDB.ExecContext(pctx, "INSERT INTO semisync_probe VALUES (1)")
	took := time.Since(start)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
		t.Errorf("INSERT with a 300 ms deadline during the stall: %v after %s, want context.DeadlineExceeded after ~300 ms", err, took)
	}
	var visible int
	if err := primary.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM semisync_probe").Scan(&visible); err != nil {
		t.Fatal(err)
	}
	var waiting int
	var states string
	if err := primary.DB.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(GROUP_CONCAT(DISTINCT STATE SEPARATOR '; '), '') FROM information_schema.PROCESSLIST WHERE INFO LIKE 'INSERT INTO semisync_probe%' AND STATE LIKE '%semi-sync%'").Scan(&waiting, &states); err != nil {
		t.Fatal(err)
	}
	t.Logf("INSERT with a 300 ms deadline: %v after %s; row visible on the primary: %d; its server thread still waiting for the ack: %d (%s); connections left in the client's pool: %d",
		err, took.Round(time.Millisecond), visible, waiting, states, probeDB.Stats().OpenConnections)
	if visible != 1 {
		t.Errorf("the INSERT's row is not visible on the primary (%d rows): AFTER_COMMIT commits before the ack wait", visible)
	}
	if waiting != 1 {
		t.Errorf("%d server threads of the INSERT wait for a semi-sync ack after the client gave up, want 1", waiting)
	}

	// An acquire with a 1 s deadline, in the background: it returns only
	// when the acknowledgement wait ends.
	type result struct {
		le   *lock.Lease
		err  error
		took time.Duration
	}
	acquired := make(chan result, 1)
	start = time.Now()
	go func() {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		le, err := l.Acquire(actx, aKey, lock.Exclusive)
		acquired <- result{le, err, time.Since(start)}
	}()
	time.Sleep(500 * time.Millisecond)
	seen, err := keyRows(ctx, primary.DB, aKey)
	if err != nil || len(seen) != 1 {
		t.Errorf("the acquire's grant was not visible on the primary during the ack wait: %v, %v", seen, err)
	}

	// Wait until L's renewal has waited longer than its renew timeout, and
	// the acquire's deadline plus the 500 ms SPEC H9 allows has passed.
	var renewMS int64
	for {
		if err := primary.DB.QueryRowContext(ctx, "SELECT CAST(COALESCE(MAX(TIME_MS), 0) AS SIGNED) FROM information_schema.PROCESSLIST WHERE USER = 'renewer' AND STATE LIKE '%semi-sync%'").Scan(&renewMS); err != nil {
			t.Fatal(err)
		}
		if renewMS > renewTimeout.Milliseconds()+100 && time.Since(start) > 1500*time.Millisecond {
			break
		}
		if time.Until(trustedEnd) < 300*time.Millisecond {
			t.Fatalf("L's renewal did not stall in the ack wait before L's trusted window neared its end (renewal waiting %d ms); processes: %s", renewMS, processList(t, primary))
		}
		time.Sleep(20 * time.Millisecond)
	}
	var early *result
	select {
	case r := <-acquired:
		early = &r
	default:
	}
	rem := L.Remaining()
	if rem <= 0 || L.Err() != nil {
		t.Fatalf("L was lost before the failover (%s after the stall began): %v", time.Since(stalled), L.Err())
	}
	if d := time.Now().Add(rem).Sub(trustedEnd); d < -5*time.Millisecond || d > 5*time.Millisecond {
		t.Errorf("L's trusted window moved by %s during the stall", d)
	}
	_, pExp, _ := leaseRow(t, primary.DB, L.LeaseID())
	acq := fmt.Sprintf("has not returned after %s", time.Since(start).Round(time.Millisecond))
	if early != nil {
		acq = fmt.Sprintf("returned after %s", early.took.Round(time.Millisecond))
	}
	t.Logf("%s after the stall began: L's renewal has waited %d ms for the ack (renew timeout %s); the acquire (deadline 1 s) %s; Rpl_semi_sync_master_status %s, no_tx %s; L trusted for %s more",
		time.Since(stalled).Round(time.Millisecond), renewMS, renewTimeout, acq,
		statusVar(t, primary, "Rpl_semi_sync_master_status"), statusVar(t, primary, "Rpl_semi_sync_master_no_tx"), rem.Round(time.Millisecond))
	if s := statusVar(t, primary, "Rpl_semi_sync_master_status"); s != "ON" {
		t.Errorf("Rpl_semi_sync_master_status %s during the stall, want ON (no fallback before the 60 s timeout)", s)
	}
	// SPEC H9: the acquire returns by its deadline plus 500 ms, although
	// its commit still waits for the acknowledgement (the engine reads the
	// procedure's last reply under the statement's context).
	if early == nil || early.took > 1500*time.Millisecond {
		t.Errorf("the acquire with a 1 s deadline %s: want it back within 1.5 s (SPEC H9)", acq)
	}

	primary.Kill()
	killed := time.Now()
	r := early
	if r == nil {
		select {
		case got := <-acquired:
			r = &got
		case <-time.After(5 * time.Second):
			t.Fatal("the acquire did not return within 5 s of the primary's death")
		}
		t.Logf("the acquire returned %s after the primary's death", time.Since(killed).Round(time.Millisecond))
	}
	t.Logf("acquire of %q with a 1 s deadline: lease %v, %v, after %s", aKey, r.le, r.err, r.took.Round(time.Millisecond))
	if r.err == nil || r.le != nil {
		t.Errorf("acquire with a 1 s deadline during the stall: lease %v, err %v; want an error and no lease", r.le, r.err)
	}

	promote(t, replica)
	tok, rExp, ok := leaseRow(t, replica.DB, L.LeaseID())
	if !ok {
		t.Fatalf("L's row (lease %s) is not on the promoted replica: an acknowledged grant was lost", L.LeaseID())
	}
	t.Logf("L's expiry: on the old primary %s (moved by the unacknowledged renewal), on the new primary %s; trusted window ends %s, %s before the new primary's expiry",
		time.UnixMicro(pExp).Format("15:04:05.000000"), time.UnixMicro(rExp).Format("15:04:05.000000"),
		trustedEnd.Format("15:04:05.000000"), time.UnixMicro(rExp).Sub(trustedEnd).Round(time.Millisecond))
	if tok != L.Token() {
		t.Errorf("L's token on the new primary: %d, want %d", tok, L.Token())
	}
	if trustedEnd.After(time.UnixMicro(rExp)) {
		t.Errorf("L's trusted window ends %s, after its row's expiry on the new primary %s", trustedEnd, time.UnixMicro(rExp))
	}
	if toks, err := keyRows(ctx, replica.DB, aKey); err != nil || len(toks) != 0 {
		t.Errorf("the failed acquire's grant on the new primary: %v, %v; want none", toks, err)
	}

	// Tokens go on growing on the new primary, on both keys; L's key is
	// granted again only once L's row has expired there, so after L's
	// trusted window.
	before := L.Token()
	for _, s := range seen {
		before = max(before, s)
	}
	l2, err := lock.New(ctx, replica.DB, mysqldialect.New(), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close(context.Background())
	a2, err := l2.TryAcquire(ctx, aKey, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithTimeout(ctx, 2*ttl)
	defer cancel()
	l2L, err := l2.Acquire(gctx, lKey, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the failover: %q token %d, %q token %d granted at %s; greatest token before %d",
		aKey, a2.Token(), lKey, l2L.Token(), l2L.GrantedAt().Format("15:04:05.000000"), before)
	if a2.Token() <= before || l2L.Token() <= before {
		t.Errorf("tokens after the failover %d, %d; want > %d", a2.Token(), l2L.Token(), before)
	}
	if l2L.GrantedAt().Before(trustedEnd) {
		t.Errorf("%q granted on the new primary at %s, inside L's trusted window (ends %s)", lKey, l2L.GrantedAt(), trustedEnd)
	}
	for _, le := range []*lock.Lease{a2, l2L} {
		if err := le.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// TestSemiSyncTimeoutFallsBackToAsync_MySQL (the residual risk of SPEC S7
// documented in docs/operations.md): MariaDB semi-sync with
// rpl_semi_sync_master_timeout (100 ms) shorter than the renew timeout
// (TTL/5 = 600 ms). The replica's I/O thread stops after L's grant; L's
// next renewal waits 100 ms for an acknowledgement, the primary falls back
// to asynchronous replication (Rpl_semi_sync_master_status OFF) and
// answers OK, so the renewal succeeds without the replica having it. After
// the primary is killed and the replica promoted, L's row there still has
// its grant's expiry, earlier than the end of L's trusted window, and the
// new primary grants L's key to another holder while L still trusts its
// lease: semi-sync with a timeout below the renew timeout is asynchronous.
func TestSemiSyncTimeoutFallsBackToAsync_MySQL(t *testing.T) {
	ctx := t.Context()
	const ttl = 3 * time.Second
	const lKey = "semisync-fallback"
	const timeout = 100 * time.Millisecond
	primary, replica := startPair(t, semiSync(timeout))
	l, ev := semiSyncLocker(t, primary, ttl)

	L, err := l.TryAcquire(ctx, lKey, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	yes, no := statusVar(t, primary, "Rpl_semi_sync_master_yes_tx"), statusVar(t, primary, "Rpl_semi_sync_master_no_tx")
	replica.Exec("STOP SLAVE IO_THREAD")

	ren := ev.next(t, lKey, lock.EventRenewOK, ttl)
	rem := L.Remaining()
	trustedEnd := time.Now().Add(rem)
	status := statusVar(t, primary, "Rpl_semi_sync_master_status")
	t.Logf("L granted (token %d) with an ack (yes_tx %s, no_tx %s); after the I/O thread stopped, its renewal succeeded in %s; then Rpl_semi_sync_master_status %s, yes_tx %s, no_tx %s; L trusted for %s more",
		L.Token(), yes, no, ren.Latency.Round(time.Millisecond), status,
		statusVar(t, primary, "Rpl_semi_sync_master_yes_tx"), statusVar(t, primary, "Rpl_semi_sync_master_no_tx"), rem.Round(time.Millisecond))
	if ren.Latency < timeout {
		t.Errorf("the renewal during the stall took %s, less than the semi-sync timeout %s: it did not wait for an ack", ren.Latency, timeout)
	}
	if status != "OFF" {
		t.Errorf("Rpl_semi_sync_master_status %s after the timeout, want OFF (fallen back to asynchronous)", status)
	}
	_, pExp, _ := leaseRow(t, primary.DB, L.LeaseID())

	primary.Kill()
	promote(t, replica)
	tok, rExp, ok := leaseRow(t, replica.DB, L.LeaseID())
	if !ok {
		t.Fatalf("L's row (lease %s) is not on the promoted replica, although its grant was acknowledged", L.LeaseID())
	}
	exp := time.UnixMicro(rExp)
	t.Logf("L's expiry: on the old primary %s, on the new primary %s (its grant's); trusted window ends %s, %s after the new primary's expiry",
		time.UnixMicro(pExp).Format("15:04:05.000000"), exp.Format("15:04:05.000000"),
		trustedEnd.Format("15:04:05.000000"), trustedEnd.Sub(exp).Round(time.Millisecond))
	if tok != L.Token() {
		t.Errorf("L's token on the new primary: %d, want %d", tok, L.Token())
	}
	if !trustedEnd.After(exp) {
		t.Fatalf("L's trusted window ends %s, not after its row's expiry on the new primary %s: the renewal acknowledged after the fallback reached the replica?", trustedEnd, exp)
	}

	// The new primary grants L's key once the row has expired there, while
	// L still trusts its lease.
	l2, err := lock.New(ctx, replica.DB, mysqldialect.New(), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close(context.Background())
	time.Sleep(time.Until(exp.Add(30 * time.Millisecond)))
	n, err := l2.TryAcquire(ctx, lKey, lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire of %q on the new primary after L's row expired there: %v", lKey, err)
	}
	lRem := L.Remaining()
	t.Logf("new primary granted %q at %s (token %d) while L trusted its lease for %s more: overlap %s",
		lKey, n.GrantedAt().Format("15:04:05.000000"), n.Token(), lRem.Round(time.Millisecond), trustedEnd.Sub(n.GrantedAt()).Round(time.Millisecond))
	if lRem <= 0 || !n.GrantedAt().Before(trustedEnd) {
		t.Errorf("no overlap: L remaining %s, new grant at %s, L's window ends %s", lRem, n.GrantedAt(), trustedEnd)
	}
	if n.Token() <= L.Token() {
		t.Errorf("token after the failover %d, want > %d", n.Token(), L.Token())
	}
	if err := n.Release(ctx); err != nil {
		t.Error(err)
	}
}

// TestSemiSyncDriverDeadline_MySQL: what go-sql-driver/mysql (v1.10.1)
// does when a context deadline passes while the primary waits for a
// semi-sync acknowledgement (the replica's I/O thread stopped,
// rpl_semi_sync_master_timeout 60 s). The driver watches the context from
// the moment it sends a statement until it has returned the statement's
// result (or error); when the context ends meanwhile it closes the
// connection (no KILL: the server thread keeps waiting, the commit
// stands) and returns the context's error. Once QueryContext has returned
// rows, mysqlRows.Close stops watching (it calls finish first) and then
// reads the rest of the reply with no deadline but the DSN's readTimeout.
// So, for a CALL with a 300 ms deadline:
//
//   - SELECT after COMMIT: the acknowledgement wait comes before the first
//     result packet, and the call fails at its deadline with
//     context.DeadlineExceeded;
//   - result before COMMIT (sqlease's acquire and renew procedures),
//     drained with Rows.NextResultSet before Close: the same, since the
//     final OK packet is read while the context is watched;
//   - result before COMMIT read with Next and Close only (database/sql's
//     QueryRow, the engine's eachRow): the row arrives at once, Close waits
//     for the acknowledgement (here until the I/O thread is restarted,
//     1.5 s later) and the call succeeds after its deadline, which the
//     engine reports as an unknown outcome (errUnconfirmed).
func TestSemiSyncDriverDeadline_MySQL(t *testing.T) {
	ctx := t.Context()
	primary, replica := startPair(t, semiSync(60*time.Second))
	primary.Exec("CREATE TABLE p (id INT PRIMARY KEY)",
		"CREATE PROCEDURE result_after_commit(IN v INT) BEGIN START TRANSACTION; INSERT INTO p VALUES (v); COMMIT; SELECT v AS r; END",
		"CREATE PROCEDURE result_before_commit(IN v INT) BEGIN START TRANSACTION; INSERT INTO p VALUES (v); SELECT v AS r; COMMIT; END",
	)
	db, err := sql.Open("mysql", primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	replica.Exec("STOP SLAVE IO_THREAD")
	const deadline = 300 * time.Millisecond
	call := func(i int, proc string, drain bool) (time.Duration, error) {
		c, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		rows, err := db.QueryContext(c, "CALL "+proc+"(?)", i)
		if err != nil {
			return time.Since(start), err
		}
		for rows.Next() {
		}
		if drain {
			for rows.NextResultSet() {
				for rows.Next() {
				}
			}
		}
		err = rows.Err()
		if e := rows.Close(); err == nil {
			err = e
		}
		return time.Since(start), err
	}
	for i, c := range []struct {
		proc  string
		drain bool
	}{{"result_after_commit", false}, {"result_before_commit", true}} {
		took, err := call(i+1, c.proc, c.drain)
		t.Logf("CALL %s, drained with NextResultSet %v, deadline %s: %v after %s", c.proc, c.drain, deadline, err, took.Round(time.Millisecond))
		if !errors.Is(err, context.DeadlineExceeded) || took > deadline+500*time.Millisecond {
			t.Errorf("CALL %s (drained %v): %v after %s, want context.DeadlineExceeded at the deadline", c.proc, c.drain, err, took)
		}
	}
	restart := time.AfterFunc(1500*time.Millisecond, func() { _, _ = replica.DB.ExecContext(ctx, "START SLAVE IO_THREAD") })
	defer restart.Stop()
	took, err := call(3, "result_before_commit", false)
	t.Logf("CALL result_before_commit, read with Next and Close, deadline %s: %v after %s (the I/O thread restarted at 1.5 s)", deadline, err, took.Round(time.Millisecond))
	if err != nil || took < time.Second {
		t.Errorf("CALL result_before_commit with Next and Close: %v after %s; want success once acknowledged, past the deadline (if go-sql-driver now watches the context in Close, update the comments of this test and of TestSemiSyncStallLosesNothingAcknowledged_MySQL)", err, took)
	}
}

// TestSemiSyncAfterFallbackGrantsAreAsync_MySQL: a timeout longer than the
// renew timeout and the acquire's statement bound protects the statements
// in flight during an acknowledgement stall, not those after it. Semi-sync
// with rpl_semi_sync_master_timeout 1.5 s (> renew timeout 600 ms), the
// replica's I/O thread stopped: an application's INSERT (no deadline) waits
// the 1.5 s and the primary falls back to asynchronous replication
// (Rpl_semi_sync_master_status OFF, until the replica reconnects and
// catches up). A TryAcquire then is granted at once, without the replica;
// after the primary is killed and the replica promoted, the grant is gone
// and the new primary grants its key to another holder while the first
// still trusts its lease. So semi-sync keeps acknowledged grants only while
// the primary stays semi-synchronous: a failover must not promote a
// replica that was behind while the primary ran in fallback.
func TestSemiSyncAfterFallbackGrantsAreAsync_MySQL(t *testing.T) {
	ctx := t.Context()
	const ttl = 3 * time.Second
	const timeout = 1500 * time.Millisecond
	const key = "semisync-after-fallback"
	primary, replica := startPair(t, semiSync(timeout))
	l, _ := semiSyncLocker(t, primary, ttl)
	primary.Exec("CREATE TABLE semisync_app (id INT PRIMARY KEY)")
	replica.Exec("STOP SLAVE IO_THREAD")

	start := time.Now()
	primary.Exec("INSERT INTO semisync_app VALUES (1)")
	took := time.Since(start)
	status, no := statusVar(t, primary, "Rpl_semi_sync_master_status"), statusVar(t, primary, "Rpl_semi_sync_master_no_tx")
	t.Logf("an application INSERT during the stall answered after %s; Rpl_semi_sync_master_status %s, no_tx %s", took.Round(time.Millisecond), status, no)
	if took < timeout || status != "OFF" {
		t.Fatalf("the INSERT took %s and semi-sync is %s; want the %s timeout and OFF", took, status, timeout)
	}

	start = time.Now()
	B, err := l.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	took = time.Since(start)
	t.Logf("TryAcquire after the fallback: granted in %s (token %d), no_tx %s; B trusted for %s",
		took.Round(time.Millisecond), B.Token(), statusVar(t, primary, "Rpl_semi_sync_master_no_tx"), B.Remaining().Round(time.Millisecond))
	if took > timeout {
		t.Errorf("the grant after the fallback took %s: it waited for an ack", took)
	}

	primary.Kill()
	promote(t, replica)
	if _, _, ok := leaseRow(t, replica.DB, B.LeaseID()); ok {
		t.Fatalf("B's row reached the replica, whose I/O thread was stopped")
	}
	l2, err := lock.New(ctx, replica.DB, mysqldialect.New(), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close(context.Background())
	n, err := l2.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire of %q on the new primary: %v", key, err)
	}
	rem := B.Remaining()
	t.Logf("the new primary granted %q (token %d) while B trusted its lease for %s more", key, n.Token(), rem.Round(time.Millisecond))
	if rem <= 0 {
		t.Errorf("B's window had ended when the new primary granted its key: no overlap shown")
	}
	if n.Token() <= B.Token() {
		t.Errorf("token after the failover %d, want > %d", n.Token(), B.Token())
	}
	if err := n.Release(ctx); err != nil {
		t.Error(err)
	}
}
