package chaos

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
	"syscall"
	"time"
)

// pgBinEnv overrides where the PostgreSQL server binaries are looked for.
const pgBinEnv = "SQLEASE_PG_BIN"

// pgCluster is a private PostgreSQL cluster the suite starts, restarts and
// removes itself, so restarts hit nothing else. Its postmaster is a child
// of this process running as OS user postgres (on Linux by switching
// credentials, and killed if this process dies; elsewhere via runuser).
type pgCluster struct {
	bin, dir, data string
	port           int
	asPostgres     bool // run the server's programs as OS user postgres
	uid, gid       int
	server         *exec.Cmd     // the running postmaster
	exited         chan struct{} // closed when server exits
}

// findPGBin returns the directory of initdb and postgres: $SQLEASE_PG_BIN,
// else the newest /usr/lib/postgresql/*/bin.
func findPGBin() (string, error) {
	if d := os.Getenv(pgBinEnv); d != "" {
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
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin; set " + pgBinEnv)
}

// PrivateClusterUnavailable says why Run cannot start a private PostgreSQL
// cluster on this machine ("" when it can): no server binaries (looked for
// in $SQLEASE_PG_BIN, else /usr/lib/postgresql/*/bin), or neither root
// (with an OS user postgres) nor OS user postgres.
func PrivateClusterUnavailable() string {
	bin, err := findPGBin()
	if err != nil {
		return err.Error()
	}
	for _, b := range []string{"initdb", "postgres"} {
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
		return "the private PostgreSQL cluster must run as OS user postgres, and this process is neither root nor postgres"
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return "no OS user postgres to run the private PostgreSQL cluster"
	}
	if _, err := exec.LookPath("runuser"); needRunuser && err != nil {
		return "runuser not found (needed to run the private cluster as postgres)"
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

// startPGCluster runs initdb in a new temporary directory and starts the
// server on a free port of 127.0.0.1 with trust authentication.
func startPGCluster(ctx context.Context) (*pgCluster, error) {
	if why := PrivateClusterUnavailable(); why != "" {
		return nil, errors.New(why)
	}
	bin, _ := findPGBin()
	me, _ := user.Current()
	c := &pgCluster{bin: bin, asPostgres: me.Username != "postgres"}
	dir, err := os.MkdirTemp("", "sqlease-chaos-pg-")
	if err != nil {
		return nil, err
	}
	c.dir, c.data = dir, filepath.Join(dir, "data")
	if c.asPostgres {
		pu, err := user.Lookup("postgres")
		if err != nil {
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
	if out, err := c.run(ctx, "initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	// fsync = off survives an immediate shutdown (the OS keeps the
	// written WAL); synchronous_commit stays on, or an acknowledged commit
	// could be lost by the restart fault.
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nmax_connections = 80\n"+
		"fsync = off\nfull_page_writes = off\nshared_buffers = 16MB\n", c.port, c.dir)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		f.Close()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func (c *pgCluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
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

// start runs the postmaster and waits until it accepts connections.
func (c *pgCluster) start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(c.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
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
			return fmt.Errorf("postgres exited during startup (see %s)", filepath.Join(c.dir, "server.log"))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.stop(true)
			return fmt.Errorf("postgres did not accept connections within 60s: %v (see %s)", err, filepath.Join(c.dir, "server.log"))
		}
	}
}

// stop shuts the postmaster down, fast (SIGINT) or immediate (SIGQUIT,
// like a crash), and waits for it; SIGKILL after 60s.
func (c *pgCluster) stop(immediate bool) {
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

// DSN is the superuser DSN of the cluster's postgres database.
func (c *pgCluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Restart stops the server (fast or immediate shutdown) and starts it again.
func (c *pgCluster) Restart(ctx context.Context, immediate bool) error {
	c.stop(immediate)
	return c.start(ctx)
}

// Remove stops the server and deletes its directory.
func (c *pgCluster) Remove() {
	c.stop(true)
	_ = os.RemoveAll(c.dir)
}
