package lock_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// startChild re-runs this test binary as a child process running only
// test testName, with env added to its environment. It returns the child's
// stdin and next, which reads the child's stdout up to the first line
// starting with prefix and returns the rest of that line (failing t, with
// the child's stderr, if the child ends first). The child's stdin is closed
// and the child waited for when t ends.
func startChild(ctx context.Context, t *testing.T, testName string, env ...string) (io.Writer, func(prefix string) string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+testName+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	next := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				return rest
			}
		}
		t.Fatalf("child %s ended before %q: %v\n%s", testName, prefix, lines.Err(), stderr.String())
		return ""
	}
	return stdin, next
}
