package testnote

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSkipLine(t *testing.T) {
	t.Setenv("SQLEASE_POSTGRES_DSN", "")
	t.Setenv("SQLEASE_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
	line := SkipLine("sqlease/x", PostgreSQL, MySQL)
	for _, want := range []string{"sqlease/x: ", "PostgreSQL tests skipped", "SQLEASE_POSTGRES_DSN is not set", "SQLEASE_REQUIRE_POSTGRES=1"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q: want %q", line, want)
		}
	}
	if strings.Contains(line, "MySQL") {
		t.Errorf("%q: MySQL has a DSN, want it left out", line)
	}
	t.Setenv("SQLEASE_POSTGRES_DSN", "postgres://x")
	if line := SkipLine("sqlease/x", PostgreSQL, MySQL); line != "" {
		t.Errorf("every DSN set: got %q, want no line", line)
	}
}

// The go command's standard error is written through /proc only when it is
// a pipe or a terminal: a regular file opened anew has its own offset, and
// the go command's writes (go test ./... > file 2>&1) would overwrite the
// line.
func TestOpenSharedOnlyPipesAndTerminals(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	file, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if f := openShared(fmt.Sprintf("/proc/self/fd/%d", file.Fd())); f != nil {
		f.Close()
		t.Errorf("a regular file was opened for the note; want the fallback to the binary's own stderr")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f := openShared(fmt.Sprintf("/proc/self/fd/%d", w.Fd()))
	if f == nil {
		t.Fatal("a pipe was refused; want it used")
	}
	if _, err := fmt.Fprintln(f, "note"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	buf := make([]byte, 16)
	if n, _ := r.Read(buf); string(buf[:n]) != "note\n" {
		t.Errorf("read %q through the pipe, want %q", buf[:n], "note\n")
	}
	if tty, err := os.OpenFile("/dev/null", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if f := openShared(fmt.Sprintf("/proc/self/fd/%d", tty.Fd())); f == nil {
			t.Errorf("a character device was refused; want it used (terminals are)")
		} else {
			f.Close()
		}
	}
}
