package schedtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Child is a copy of the test binary running one test as another replica.
type Child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr *Buffer
	stdout strings.Builder // the lines Next has read
}

// StartChild re-runs this test binary as a child process running only
// testName, with b (FromEnv) and env added to its environment. The
// child's stdin is closed (the child should then stop) and the child
// waited for when t ends.
func StartChild(t *testing.T, b Backend, testName string, env ...string) *Child {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^"+testName+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), b.Env()...), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), stderr: &Buffer{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	return c
}

// Next reads the child's stdout up to the first line starting with prefix
// and returns the rest of that line, failing t (with the child's stderr)
// if the child ends first.
func (c *Child) Next(t *testing.T, prefix string) string {
	t.Helper()
	for c.lines.Scan() {
		c.stdout.WriteString(c.lines.Text() + "\n")
		if rest, ok := strings.CutPrefix(c.lines.Text(), prefix); ok {
			return rest
		}
	}
	t.Fatalf("child ended before printing %q: %v\n%s", prefix, c.lines.Err(), c.Output())
	return ""
}

// Output returns what the child printed so far, as far as Next has read
// it, and its standard error.
func (c *Child) Output() string { return c.stdout.String() + c.stderr.String() }

// Done reads the child's "done PASSED" line (see PrintDone) and fails t
// with the child's output if the child failed.
func (c *Child) Done(t *testing.T) {
	t.Helper()
	if rest := c.Next(t, "done "); rest != "true" {
		t.Errorf("child failed:\n%s", c.Output())
	}
}

// Stop asks the child to stop (WaitStop returns in the child).
func (c *Child) Stop(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "stop\n"); err != nil {
		t.Fatal(err)
	}
}

// WaitStop, in a child, returns when the parent calls Child.Stop or ends.
func WaitStop() { _, _ = bufio.NewReader(os.Stdin).ReadString('\n') }

// PrintDone, in a child, tells the parent (Child.Done) that it finished
// and whether its test passed, then waits until the parent closes its
// stdin.
func PrintDone(t *testing.T) {
	fmt.Println("done", !t.Failed())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// Kill ends the child with SIGKILL: a replica that crashes, releasing
// nothing.
func (c *Child) Kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

// Buffer is a bytes.Buffer safe for concurrent writers and readers (a
// slog handler's output read by the test).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
