package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// The handoff figure needs a waiter in another process, so that a release
// reaches it the way it reaches another replica: through PostgreSQL
// LISTEN/NOTIFY (or, on SQLite, through its watch of the database file), not through the
// in-process hub. The bench re-executes itself with childEnv set; the
// child reads commands from stdin and answers on stdout:
//
//	parent: acquire <key>
//	child:  granted <key> <unix nanoseconds at grant>   (then it releases)
//	child:  error <key> <message>

// Environment of a child process.
const (
	childEnv        = "SQLEASE_BENCH_CHILD" // "waiter"
	childDialectEnv = "SQLEASE_BENCH_DIALECT"
	childDSNEnv     = "SQLEASE_BENCH_DSN"
	childSchemaEnv  = "SQLEASE_BENCH_SCHEMA"
)

// childMain is the child process: one Locker that acquires what it is told
// to, reports the grant time and releases at once.
func childMain() int {
	ctx := context.Background()
	d, drv := benchDialect(os.Getenv(childDialectEnv))
	db, err := sql.Open(drv, os.Getenv(childDSNEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer db.Close()
	db.SetMaxIdleConns(8)
	e := &env{d: d, ns: dialect.Namespace{Schema: os.Getenv(childSchemaEnv)}, quiet: quietLogger()}
	l, err := e.newLocker(ctx, db)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer closeLocker(l)
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	say("ready")
	var wg sync.WaitGroup
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, key, _ := strings.Cut(sc.Text(), " ")
		if cmd != "acquire" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			le, err := l.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(30*time.Second))
			at := time.Now().UnixNano()
			if err != nil {
				say("error %s %v", key, strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			if err := le.Release(ctx); err != nil {
				say("error %s %v", key, strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			say("granted %s %d", key, at)
		}()
	}
	wg.Wait()
	return 0
}

// child is the parent's handle on a child process.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startChild starts a waiter process on e's database and waits for it to
// be ready.
func startChild(ctx context.Context, e *env) (*child, error) {
	return startChildMode(ctx, e, "waiter")
}

// startChildMode starts a child process of the given kind ("waiter",
// "herd") and waits for it to be ready.
func startChildMode(ctx context.Context, e *env, mode string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childDialectEnv+"="+e.dialect, childDSNEnv+"="+e.dsn, childSchemaEnv+"="+e.schema)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	if line, err := c.recv(30 * time.Second); err != nil || line != "ready" {
		c.stop()
		return nil, fmt.Errorf("child did not start: %q %v", line, err)
	}
	return c, nil
}

// send writes one command line.
func (c *child) send(line string) error {
	_, err := io.WriteString(c.in, line+"\n")
	return err
}

// recv reads one line, waiting at most timeout.
func (c *child) recv(timeout time.Duration) (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("child exited")
		}
		return line, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer from child within %s", timeout)
	}
}

// stop closes the child's stdin (it then exits) and waits for it.
func (c *child) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() {
		_ = c.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}
