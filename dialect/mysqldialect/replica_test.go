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
func startPair(t *testing.T) (primary, replica *mariaServer) {
	t.Helper()
	primary = startMaria(t, 1)
	replica = startMaria(t, 2, "--read-only")
	replica.Exec(
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %d, MASTER_USER = 'root', MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1", primary.port),
		"START SLAVE",
	)
	return primary, replica
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
