package main

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/cli"
)

// proseFlags are the flags README's paragraph above the command table
// describes for every command that has them; the table may leave them out
// (except for check, whose row lists every flag).
var proseFlags = []string{"dsn", "dialect", "schema", "prefix"}

// TestReadmeCommandTable compares README's table of sqlease commands with
// the flags the commands really have (as `sqlease help COMMAND` lists
// them): every command has a row, every flag a row names exists, and every
// flag of a command is in its row, or is one of proseFlags.
func TestReadmeCommandTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{} // command -> flags named in its row
	rowRE := regexp.MustCompile("(?m)^\\| `sqlease ([a-z]+)((?:[^`]|\\\\`)*)` \\|")
	for _, m := range rowRE.FindAllStringSubmatch(string(readme), -1) {
		if _, dup := rows[m[1]]; dup {
			t.Errorf("README: two rows for sqlease %s", m[1])
		}
		rows[m[1]] = []string{}
		for _, f := range regexp.MustCompile(`--([a-z][a-z-]*)`).FindAllStringSubmatch(m[2], -1) {
			rows[m[1]] = append(rows[m[1]], f[1])
		}
	}
	if len(rows) == 0 {
		t.Fatal("README: no command table rows (| `sqlease COMMAND ...` |)")
	}

	help := run(t, "help")
	_, list, _ := strings.Cut(help, "\nCommands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var commands []string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+)  +\S`).FindAllStringSubmatch(list, -1) {
		if m[1] != "help" {
			commands = append(commands, m[1])
		}
	}
	if !slices.Contains(commands, "check") || !slices.Contains(commands, "chaos") {
		t.Fatalf("sqlease help lists %q; want check and chaos among them:\n%s", commands, help)
	}
	for _, c := range commands {
		listed, ok := rows[c]
		if !ok {
			t.Errorf("README: no row for sqlease %s", c)
			continue
		}
		var real []string
		for _, m := range regexp.MustCompile(`(?m)^  --([a-z][a-z-]*)`).FindAllStringSubmatch(run(t, "help", c), -1) {
			real = append(real, m[1])
		}
		for _, f := range listed {
			if !slices.Contains(real, f) {
				t.Errorf("README: the row of sqlease %s names --%s, which it does not have (it has --%s)", c, f, strings.Join(real, ", --"))
			}
		}
		for _, f := range real {
			if !slices.Contains(listed, f) && (c == "check" || !slices.Contains(proseFlags, f)) {
				t.Errorf("README: the row of sqlease %s leaves out its flag --%s", c, f)
			}
		}
	}
	for c := range rows {
		if !slices.Contains(commands, c) {
			t.Errorf("README: a row for sqlease %s, which sqlease help does not list", c)
		}
	}
}

// run runs the tool in-process and returns its standard output; it fails
// the test unless the exit code is 0.
func run(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := cli.Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("sqlease %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String()
}
