// Package pgcluster runs private PostgreSQL clusters for tests: a primary
// started from initdb, hot standbys streaming from it (optionally
// synchronous), clusters restored from a base backup, and a TCP proxy to
// put between a client (or a standby) and a server, so replication can be
// cut and clients re-pointed. The chaos suite restarts its cluster with it;
// the dialect tests fail a primary over to its standby.
//
// Each cluster lives in a temporary directory of its own (data directory,
// Unix socket, server.log) and listens on a free port of 127.0.0.1 with
// trust authentication for every user, replication included, from
// 127.0.0.1 only. The shared server of a machine is never touched. The
// postmaster is a child of this process running as OS user postgres: on
// Linux by switching credentials (this process is root), and it gets
// SIGKILL if this process dies, so a test killed by its timeout leaves no
// server running; elsewhere through runuser. Remove stops a cluster and
// deletes its directory; tests call it from t.Cleanup.
//
// Clusters run with fsync and full-page writes off (fast, and an immediate
// stop or a kill loses nothing the OS already has) and
// synchronous_commit on.
package pgcluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"
)

// BinEnv names the environment variable that overrides where the
// PostgreSQL server binaries are looked for.
const BinEnv = "SQLEASE_PG_BIN"

// Config sets up a cluster started by New.
type Config struct {
	// SynchronousStandby, when set, makes the cluster a synchronous
	// primary: synchronous_standby_names is set to it, so every commit
	// waits for the standby with that application_name (the name given
	// to StartStandby). Commits block until that standby is connected.
	SynchronousStandby string
	// SynchronousCommit is synchronous_commit (default "on"): with a
	// synchronous standby, "on" waits for its flush and "remote_apply"
	// until the commit is visible on it.
	SynchronousCommit string
}

// Cluster is one private PostgreSQL cluster (a primary, a standby or a
// restored copy). Its methods are safe for concurrent use.
type Cluster struct {
	bin, dir, data string
	port           int
	asPostgres     bool // run the server's programs as OS user postgres
	uid, gid       int

	// Standbys only.
	name    string   // application_name
	primary *Cluster // the cluster it streams from
	link    *Proxy   // its replication connection goes through this

	mu     sync.Mutex
	server *exec.Cmd     // the running postmaster
	exited chan struct{} // closed when server exits
}

// findBin returns the directory of initdb and postgres: $SQLEASE_PG_BIN,
// else the newest /usr/lib/postgresql/*/bin.
func findBin() (string, error) {
	if d := os.Getenv(BinEnv); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin; set " + BinEnv)
}

// Unavailable says why New cannot start a private cluster on this machine
// ("" when it can): no server binaries (looked for in $SQLEASE_PG_BIN,
// else the newest /usr/lib/postgresql/*/bin), or neither root (with an OS
// user postgres) nor OS user postgres.
func Unavailable() string { return unavailable("initdb", "postgres") }

// ReplicationUnavailable is Unavailable for StartStandby and BaseBackup,
// which also need pg_basebackup.
func ReplicationUnavailable() string { return unavailable("initdb", "postgres", "pg_basebackup") }

func unavailable(progs ...string) string {
	bin, err := findBin()
	if err != nil {
		return err.Error()
	}
	for _, b := range progs {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Sprintf("%s not found in %s", b, bin)
		}
	}
	me, err := user.Current()
	if err != nil {
		return "cannot tell the current OS user: " + err.Error()
	}
	if me.Username == "postgres" {
		return ""
	}
	if os.Geteuid() != 0 {
		return "a private PostgreSQL cluster must run as OS user postgres, and this process is neither root nor postgres"
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return "no OS user postgres to run a private PostgreSQL cluster"
	}
	if _, err := exec.LookPath("runuser"); needRunuser && err != nil {
		return "runuser not found (needed to run a private cluster as postgres)"
	}
	return ""
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// newDir makes a Cluster with a new temporary directory owned by the user
// the server runs as, and a free port; the data directory is not made.
func newDir() (*Cluster, error) {
	if why := Unavailable(); why != "" {
		return nil, errors.New(why)
	}
	bin, _ := findBin()
	me, _ := user.Current()
	c := &Cluster{bin: bin, asPostgres: me.Username != "postgres"}
	dir, err := os.MkdirTemp("", "sqlease-pg-")
	if err != nil {
		return nil, err
	}
	c.dir, c.data = dir, filepath.Join(dir, "data")
	if c.asPostgres {
		pu, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		c.uid, _ = strconv.Atoi(pu.Uid)
		c.gid, _ = strconv.Atoi(pu.Gid)
		if err := os.Chown(dir, c.uid, c.gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if c.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// New runs initdb in a new temporary directory and starts the cluster on
// a free port of 127.0.0.1, ready for connections and for standbys.
func New(ctx context.Context, cfg Config) (*Cluster, error) {
	c, err := newDir()
	if err != nil {
		return nil, err
	}
	if out, err := c.run(ctx, "initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(c.dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	// Only 127.0.0.1, and replication connections too (pg_basebackup and
	// standbys).
	hba := "local all all trust\n" +
		"host all all 127.0.0.1/32 trust\n" +
		"host replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(c.data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	// fsync = off survives an immediate shutdown (the OS keeps the written
	// WAL); synchronous_commit stays on, or an acknowledged commit could be
	// lost by a restart.
	conf := "\nlisten_addresses = '127.0.0.1'\nmax_connections = 80\n" +
		"fsync = off\nfull_page_writes = off\nshared_buffers = 16MB\n" +
		"wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = 64MB\nhot_standby = on\n"
	if cfg.SynchronousStandby != "" {
		conf += fmt.Sprintf("synchronous_standby_names = '%s'\n", quoteConf(cfg.SynchronousStandby))
	}
	if cfg.SynchronousCommit != "" {
		conf += fmt.Sprintf("synchronous_commit = '%s'\n", quoteConf(cfg.SynchronousCommit))
	}
	if err := c.appendConf("postgresql.conf", conf+c.localConf()); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

// localConf is the part of postgresql.conf that differs between a cluster
// and a copy of it.
func (c *Cluster) localConf() string {
	return fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\n", c.port, quoteConf(c.dir))
}

func quoteConf(s string) string { return strings.ReplaceAll(s, "'", "''") }

// appendConf appends text to a configuration file in the data directory
// (later settings win over earlier ones).
func (c *Cluster) appendConf(name, text string) error {
	f, err := os.OpenFile(filepath.Join(c.data, name), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.WriteString("\n" + text); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if c.asPostgres {
		return os.Chown(filepath.Join(c.data, name), c.uid, c.gid)
	}
	return nil
}

// run runs one of the server's programs as the server's user, in its
// directory, and returns its output.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := asUserCmd(filepath.Join(c.bin, prog), args, c.uid, c.gid, c.asPostgres)
	cmd.Dir = c.dir
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			if cmd.Process != nil {
				_ = cmd.Process.Kill()
			}
		case <-done:
		}
	}()
	return cmd.CombinedOutput()
}

// Start runs the postmaster of a stopped cluster and waits until it
// accepts connections (a standby: read-only ones). It fails if the
// server is running.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startLocked(ctx)
}

func (c *Cluster) startLocked(ctx context.Context) error {
	if c.server != nil {
		return errors.New("pgcluster: the server is already running")
	}
	logf, err := os.OpenFile(c.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := asUserCmd(filepath.Join(c.bin, "postgres"), []string{"-D", c.data}, c.uid, c.gid, c.asPostgres)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	c.server, c.exited = cmd, exited
	db, err := sql.Open("pgx", c.DSN())
	if err != nil {
		c.stopLocked(true)
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := db.PingContext(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			c.server = nil
			return fmt.Errorf("postgres exited during startup (see %s)", c.LogPath())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.stopLocked(true)
			return fmt.Errorf("postgres did not accept connections within 60s: %v (see %s)", err, c.LogPath())
		}
	}
}

// Stop shuts the postmaster down, fast (SIGINT) or immediate (SIGQUIT: no
// shutdown checkpoint, crash recovery at the next start), and waits for
// it; SIGKILL after 60s. A stopped cluster's Stop does nothing.
func (c *Cluster) Stop(immediate bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked(immediate)
}

func (c *Cluster) stopLocked(immediate bool) {
	if c.server == nil {
		return
	}
	sig := os.Interrupt
	if immediate {
		sig = syscall.SIGQUIT
	}
	_ = c.server.Process.Signal(sig)
	select {
	case <-c.exited:
	case <-time.After(60 * time.Second):
		_ = c.server.Process.Kill()
		<-c.exited
	}
	c.server = nil
}

// Kill crashes the cluster: SIGKILL to the postmaster and (on Linux) every
// backend, as a machine that dies would. It waits for the postmaster to
// be gone. Start recovers from the crash.
func (c *Cluster) Kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server == nil {
		return
	}
	killTree(c.server.Process)
	<-c.exited
	c.server = nil
}

// Restart stops the server (fast or immediate shutdown) and starts it
// again.
func (c *Cluster) Restart(ctx context.Context, immediate bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked(immediate)
	return c.startLocked(ctx)
}

// Remove stops the server (immediate), closes a standby's replication
// proxy and deletes the cluster's directory.
func (c *Cluster) Remove() {
	c.Stop(true)
	if c.link != nil {
		c.link.Close()
	}
	_ = os.RemoveAll(c.dir)
}

// DSN is the superuser DSN of the cluster's postgres database.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the cluster's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Addr is the cluster's address, 127.0.0.1:Port.
func (c *Cluster) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)) }

// LogPath is the server's log file.
func (c *Cluster) LogPath() string { return filepath.Join(c.dir, "server.log") }

// query runs one single-row query on the cluster with a short-lived pool.
func (c *Cluster) query(ctx context.Context, q string, args []any, dest ...any) error {
	db, err := sql.Open("pgx", c.DSN())
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRowContext(ctx, q, args...).Scan(dest...)
}
