package cli

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/advice"
	"github.com/sqlease/sqlease/internal/testnote"
	"github.com/sqlease/sqlease/lock"
)

// TestMain lets multi-process conformance cases re-execute this test
// binary as a child, as they re-execute the sqlease binary.
func TestMain(m *testing.M) {
	if conformance.IsChild() {
		os.Exit(conformance.ChildMain())
	}
	testnote.Skipped("sqlease/cli", testnote.PostgreSQL, testnote.MySQL)
	// Confirmation prompts never wait on the test's stdin.
	stdinIsTerminal = func() bool { return false }
	os.Exit(m.Run())
}

// unreachableDSN points at a port nothing listens on.
const unreachableDSN = "postgres://root@127.0.0.1:1/x?sslmode=disable&connect_timeout=5"

// summaryRE matches check's final line.
var summaryRE = regexp.MustCompile(`(?m)^(\d+) passed, (\d+) failed, (\d+) skipped$`)

type result struct {
	code           int
	stdout, stderr string
}

// cli runs the program in-process.
func cli(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// sqliteFile returns the path of a new (absent) SQLite database file.
func sqliteFile(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "locks.db")
}

// migrated returns the path of a SQLite file migrated with `sqlease
// migrate`.
func migrated(t *testing.T) string {
	t.Helper()
	path := sqliteFile(t)
	r := cli(t, "migrate", "--dsn", path)
	if r.code != 0 || !strings.Contains(r.stdout, "OK   00001_") {
		t.Fatalf("migrate: want exit 0 and an applied migration, got %v", r)
	}
	return path
}

// locker opens a Locker on the SQLite file at path.
func locker(t *testing.T, path string, opts ...lock.Option) *lock.Locker {
	t.Helper()
	db, err := sql.Open("sqlite", conftest.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	l, err := lock.New(t.Context(), db, sqlitedialect.New(), opts...)
	if err != nil {
		t.Fatalf("lock.New: %v", err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// summary checks that out ends with a summary line and returns its counts.
func summary(t *testing.T, r result) (passed, failed, skipped int) {
	t.Helper()
	m := summaryRE.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no summary line %q in output: %v", summaryRE, r)
	}
	passed, _ = strconv.Atoi(m[1])
	failed, _ = strconv.Atoi(m[2])
	skipped, _ = strconv.Atoi(m[3])
	return
}

// checkRun runs a check command line and returns its result. The cases
// belong to package conformance and some are timing-sensitive (a 300 ms TTL
// renewed within 60 ms) on a loaded two-core machine, so when cases fail
// (exit 1 with a summary) the run is repeated, up to three runs in all,
// logging each failed run; what these tests assert is the command's
// behaviour, not the suite's. They also run at most two cases at once, as
// go test would on two cores.
func checkRun(t *testing.T, run func() result) result {
	t.Helper()
	var r result
	for attempt := 1; attempt <= 3; attempt++ {
		r = run()
		m := summaryRE.FindStringSubmatch(r.stdout)
		if r.code != 1 || m == nil || m[2] == "0" {
			break
		}
		t.Logf("check run %d: a conformance case failed:\n%v", attempt, r)
	}
	return r
}

// lightCases returns a --run expression selecting the S1 and S3 cases
// except the stress ones. A stress case runs 16 goroutines and two child
// processes for seconds and opens about 35 connections; under go test ./...
// the dialect suites run theirs at the same moment (PostgreSQL allows 100
// connections by default). TestCheckBinary runs the stress cases through
// the real binary; the dialect suites run them under go test.
func lightCases(t *testing.T) string {
	t.Helper()
	var names []string
	for _, c := range conformance.Cases() {
		if regexp.MustCompile(`^S[13]_`).MatchString(c.Name) && !strings.Contains(c.Name, "Stress") {
			names = append(names, regexp.QuoteMeta(c.Name))
		}
	}
	if len(names) == 0 {
		t.Fatal("no S1 or S3 conformance case without Stress in its name")
	}
	return "^(" + strings.Join(names, "|") + ")$"
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}} {
		r := cli(t, args...)
		if r.code != 0 {
			t.Fatalf("%v: %v", args, r)
		}
		for _, want := range []string{"check", "migrate", "status", "sweep", "drop", "version", "--yes", "--dsn", "--run", "--parallel", "--limit", "--json", "--schema", "--prefix", "SQLEASE_DSN"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%v: help lacks %q:\n%s", args, want, r.stdout)
			}
		}
	}
	if r := cli(t, "help", "help"); r.code != 0 || !strings.HasPrefix(r.stdout, "Usage: sqlease help [command]") {
		t.Errorf("help help: want its usage line, exit 0; got %v", r)
	}
	for _, args := range [][]string{{"help", "sweep"}, {"sweep", "--help"}} {
		r := cli(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "  --limit N\n") || !strings.Contains(r.stdout, "(default 1000)") {
			t.Errorf("%v: want exit 0 and the sweep flags, got %v", args, r)
		}
	}
	// Every command's help spells flags --flag, as the top-level help does.
	for _, c := range commands() {
		if c.setup == nil {
			continue
		}
		r := cli(t, "help", c.name)
		if r.code != 0 || !strings.Contains(r.stdout, "  --") {
			t.Errorf("help %s: want --flags, got %v", c.name, r)
		}
		if m := regexp.MustCompile(`(?m)^\s+-[a-z]`).FindString(r.stdout); m != "" {
			t.Errorf("help %s: a flag spelled -flag (%q):\n%s", c.name, m, r.stdout)
		}
	}
}

func TestBadUsageExits2(t *testing.T) {
	t.Setenv(dsnEnv, "")
	path := migrated(t)
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{nil, "Usage"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"check", "--no-such-flag"}, "no-such-flag"},
		{[]string{"check", "--parallel", "0"}, "--parallel"},
		{[]string{"check", "--timeout", "0s"}, "--timeout"},
		{[]string{"check", "--run", "("}, "--run"},
		{[]string{"check", "--run", "^NoSuchCase$"}, "no conformance case"},
		{[]string{"check", "--dialect", "oracle", "--dsn", "x"}, "postgres, sqlite"},
		{[]string{"check", "--dialect", "postgres"}, "--dsn"},
		{[]string{"check", "extra"}, "unexpected argument"},
		{[]string{"status"}, "SQLEASE_DSN"},
		{[]string{"status", "--dsn", "host=localhost dbname=x"}, "--dialect"},
		{[]string{"status", "--dsn", path, "--dialect", "nosuch"}, "postgres, sqlite"},
		{[]string{"status", "--dsn", path, "--prefix", "Bad-Prefix"}, "prefix"},
		{[]string{"status", "--dsn", filepath.Join(t.TempDir(), "absent.db")}, "no such file"},
		{[]string{"sweep", "--dsn", path, "--limit", "0"}, "--limit"},
		{[]string{"sweep", "--dsn", path, "--limit", "-5"}, "--limit"},
		{[]string{"sweep", "--dsn", path, "--schema", "app"}, "schema"},
		{[]string{"migrate", "sideways", "--dsn", path}, `unknown action "sideways": want up, status or down; run 'sqlease help migrate'`},
		{[]string{"migrate", "up", "extra", "--dsn", path}, `unexpected argument "extra"; run 'sqlease help migrate'`},
		{[]string{"status", "extra"}, `unexpected argument "extra"; run 'sqlease help status'`},
		{[]string{"help", "status", "extra"}, `sqlease help: unexpected argument "extra"; run 'sqlease help'`},
		// Key prefixes are validated like keys (lock.CheckKeyPrefix).
		{[]string{"status", "--dsn", path, "--key", "\xff\xfe"}, `invalid --key "\xff\xfe": is not valid UTF-8`},
		{[]string{"status", "--dsn", path, "--key", "a\x00b"}, "contains NUL"},
		{[]string{"status", "--dsn", path, "--key", strings.Repeat("k", 2000)}, "is 2000 bytes"},
		// Reserved and invalid schemas, before any database is reached.
		{[]string{"status", "--dsn", unreachableDSN, "--schema", "pg_catalog"}, `invalid --schema "pg_catalog": is reserved`},
		{[]string{"migrate", "--dsn", unreachableDSN, "--schema", "information_schema"}, `invalid --schema "information_schema"`},
		{[]string{"sweep", "--dsn", "mysql://root@127.0.0.1:1/x", "--schema", "mysql"}, `invalid --schema "mysql"`},
		{[]string{"status", "--dsn", unreachableDSN, "--schema", "Bad-Schema"}, `invalid --schema "Bad-Schema"`},
		{[]string{"drop", "--dsn", path, "--prefix", "X"}, `invalid --prefix "X"`},
		// Destroying needs --yes when stdin is not a terminal.
		{[]string{"drop", "--dsn", path}, "00001_lock_tables.sql (dropping the lock tables with every lease in them) and drop tables"},
		{[]string{"migrate", "down", "--dsn", path}, "pass --yes"},
		{[]string{"drop", "--dsn", path, "extra"}, "unexpected argument"},
		{[]string{"version", "extra"}, "unexpected argument"},
		{[]string{"check", "--dsn", path, "--json", "--run", "("}, "--run"},
	} {
		r := cli(t, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: want exit 2 with %q on stderr, got %v", tc.args, tc.want, r)
		}
		if r.code == 2 && len(tc.args) > 0 && len(strings.Split(strings.TrimSpace(r.stderr), "\n")) != 1 {
			t.Errorf("%q: want a one-line reason, got %q", tc.args, r.stderr)
		}
	}
}

func TestUnreachableDatabaseExits2(t *testing.T) {
	for _, args := range [][]string{
		{"check", "--dsn", unreachableDSN},
		{"migrate", "--dsn", unreachableDSN},
		{"migrate", "status", "--dsn", unreachableDSN},
		{"status", "--dsn", unreachableDSN},
		{"sweep", "--dsn", unreachableDSN},
	} {
		r := cli(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "cannot reach") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%q: want exit 2 and one line saying the database cannot be reached, got %v", args, r)
		}
		if summaryRE.MatchString(r.stdout) {
			t.Errorf("%q: ran cases against an unreachable database: %v", args, r)
		}
	}
}

func TestMissingSchemaExits2(t *testing.T) {
	path := sqliteFile(t)
	if err := os.WriteFile(path, nil, 0o600); err != nil { // an empty SQLite database
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"status", "--dsn", path},
		{"status", "--dsn", path, "--json"},
		{"sweep", "--dsn", path},
		{"status", "--dsn", migrated(t), "--prefix", "other_"},
	} {
		r := cli(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "sqlease migrate") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%q: want exit 2 and one line saying to run `sqlease migrate`, got %v", args, r)
		}
	}
	r := cli(t, "migrate", "status", "--dsn", path)
	if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+00001_\S+\s+no$`).MatchString(r.stdout) {
		t.Errorf("migrate status on an empty database: want migration 1 not applied, got %v", r)
	}
	if !regexp.MustCompile(`(?m)^database at version 0 of \d+: run ` + "`sqlease migrate up --dsn DSN`").MatchString(r.stdout) {
		t.Errorf("migrate status on an empty database: want a line saying version 0 and to migrate, got %v", r)
	}
	// The suggested command names the namespace it was asked about.
	r = cli(t, "migrate", "status", "--dsn", path, "--prefix", "app_")
	if r.code != 0 || !strings.Contains(r.stdout, "run `sqlease migrate up --dsn DSN --prefix app_`") {
		t.Errorf("migrate status --prefix app_: want the suggestion to carry --prefix app_, got %v", r)
	}
}

// TestMigrateStatusExitsZero: migrate status reports and exits 0 with
// migrations pending, up to date and on a database newer than the build,
// as its help says; --json tells pending apart by version < latest.
func TestMigrateStatusExitsZero(t *testing.T) {
	path := sqliteFile(t)
	if err := os.WriteFile(path, nil, 0o600); err != nil { // an empty SQLite database
		t.Fatal(err)
	}
	status := func(want string, pending bool) {
		t.Helper()
		r := cli(t, "migrate", "status", "--dsn", path)
		if r.code != 0 || !regexp.MustCompile(`(?m)^database at version `+want).MatchString(r.stdout) {
			t.Errorf("migrate status: want exit 0 and a last line %q, got %v", want, r)
		}
		r = cli(t, "migrate", "status", "--dsn", path, "--json")
		var res migrateJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Latest < 1 || (res.Version < res.Latest) != pending {
			t.Errorf("migrate status --json: want exit 0 and version < latest %v, got %v", pending, r)
		}
	}
	status(`0 of \d+: run `+"`sqlease migrate up", true)
	if r := cli(t, "migrate", "up", "--dsn", path); r.code != 0 {
		t.Fatalf("migrate up: %v", r)
	}
	status(`\d+ of \d+: up to date`, false)
	db, err := sql.Open("sqlite", conftest.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("INSERT INTO sqlease_db_version (version_id, is_applied) VALUES (9999, 1)"); err != nil {
		t.Fatal(err)
	}
	status(`9999, newer than this build's \d+: upgrade sqlease`, false)

	r := cli(t, "help", "migrate")
	if r.code != 0 || !strings.Contains(oneLine(r.stdout), "migrate status only reports: it exits 0 whether the database is up to date, has migrations pending or is newer than this build") {
		t.Errorf("help migrate: want the exit code of migrate status documented, got %v", r)
	}
	if r := cli(t, "help"); !strings.Contains(oneLine(r.stdout), "migrate status exits 0 with migrations pending") {
		t.Errorf("help: want the exit code of migrate status documented, got %v", r)
	}
}

// TestMigrateAdviceIsOneWording: migrate status, status, sweep and
// lock.New word the advice to migrate the same way (advice.MigrateUp),
// naming the namespace, and the command it names works.
func TestMigrateAdviceIsOneWording(t *testing.T) {
	// A namespace the user named may be a typo: migrating it would make a
	// second set of lock tables that excludes nothing in the first. The
	// default namespace gets no caution.
	const prefixCaution = `Before you do, check the table prefix "app_": if it is mistyped, migrating creates a second, separate set of lock tables, and leases in it do not exclude leases in the tables you meant`
	for _, ns := range []dialect.Namespace{{}, {Prefix: "app_"}} {
		path := sqliteFile(t)
		if err := os.WriteFile(path, nil, 0o600); err != nil { // an empty SQLite database
			t.Fatal(err)
		}
		var nsFlags []string
		wantCmd := "run `sqlease migrate up --dsn DSN` (from Go: migrate.Up) before using the lock tables"
		if ns.Prefix != "" {
			nsFlags = []string{"--prefix", ns.Prefix}
			wantCmd = "run `sqlease migrate up --dsn DSN --prefix app_` (from Go: migrate.Up with migrate.WithNamespace(dialect.Namespace{Prefix: \"app_\"})) before using the lock tables"
		}
		if got := advice.MigrateUp(ns); got != wantCmd {
			t.Fatalf("advice.MigrateUp(%+v) = %q, want %q", ns, got, wantCmd)
		}
		r := cli(t, append([]string{"migrate", "status", "--dsn", path}, nsFlags...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "database at version 0 of ") || !strings.Contains(r.stdout, wantCmd) {
			t.Errorf("migrate status %v: want exit 0 and %q, got %v", nsFlags, wantCmd, r)
		}
		if got := strings.Contains(oneLine(r.stdout), prefixCaution); got != (ns.Prefix != "") {
			t.Errorf("migrate status %v: caution about a mistyped --prefix shown %v, want %v: %v", nsFlags, got, ns.Prefix != "", r)
		}
		for _, cmd := range []string{"status", "sweep"} {
			r := cli(t, append([]string{cmd, "--dsn", path}, nsFlags...)...)
			if r.code != 2 || !strings.Contains(r.stderr, wantCmd) {
				t.Errorf("%s %v: want exit 2 and %q, got %v", cmd, nsFlags, wantCmd, r)
			}
			if got := strings.Contains(oneLine(r.stderr), prefixCaution); got != (ns.Prefix != "") {
				t.Errorf("%s %v: caution about a mistyped --prefix shown %v, want %v: %v", cmd, nsFlags, got, ns.Prefix != "", r)
			}
		}
		db, err := sql.Open("sqlite", conftest.SQLiteDSN(path))
		if err != nil {
			t.Fatal(err)
		}
		_, err = lock.New(t.Context(), db, sqlitedialect.New(), lock.WithTablePrefix(ns.Prefix))
		db.Close()
		if !errors.Is(err, lock.ErrSchemaNotMigrated) || !strings.Contains(err.Error(), wantCmd) {
			t.Errorf("lock.New with prefix %q: want ErrSchemaNotMigrated saying %q, got %v", ns.Prefix, wantCmd, err)
		}
		// A library user's mistyped WithTablePrefix is cautioned about
		// the same way.
		if got := err != nil && strings.Contains(err.Error(), prefixCaution); got != (ns.Prefix != "") {
			t.Errorf("lock.New with prefix %q: caution about a mistyped prefix shown %v, want %v: %v", ns.Prefix, got, ns.Prefix != "", err)
		}
		// The advised command line works as given.
		line := strings.Split(wantCmd, "`")[1]
		args := strings.Fields(strings.Replace(strings.TrimPrefix(line, "sqlease "), "DSN", path, 1))
		if r := cli(t, args...); r.code != 0 || !strings.Contains(r.stdout, "migrated to version") {
			t.Errorf("the advised %q: want exit 0 and the tables migrated, got %v", args, r)
		}
		if r := cli(t, append([]string{"status", "--dsn", path}, nsFlags...)...); r.code != 0 {
			t.Errorf("status %v after the advised migrate: want exit 0, got %v", nsFlags, r)
		}
	}
}

// TestMigrateAdviceRunsAsPrinted: the CLI's advice to migrate repeats the
// connection flags the user gave (--dialect as given; --dsn only as a
// placeholder, and not at all when the DSN came from $SQLEASE_DSN), so the
// command it prints runs as printed, with the user's DSN in place of DSN.
func TestMigrateAdviceRunsAsPrinted(t *testing.T) {
	path := sqliteFile(t)
	if err := os.WriteFile(path, nil, 0o600); err != nil { // an empty SQLite database
		t.Fatal(err)
	}
	advised := regexp.MustCompile("run `(sqlease migrate up[^`]*)`")
	for _, tc := range []struct {
		env  bool     // the DSN from $SQLEASE_DSN
		args []string // the command's flags besides --dsn
		want string   // the advised command
	}{
		{false, []string{"--dialect", "sqlite"}, "sqlease migrate up --dialect sqlite --dsn DSN"},
		{true, []string{"--dialect", "sqlite", "--prefix", "app_"}, "sqlease migrate up --dialect sqlite --prefix app_"},
		{true, nil, "sqlease migrate up"},
	} {
		t.Setenv(dsnEnv, "")
		args := append([]string{"status"}, tc.args...)
		if tc.env {
			t.Setenv(dsnEnv, path)
		} else {
			args = append(args, "--dsn", path)
		}
		r := cli(t, args...)
		m := advised.FindStringSubmatch(r.stderr)
		if r.code != 2 || m == nil || m[1] != tc.want {
			t.Errorf("%q (DSN from env %v): want exit 2 advising %q, got %v", args, tc.env, tc.want, r)
			continue
		}
		// Run the advice as printed (the DSN where it says DSN).
		run := strings.Fields(strings.TrimPrefix(m[1], "sqlease "))
		for i, a := range run {
			if a == "DSN" {
				run[i] = path
			}
		}
		if r := cli(t, run...); r.code != 0 {
			t.Errorf("advised %q: want exit 0, got %v", run, r)
		}
		if r := cli(t, args...); r.code != 0 {
			t.Errorf("%q after the advised command: want exit 0, got %v", args, r)
		}
		// Fresh, unmigrated tables for the next case.
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Remove(path + "-wal")
		os.Remove(path + "-shm")
	}
}

func TestMigrate(t *testing.T) {
	path := sqliteFile(t)
	r := cli(t, "migrate", "up", "--dsn", "sqlite:"+path)
	// goose-style lines with timing, then the version reached.
	if r.code != 0 || !regexp.MustCompile(`^OK   00001_lock_tables\.sql \([0-9.]+[µm]?s\)\n(OK   0000\d_\S+\.sql \([0-9.]+[µm]?s\)\n)*migrated to version \d+ in [0-9.]+[µm]?s \(table sqlease_db_version\)\n$`).MatchString(r.stdout) {
		t.Fatalf("migrate up: want OK lines with durations and a final line, got %v", r)
	}
	t.Setenv(dsnEnv, path)
	r = cli(t, "migrate")
	if r.code != 0 || !strings.Contains(r.stdout, "already up to date") {
		t.Fatalf("second migrate (DSN from $%s): want already up to date, got %v", dsnEnv, r)
	}
	r = cli(t, "migrate", "status")
	if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+00001_\S+\s+yes$`).MatchString(r.stdout) {
		t.Fatalf("migrate status: want migration 1 applied, got %v", r)
	}
	if !regexp.MustCompile(`(?m)^database at version (\d+) of (\d+): up to date \(table sqlease_db_version\)$`).MatchString(r.stdout) {
		t.Fatalf("migrate status: want a line saying the database is up to date, got %v", r)
	}
	// A second namespace in the same file is independent.
	r = cli(t, "migrate", "status", "--prefix", "other_")
	if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+00001_\S+\s+no$`).MatchString(r.stdout) {
		t.Fatalf("migrate status --prefix other_: want migration 1 not applied, got %v", r)
	}
}

// statusJSON reads `sqlease status --json` output.
func statusJSON(t *testing.T, args ...string) []holderJSON {
	t.Helper()
	r := cli(t, append([]string{"status", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("status --json: %v", r)
	}
	var out []holderJSON
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var raw map[string]any
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			t.Fatalf("status --json line %q: %v", sc.Text(), err)
		}
		for _, f := range []string{"key", "mode", "owner", "lease_id", "token", "expires_at", "expires_in_ms", "expired", "pending_writer", "queue_position"} {
			if _, ok := raw[f]; !ok {
				t.Errorf("status --json line %q lacks field %q", sc.Text(), f)
			}
		}
		var h holderJSON
		if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func TestStatusShowsLeases(t *testing.T) {
	path := migrated(t)
	a := locker(t, path, lock.WithOwner("worker-a"), lock.WithTTL(time.Minute))
	b := locker(t, path, lock.WithOwner("worker-b"), lock.WithTTL(time.Minute))
	ctx := t.Context()
	x, err := a.TryAcquire(ctx, "jobs/nightly", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.TryAcquire(ctx, "reports/q3", lock.Shared)
	if err != nil {
		t.Fatal(err)
	}

	r := cli(t, "status", "--dsn", path)
	if r.code != 0 {
		t.Fatalf("status: %v", r)
	}
	if !strings.HasPrefix(r.stdout, "KEY") || !regexp.MustCompile(`^KEY\s+MODE\s+OWNER\s+LEASE ID\s+TOKEN\s+QUEUE\s+EXPIRES IN\n`).MatchString(r.stdout) {
		t.Errorf("status: want a header line KEY MODE OWNER LEASE ID TOKEN QUEUE EXPIRES IN, got %v", r)
	}
	wantRow := regexp.MustCompile(fmt.Sprintf(`(?m)^jobs/nightly\s+exclusive\s+worker-a\s+%s\s+%d\s+-\s+[0-9.]+s$`, x.LeaseID(), x.Token()))
	if !wantRow.MatchString(r.stdout) {
		t.Errorf("status: want a row for the exclusive lease (token %d), got %v", x.Token(), r)
	}
	wantRow = regexp.MustCompile(fmt.Sprintf(`(?m)^reports/q3\s+shared\s+worker-b\s+%s\s+%d\s+`, s.LeaseID(), s.Token()))
	if !wantRow.MatchString(r.stdout) {
		t.Errorf("status: want a row for the shared lease (token %d), got %v", s.Token(), r)
	}

	hs := statusJSON(t, "--dsn", path, "--key", "jobs/")
	if len(hs) != 1 {
		t.Fatalf("status --json --key jobs/: want 1 lease, got %+v", hs)
	}
	h := hs[0]
	if h.Key != "jobs/nightly" || h.Mode != "exclusive" || h.Owner != "worker-a" || h.LeaseID != x.LeaseID() || h.Token != x.Token() || h.Expired || h.PendingWriter {
		t.Errorf("status --json: want the exclusive lease token %d of worker-a, got %+v", x.Token(), h)
	}
	if h.ExpiresInMS <= 0 || h.ExpiresInMS > time.Minute.Milliseconds() {
		t.Errorf("status --json: expires_in_ms %d, want in (0, 60000]", h.ExpiresInMS)
	}
	at, err := time.Parse(time.RFC3339Nano, h.ExpiresAt)
	if err != nil || at.Sub(x.Expiry()).Abs() > time.Minute {
		t.Errorf("status --json: expires_at %q (%v), want RFC3339Nano near %v", h.ExpiresAt, err, x.Expiry())
	}

	// A waiting writer shows up as a pending-writer marker.
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := locker(t, path, lock.WithOwner("worker-c"), lock.WithTTL(time.Minute))
		if le, err := c.Acquire(wctx, "reports/q3", lock.Exclusive); err == nil {
			le.Release(context.Background())
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	var marker *holderJSON
	for marker == nil && time.Now().Before(deadline) {
		for _, h := range statusJSON(t, "--dsn", path, "--key", "reports/") {
			if h.PendingWriter {
				marker = &h
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if marker == nil {
		t.Fatalf("status --json: no pending_writer row while a writer waits")
	}
	if marker.Mode != "pending-writer" || marker.Owner != "worker-c" || marker.Key != "reports/q3" {
		t.Errorf("status --json: want worker-c's pending-writer marker on reports/q3, got %+v", *marker)
	}
}

func TestStatusShowsExpired(t *testing.T) {
	path := migrated(t)
	l := locker(t, path, lock.WithTTL(lock.MinTTL))
	le, err := l.TryAcquire(t.Context(), "crashed", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	le.Orphan() // the holder "crashes": no renewal, no release
	time.Sleep(lock.MinTTL + 100*time.Millisecond)
	hs := statusJSON(t, "--dsn", path)
	if len(hs) != 1 || !hs[0].Expired || hs[0].ExpiresInMS >= 0 || hs[0].Token != le.Token() {
		t.Fatalf("status --json: want one expired row with negative expires_in_ms, got %+v", hs)
	}
	r := cli(t, "status", "--dsn", path)
	if !regexp.MustCompile(`(?m)^crashed\s+exclusive\s+.*\s-[0-9.]+m?s \(expired\)$`).MatchString(r.stdout) {
		t.Errorf("status: want the row shown as expired, got %v", r)
	}
}

func TestSweepHonoursLimit(t *testing.T) {
	path := migrated(t)
	l := locker(t, path, lock.WithTTL(lock.MinTTL))
	const n = 5
	for i := 0; i < n; i++ {
		le, err := l.TryAcquire(t.Context(), fmt.Sprintf("k%d", i), lock.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		le.Orphan()
	}
	live := locker(t, path, lock.WithTTL(time.Minute))
	keep, err := live.TryAcquire(t.Context(), "live", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(lock.MinTTL + 100*time.Millisecond)
	swept := func(args ...string) int {
		t.Helper()
		r := cli(t, append([]string{"sweep", "--dsn", path}, args...)...)
		m := regexp.MustCompile(`swept (\d+) .*the lock tables went from (\d+) to (\d+) rows`).FindStringSubmatch(r.stdout)
		if r.code != 0 || m == nil {
			t.Fatalf("sweep %v: %v", args, r)
		}
		got, _ := strconv.Atoi(m[1])
		before, _ := strconv.Atoi(m[2])
		after, _ := strconv.Atoi(m[3])
		// Every holder row swept is a row gone, and nothing else runs here.
		if before-after < got {
			t.Errorf("sweep %v: swept %d holder rows, but the tables went from %d to %d rows", args, got, before, after)
		}
		return got
	}
	first := swept("--limit", "2")
	if first < 1 || first > 2 {
		t.Fatalf("sweep --limit 2 removed %d rows, want 1 or 2", first)
	}
	if left := len(statusJSON(t, "--dsn", path)); left != n+1-first {
		t.Errorf("after sweep --limit 2 removed %d: %d rows left, want %d", first, left, n+1-first)
	}
	if second := swept(); second != n-first {
		t.Errorf("sweep without limit removed %d, want the other %d expired rows", second, n-first)
	}
	hs := statusJSON(t, "--dsn", path)
	if len(hs) != 1 || hs[0].Key != "live" || hs[0].Token != keep.Token() {
		t.Errorf("after sweeping: want only the live lease left, got %+v", hs)
	}
}

func TestCheckSQLite(t *testing.T) {
	// The check's temporary directory is made under $TMPDIR; it must be
	// gone afterwards.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv(dsnEnv, "")
	r := checkRun(t, func() result { return cli(t, "check", "--run", lightCases(t), "--parallel", "2") })
	passed, failed, _ := summary(t, r)
	if r.code != 0 || failed != 0 || passed == 0 {
		t.Fatalf("check on SQLite: want exit 0 and passing cases, got %v", r)
	}
	selected := regexp.MustCompile(lightCases(t))
	for _, c := range conformance.Cases() {
		if !selected.MatchString(c.Name) {
			if strings.Contains(r.stdout, c.Name) {
				t.Errorf("--run %s ran %s", selected, c.Name)
			}
			continue
		}
		if !regexp.MustCompile(`(?m)^` + c.Name + `\s+(PASS|SKIP)\s+[0-9.]+s$`).MatchString(r.stdout) {
			t.Errorf("no result line for %s in %v", c.Name, r)
		}
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("check left %d entries in $TMPDIR", len(ents))
	}
}

// TestCheckBinary runs the real binary, so multi-process cases re-execute
// it as their children.
func TestCheckBinary(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "sqlease")
	if out, err := exec.Command(goTool, "build", "-o", bin, "../cmd/sqlease").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	r := checkRun(t, func() result {
		cmd := exec.Command(bin, "check", "--run", "S3_|S1_Stress", "--parallel", "2")
		cmd.Env = append(os.Environ(), dsnEnv+"=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil && !errors.As(err, new(*exec.ExitError)) {
			t.Fatal(err)
		}
		return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
	})
	passed, failed, _ := summary(t, r)
	if r.code != 0 || failed != 0 || passed == 0 {
		t.Fatalf("sqlease check: want exit 0 and passing cases, got %v", r)
	}
	if !regexp.MustCompile(`(?m)^S1_Stress\S*\s+PASS`).MatchString(r.stdout) {
		t.Errorf("no multi-process stress case passed: %v", r)
	}

	out, err := exec.Command(bin, "check", "--parallel", "0").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("binary with --parallel 0: want exit 2, got %v: %s", err, out)
	}
}

func TestCheckPostgres(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	var mu sync.Mutex
	var schemas []string
	newDatabaseHook = func(d conformance.Database) {
		mu.Lock()
		schemas = append(schemas, d.Namespace.Schema)
		mu.Unlock()
	}
	defer func() { newDatabaseHook = nil }()
	r := checkRun(t, func() result { return cli(t, "check", "--run", lightCases(t), "--parallel", "2", "--dsn", dsn) })
	passed, failed, _ := summary(t, r)
	if r.code != 0 || failed != 0 || passed == 0 {
		t.Fatalf("check on PostgreSQL: want exit 0 and passing cases, got %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(schemas) < passed {
		t.Fatalf("saw %d case schemas for %d passing cases", len(schemas), passed)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range schemas {
		if !strings.HasPrefix(s, "sqlease_t_") {
			t.Errorf("case schema %q is not a sqlease_t_ schema", s)
		}
		var n int
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, s).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("check left schema %s behind", s)
		}
	}
}

// TestCheckMySQL runs check with a mysql:// URL: every case gets a
// database of its own, and none is left afterwards.
func TestCheckMySQL(t *testing.T) {
	dsn := conftest.MySQLDSN(t)
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	url := "mysql://" + mc.User + "@" + mc.Addr + "/" + mc.DBName
	if mc.Passwd != "" {
		url = "mysql://" + mc.User + ":" + mc.Passwd + "@" + mc.Addr + "/" + mc.DBName
	}
	var mu sync.Mutex
	var schemas []string
	newDatabaseHook = func(d conformance.Database) {
		mu.Lock()
		schemas = append(schemas, d.Namespace.Schema)
		mu.Unlock()
	}
	defer func() { newDatabaseHook = nil }()
	r := checkRun(t, func() result {
		return cli(t, "check", "--run", lightCases(t)+"|F1_|D1_", "--parallel", "2", "--dsn", url)
	})
	passed, failed, _ := summary(t, r)
	if r.code != 0 || failed != 0 || passed == 0 {
		t.Fatalf("check on MySQL: want exit 0 and passing cases, got %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(schemas) < passed {
		t.Fatalf("saw %d case databases for %d passing cases", len(schemas), passed)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range schemas {
		var n int
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?`, s).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 || !strings.HasPrefix(s, "sqlease_t_") {
			t.Errorf("check left database %s behind (or it is not a sqlease_t_ database)", s)
		}
	}
}

// postgresSchema returns the test PostgreSQL DSN, the name of a schema
// (prefix and a number) dropped when t ends, and a database on the DSN.
func postgresSchema(t *testing.T, prefix string) (dsn, schema string, db *sql.DB) {
	t.Helper()
	dsn = conftest.PostgresDSN(t)
	schema = fmt.Sprintf("%s%d", prefix, time.Now().UnixNano()%1e9)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		db.Close()
	})
	return dsn, schema, db
}

func TestStatusPostgresSchema(t *testing.T) {
	dsn, schema, db := postgresSchema(t, "sqlease_cli_")
	r := cli(t, "status", "--dsn", dsn, "--schema", schema)
	if r.code != 2 || !strings.Contains(r.stderr, "sqlease migrate") {
		t.Fatalf("status before migrate: want exit 2 saying to migrate, got %v", r)
	}
	if r := cli(t, "migrate", "--dsn", dsn, "--schema", schema); r.code != 0 {
		t.Fatalf("migrate: %v", r)
	}
	d, _ := dialect.Lookup("postgres")
	l, err := lock.New(t.Context(), db, d, lock.WithSchema(schema), lock.WithOwner("pg-worker"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	le, err := l.TryAcquire(t.Context(), "pg/key", lock.Shared)
	if err != nil {
		t.Fatal(err)
	}
	hs := statusJSON(t, "--dsn", dsn, "--schema", schema)
	if len(hs) != 1 || hs[0].Token != le.Token() || hs[0].Mode != "shared" || hs[0].Owner != "pg-worker" || hs[0].Expired {
		t.Fatalf("status --json: want the shared lease token %d, got %+v", le.Token(), hs)
	}
	if r := cli(t, "sweep", "--dsn", dsn, "--schema", schema, "--limit", "10"); r.code != 0 || !strings.Contains(r.stdout, "swept 0 ") {
		t.Errorf("sweep with only a live lease: want 0 swept, got %v", r)
	}
}

// runCasesText runs cases as check does and returns its text and counts.
func runCasesText(t *testing.T, cfg conformance.Config, cases []conformance.Case, timeout time.Duration) (string, checkJSON, []string) {
	var stdout bytes.Buffer
	out := &output{stdout: &stdout, stderr: &stdout}
	var rep checkJSON
	rule := ""
	_, running := runCases(t.Context(), cfg, cases, 2, timeout, func(r caseResult) {
		rep.count(r.status)
		rep.Cases = append(rep.Cases, caseJSON{Name: r.name, Rule: r.rule, Result: r.status})
		if r.rule != rule {
			rule = r.rule
			fmt.Fprintln(&stdout, ruleHeader(rule))
		}
		printResult(out, r, width(cases), false)
	})
	return stdout.String(), rep, running
}

func TestRunCasesReport(t *testing.T) {
	cfg := conftest.SQLite(t.TempDir())
	cases := []conformance.Case{
		{Name: "X1_Passes", Rule: "X1", Run: func(e *conformance.Env) {
			if _, err := e.NewLocker(nil).TryAcquire(e.Ctx(), "k", lock.Exclusive); err != nil {
				e.T.Fatalf("%v", err)
			}
		}},
		{Name: "X2_Fails", Rule: "X2", Run: func(e *conformance.Env) {
			e.T.Logf("first line\nsecond line")
			e.T.Fatalf("it broke")
		}},
		{Name: "X3_NeedsRowLocks", Rule: "X3", Needs: dialect.CapRowLockFence, Run: func(e *conformance.Env) {
			e.T.Errorf("ran without the capability")
		}},
	}
	text, rep, running := runCasesText(t, cfg, cases, time.Minute)
	if rep.Summary.Passed != 1 || rep.Summary.Failed != 1 || rep.Summary.Skipped != 1 || running != nil {
		t.Errorf("want 1 passed, 1 failed, 1 skipped; got %+v:\n%s", rep.Summary, text)
	}
	for _, re := range []string{
		`(?m)^== X1\nX1_Passes\s+PASS\s+[0-9.]+s$`,
		`(?m)^X2_Fails\s+FAIL\s+[0-9.]+s\n    first line\n    second line\n    it broke$`,
		`(?m)^X3_NeedsRowLocks\s+SKIP\s+[0-9.]+s\n    skipped: .*row-lock-fence`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("output does not match %s:\n%s", re, text)
		}
	}
}

// TestRunCasesSorted: cases are printed grouped by rule in the contract's
// order (S, H, W, F, D, I; S2 before S10), whatever order they end in.
func TestRunCasesSorted(t *testing.T) {
	slow := func(d time.Duration) func(*conformance.Env) {
		return func(e *conformance.Env) { time.Sleep(d) }
	}
	var cases []conformance.Case
	for _, c := range []struct {
		name string
		wait time.Duration
	}{
		{"I1_Input", 0}, {"D1_Migrate", 0}, {"S10_Late", 0}, {"H2_Renew", 0}, {"S2_Slow", 300 * time.Millisecond},
		{"W1_Writer", 0}, {"F1_Fence", 0}, {"S1_B", 0}, {"S1_A", 200 * time.Millisecond}, {"Z1_Other", 0},
	} {
		rule, _, _ := strings.Cut(c.name, "_")
		cases = append(cases, conformance.Case{Name: c.name, Rule: rule, Run: slow(c.wait)})
	}
	text, rep, _ := runCasesText(t, conftest.SQLite(t.TempDir()), cases, time.Minute)
	var got []string
	for _, c := range rep.Cases {
		got = append(got, c.Name)
	}
	want := "S1_A S1_B S2_Slow S10_Late H2_Renew W1_Writer F1_Fence D1_Migrate I1_Input Z1_Other"
	if strings.Join(got, " ") != want {
		t.Errorf("order %v, want %s:\n%s", got, want, text)
	}
	if n := strings.Count(text, "\n== "); n != 8 {
		t.Errorf("want 9 rule headers (one per rule), got %d:\n%s", n+1, text)
	}
}

func TestRunCasesTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	cases := []conformance.Case{
		{Name: "X1_Quick", Rule: "X1", Run: func(e *conformance.Env) {}},
		{Name: "X2_Hangs", Rule: "X2", Run: func(e *conformance.Env) { <-release }},
		{Name: "X3_Quick", Rule: "X3", Run: func(e *conformance.Env) {}},
	}
	start := time.Now()
	text, rep, running := runCasesText(t, conftest.SQLite(t.TempDir()), cases, 2*time.Second)
	if rep.Summary.Passed != 2 || rep.Summary.Failed != 0 || len(running) != 1 || running[0] != "X2_Hangs" {
		t.Errorf("want 2 passed and X2_Hangs still running, got %+v, running %v:\n%s", rep.Summary, running, text)
	}
	if !regexp.MustCompile(`X1_Quick[^\n]*\n(.*\n)*X3_Quick`).MatchString(text) {
		t.Errorf("the cases that ended are not printed in order:\n%s", text)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("gave up after %s, want about 2s", d)
	}
}

func TestCaseT(t *testing.T) {
	ctx := t.Context()
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }

	var caseCtx context.Context
	r := runT(ctx, "X1_Fatal", func(ct *caseT) {
		caseCtx = ct.Context()
		ct.Cleanup(func() {
			if caseCtx.Err() == nil {
				note("context alive during cleanup")
			}
			note("first")
		})
		ct.Cleanup(func() {
			note("second")
			ct.Cleanup(func() { note("nested") })
		})
		ct.Logf("before")
		ct.Fatalf("boom %d", 1)
		note("after Fatalf")
	})
	if r.status != "FAIL" || strings.Join(r.logs, "|") != "before|boom 1" {
		t.Errorf("Fatalf: want FAIL with logs before|boom 1, got %+v", r)
	}
	if got := strings.Join(order, ","); got != "second,nested,first" {
		t.Errorf("cleanups: want second,nested,first (LIFO, after Goexit, context cancelled), got %s", got)
	}

	r = runT(ctx, "X2_Skip", func(ct *caseT) {
		ct.Skipf("no %s", "capability")
		ct.Errorf("after Skipf")
	})
	if r.status != "SKIP" || len(r.logs) != 1 || !strings.Contains(r.logs[0], "no capability") {
		t.Errorf("Skipf: want SKIP with the reason, got %+v", r)
	}

	r = runT(ctx, "X3_Panic", func(ct *caseT) { panic("oops") })
	if r.status != "FAIL" || !strings.Contains(strings.Join(r.logs, "\n"), "panic: oops") {
		t.Errorf("panic: want FAIL with the panic, got %+v", r)
	}

	r = runT(ctx, "X4_Pass", func(ct *caseT) {
		if ct.Name() != "X4_Pass" || ct.Failed() {
			ct.Errorf("name %q failed %v", ct.Name(), ct.Failed())
		}
		ct.Errorf("soft")
		if !ct.Failed() {
			ct.Fatalf("Failed() false after Errorf")
		}
	})
	if r.status != "FAIL" || r.logs[0] != "soft" {
		t.Errorf("Errorf: want FAIL, got %+v", r)
	}
	if r := runT(ctx, "X5_Pass", func(ct *caseT) { ct.Logf("fine") }); r.status != "PASS" {
		t.Errorf("want PASS, got %+v", r)
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		dsn, dialect           string
		wantDialect, wantDrv   string
		wantDSN, wantPath, err string
	}{
		{dsn: "postgres://u@h/db", wantDialect: "postgres", wantDrv: "pgx", wantDSN: "postgres://u@h/db"},
		{dsn: "PostgreSQL://u@h/db", wantDialect: "postgres", wantDrv: "pgx", wantDSN: "postgresql://u@h/db"},
		{dsn: "/var/lib/app/locks.db", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "/var/lib/app/locks.db?_busy_timeout=5000", wantPath: "/var/lib/app/locks.db"},
		{dsn: "x.sqlite3", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "x.sqlite3?_busy_timeout=5000", wantPath: "x.sqlite3"},
		{dsn: "file:/tmp/a.db?_journal_mode=WAL", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "file:/tmp/a.db?_journal_mode=WAL&_busy_timeout=5000", wantPath: "/tmp/a.db"},
		{dsn: "file:/tmp/a.db?_busy_timeout=5", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "file:/tmp/a.db?_busy_timeout=5", wantPath: "/tmp/a.db"},
		{dsn: "sqlite:///tmp/b.sqlite", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "/tmp/b.sqlite?_busy_timeout=5000", wantPath: "/tmp/b.sqlite"},
		{dsn: "sqlite:rel/c", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "rel/c?_busy_timeout=5000", wantPath: "rel/c"},
		{dsn: "file::memory:?cache=shared", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "file::memory:?cache=shared&_busy_timeout=5000"},
		{dsn: ":memory:", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: ":memory:?_busy_timeout=5000"},
		{dsn: "file:memdb1?mode=memory&cache=shared", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "file:memdb1?mode=memory&cache=shared&_busy_timeout=5000"},
		// A journal in memory keeps the database in its file.
		{dsn: "file:/tmp/a.db?_journal_mode=memory", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "file:/tmp/a.db?_journal_mode=memory&_busy_timeout=5000", wantPath: "/tmp/a.db"},
		{dsn: "/data/locks", dialect: "sqlite", wantDialect: "sqlite", wantDrv: "sqlite", wantDSN: "/data/locks?_busy_timeout=5000", wantPath: "/data/locks"},
		{dsn: "host=db user=app", dialect: "postgres", wantDialect: "postgres", wantDrv: "pgx", wantDSN: "host=db user=app"},
		{dsn: "host=db user=app", err: "--dialect"},
		{dsn: "x.db", dialect: "nosuch", err: `unknown dialect "nosuch" for --dialect; the CLI knows: mysql, postgres, sqlite`},
		{dsn: "", dialect: "nosuch", err: `unknown dialect "nosuch"`},
		{dsn: "mysql://root@127.0.0.1/test", wantDialect: "mysql", wantDrv: "mysql", wantDSN: "root@tcp(127.0.0.1:3306)/test"},
		{dsn: "mysql://u:p%40ss@db:3307/app?timeout=5s", wantDialect: "mysql", wantDrv: "mysql", wantDSN: "u:p@ss@tcp(db:3307)/app?timeout=5s"},
		{dsn: "root@tcp(127.0.0.1:3306)/test", wantDialect: "mysql", wantDrv: "mysql", wantDSN: "root@tcp(127.0.0.1:3306)/test"},
		{dsn: "", err: "SQLEASE_DSN"},
	} {
		got, err := resolve(tc.dsn, tc.dialect)
		if tc.err != "" {
			var ee *exitError
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &ee) || ee.code != exitUsage {
				t.Errorf("resolve(%q, %q): want a usage error with %q, got %v", tc.dsn, tc.dialect, tc.err, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("resolve(%q, %q): %v", tc.dsn, tc.dialect, err)
			continue
		}
		if got.dialect.Name() != tc.wantDialect || got.driver != tc.wantDrv || got.dsn != tc.wantDSN || got.file != tc.wantPath {
			t.Errorf("resolve(%q, %q) = %s %s %q path %q; want %s %s %q path %q", tc.dsn, tc.dialect,
				got.dialect.Name(), got.driver, got.dsn, got.file, tc.wantDialect, tc.wantDrv, tc.wantDSN, tc.wantPath)
		}
	}
}

// TestRegisterCommand: a registered command is listed, parses its flags,
// runs, and its UsageError exits 2.
func TestRegisterCommand(t *testing.T) {
	RegisterCommand(Command{
		Name: "echo-test", Args: "[WORD]", Summary: "print a word (test command)",
		Setup: func(fs *flag.FlagSet, stdout, stderr io.Writer) func(ctx context.Context, args []string) error {
			upper := fs.Bool("upper", false, "print in upper case")
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return UsageError("echo-test takes one word, got %d", len(args))
				}
				w := args[0]
				if *upper {
					w = strings.ToUpper(w)
				}
				fmt.Fprintln(stdout, w)
				return nil
			}
		},
	})
	if r := cli(t, "help"); !strings.Contains(r.stdout, "echo-test") {
		t.Errorf("help does not list the registered command: %v", r)
	}
	if r := cli(t, "echo-test", "--upper", "hi"); r.code != 0 || r.stdout != "HI\n" {
		t.Errorf("registered command: %v", r)
	}
	if r := cli(t, "echo-test"); r.code != exitUsage || !strings.Contains(r.stderr, "one word") {
		t.Errorf("registered command's usage error: %v", r)
	}
}

func TestVersion(t *testing.T) {
	r := cli(t, "version")
	if r.code != 0 || !regexp.MustCompile(`^sqlease \S+\nmodule  github.com/sqlease/sqlease\ncommit  .+\ngo      go\S+\n$`).MatchString(r.stdout) {
		t.Fatalf("version: %v", r)
	}
	r = cli(t, "version", "--json")
	var raw map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &raw) != nil {
		t.Fatalf("version --json: %v", r)
	}
	for _, f := range []string{"module", "version", "commit", "commit_time", "modified", "go", "main"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("version --json lacks %q: %s", f, r.stdout)
		}
	}
	// A test binary records no VCS stamp: the version says so honestly.
	if raw["version"] == "" || raw["module"] != "github.com/sqlease/sqlease" {
		t.Errorf("version --json: %s", r.stdout)
	}

	// With a stamp, as go build records it.
	defer func(f func() (*debug.BuildInfo, bool)) { buildInfo = f }(buildInfo)
	buildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: modulePath, Version: "v1.2.3"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-01T05:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	r = cli(t, "version")
	if r.stdout != "sqlease v1.2.3\nmodule  github.com/sqlease/sqlease\ncommit  abc123 (2026-12-01T05:00:00Z, modified)\ngo      go1.26.0\n" {
		t.Errorf("version with a VCS stamp: %v", r)
	}
	// Imported into another module: that module's requirement, no commit.
	buildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Path: "example.com/tool", Version: "(devel)"},
			Deps:     []*debug.Module{{Path: modulePath, Version: "v0.9.0"}},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "other"}}}, true
	}
	r = cli(t, "version", "--json")
	var v versionJSON
	if json.Unmarshal([]byte(r.stdout), &v) != nil || v.Version != "v0.9.0" || v.Commit != "" || v.Main != "example.com/tool" {
		t.Errorf("version of an imported CLI: %v", r)
	}
	buildInfo = func() (*debug.BuildInfo, bool) { return nil, false }
	if r = cli(t, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "sqlease (devel)\n") {
		t.Errorf("version without build info: %v", r)
	}
}

// jsonObject runs a command line that prints one JSON object and decodes it.
func jsonObject(t *testing.T, v any, args ...string) map[string]any {
	t.Helper()
	r := cli(t, args...)
	if r.code != 0 || strings.Count(strings.TrimSpace(r.stdout), "\n") != 0 {
		t.Fatalf("%q: want exit 0 and one line of JSON, got %v", args, r)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("%q: %v: %s", args, err, r.stdout)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatal(err)
	}
	return raw
}

func hasFields(t *testing.T, what string, raw map[string]any, fields ...string) {
	t.Helper()
	for _, f := range fields {
		if _, ok := raw[f]; !ok {
			t.Errorf("%s lacks field %q: %v", what, f, raw)
		}
	}
}

func TestJSON(t *testing.T) {
	path := sqliteFile(t)
	var up migrateJSON
	raw := jsonObject(t, &up, "migrate", "--dsn", path, "--json")
	hasFields(t, "migrate --json", raw, "action", "version", "latest", "version_table", "migrations", "duration_ms")
	if up.Action != "up" || up.Version == 0 || up.Version != up.Latest || len(up.Migrations) != int(up.Latest) ||
		up.Migrations[0].Name != "00001_lock_tables.sql" || up.Migrations[0].DurationMS <= 0 || up.VersionTable != "sqlease_db_version" {
		t.Errorf("migrate --json: %+v", up)
	}
	var again migrateJSON
	jsonObject(t, &again, "migrate", "--dsn", path, "--json")
	if len(again.Migrations) != 0 || again.Version != up.Version {
		t.Errorf("second migrate --json: want nothing applied, got %+v", again)
	}
	var st migrateJSON
	jsonObject(t, &st, "migrate", "status", "--dsn", path, "--json")
	if st.Action != "status" || len(st.Migrations) != int(up.Latest) || st.Migrations[0].Applied == nil || !*st.Migrations[0].Applied {
		t.Errorf("migrate status --json: %+v", st)
	}
	var sw sweepJSON
	raw = jsonObject(t, &sw, "sweep", "--dsn", path, "--json", "--limit", "7")
	hasFields(t, "sweep --json", raw, "swept", "limit", "rows_before", "rows_after")
	if sw.Swept != 0 || sw.Limit != 7 {
		t.Errorf("sweep --json: %+v", sw)
	}
	if hs := statusJSON(t, "--dsn", path); len(hs) != 0 {
		t.Errorf("status --json on an empty namespace: %+v", hs)
	}

	t.Setenv(dsnEnv, "")
	var ck checkJSON
	raw = jsonObject(t, &ck, "check", "--json", "--run", "^(S3_|I1_)", "--parallel", "2")
	hasFields(t, "check --json", raw, "dialect", "cases", "summary", "running")
	if ck.Dialect != "sqlite" || ck.Summary.Passed == 0 || ck.Summary.Failed != 0 || len(ck.Cases) != ck.Summary.Passed+ck.Summary.Skipped {
		t.Fatalf("check --json: %+v", ck)
	}
	if ck.Cases[0].Rule != "S3" || ck.Cases[len(ck.Cases)-1].Rule != "I1" {
		t.Errorf("check --json: want S3 cases first and I1 last, got %+v", ck.Cases)
	}
	caseRaw := raw["cases"].([]any)[0].(map[string]any)
	hasFields(t, "check --json case", caseRaw, "name", "rule", "result", "duration_ms", "message")
	hasFields(t, "check --json summary", raw["summary"].(map[string]any), "passed", "failed", "skipped")
}

// leftInSQLite lists the schema objects of a SQLite file (but SQLite's own).
func leftInSQLite(t *testing.T, path string) []string {
	t.Helper()
	db, err := sql.Open("sqlite", conftest.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(t.Context(), `SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		out = append(out, n)
	}
	return out
}

func TestDropSQLite(t *testing.T) {
	path := migrated(t)
	l := locker(t, path, lock.WithTTL(time.Minute))
	if _, err := l.TryAcquire(t.Context(), "held", lock.Exclusive); err != nil {
		t.Fatal(err)
	}
	l.Close(context.Background())

	// Without --yes and without a terminal: exit 2, saying what would go.
	r := cli(t, "drop", "--dsn", path)
	if r.code != 2 || !strings.Contains(r.stderr, `drop tables "sqlease_db_version" of prefix sqlease_`) || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("drop without --yes: %v", r)
	}
	// On a terminal, anything but "yes" changes nothing.
	defer func() { stdin = os.Stdin; stdinIsTerminal = func() bool { return false } }()
	stdinIsTerminal = func() bool { return true }
	stdin = strings.NewReader("no\n")
	if r := cli(t, "drop", "--dsn", path); r.code != 1 || !strings.Contains(r.stderr, "Type yes") || !strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("drop answered no: %v", r)
	}
	if len(leftInSQLite(t, path)) == 0 {
		t.Fatal("drop answered no dropped the tables")
	}
	stdin = strings.NewReader("yes\n")
	r = cli(t, "drop", "--dsn", path)
	if r.code != 0 || !regexp.MustCompile(`(?m)^(OK   0000\d_\S+\.sql \(.+\)\n)*OK   00001_lock_tables\.sql \(.+\)\nuninstalled in .*: reverted \d+ migrations and dropped "sqlease_db_version" \(prefix sqlease_`).MatchString(r.stdout) {
		t.Fatalf("drop answered yes: %v", r)
	}
	stdinIsTerminal = func() bool { return false }
	if left := leftInSQLite(t, path); len(left) != 0 {
		t.Fatalf("drop left %v", left)
	}
	// Dropping again needs no confirmation: nothing is applied, and nothing
	// is left to drop.
	var dj dropJSON
	if raw := jsonObject(t, &dj, "drop", "--dsn", path, "--json"); len(dj.Reverted) != 0 || raw["dropped"] == nil || len(dj.Dropped) != 0 {
		t.Errorf("second drop --json: %+v", dj)
	}
	if r := cli(t, "drop", "--dsn", path); r.code != 0 || !strings.HasPrefix(r.stdout, "nothing to uninstall: no lock tables of prefix sqlease_ in ") || !strings.HasSuffix(r.stdout, "(check --schema and --prefix)\n") {
		t.Errorf("second drop: want exit 0 saying nothing was there, got %v", r)
	}
	// A fresh install works, and the old lease is gone.
	migratedAgain := cli(t, "migrate", "--dsn", path)
	if migratedAgain.code != 0 || !strings.Contains(migratedAgain.stdout, "OK   00001_") {
		t.Fatalf("migrate after drop: %v", migratedAgain)
	}
	if hs := statusJSON(t, "--dsn", path); len(hs) != 0 {
		t.Errorf("leases survived drop: %+v", hs)
	}
	if _, err := locker(t, path).TryAcquire(t.Context(), "held", lock.Exclusive); err != nil {
		t.Errorf("acquire after drop and migrate: %v", err)
	}

	// migrate down reverts, keeping the version table at 0.
	r = cli(t, "migrate", "down", "--dsn", path, "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "OK   00001_lock_tables.sql") || !strings.Contains(r.stdout, "now at version 0") {
		t.Fatalf("migrate down --yes: %v", r)
	}
	if left := leftInSQLite(t, path); fmt.Sprint(left) != "[sqlease_db_version]" {
		t.Errorf("after migrate down, left %v; want only the version table", left)
	}
	if r := cli(t, "migrate", "down", "--dsn", path); r.code != 0 || !strings.Contains(r.stdout, "nothing to revert") {
		t.Errorf("migrate down with nothing applied (no --yes needed): %v", r)
	}
	var dj2 dropJSON
	jsonObject(t, &dj2, "drop", "--dsn", path, "--json", "--yes")
	if left := leftInSQLite(t, path); len(left) != 0 {
		t.Errorf("drop after down left %v", left)
	}
}

// testDropServer: drop on a server schema leaves nothing of the namespace
// (leftovers lists what is left), and a fresh migrate works.
func testDropServer(t *testing.T, dsn, schema string, leftovers func() []string) {
	r := cli(t, "migrate", "--dsn", dsn, "--schema", schema)
	if r.code != 0 {
		t.Fatalf("migrate: %v", r)
	}
	if len(leftovers()) == 0 {
		t.Fatal("migrate made nothing in the schema")
	}
	if r := cli(t, "drop", "--dsn", dsn, "--schema", schema); r.code != 2 || !strings.Contains(r.stderr, "schema "+schema) {
		t.Fatalf("drop without --yes: %v", r)
	}
	var dj dropJSON
	jsonObject(t, &dj, "drop", "--dsn", dsn, "--schema", schema, "--yes", "--json")
	if len(dj.Reverted) == 0 || len(dj.Dropped) != 2 {
		t.Errorf("drop --json: want migrations reverted and 2 tables dropped, got %+v", dj)
	}
	if left := leftovers(); len(left) != 0 {
		t.Fatalf("drop left %v in schema %s", left, schema)
	}
	if r := cli(t, "migrate", "--dsn", dsn, "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "OK   00001_") {
		t.Fatalf("migrate after drop: %v", r)
	}
	if r := cli(t, "status", "--dsn", dsn, "--schema", schema); r.code != 0 {
		t.Fatalf("status after drop and migrate: %v", r)
	}
	if r := cli(t, "drop", "--dsn", dsn, "--schema", schema, "--yes"); r.code != 0 || !strings.Contains(r.stdout, "schema "+schema+" is kept") ||
		!strings.Contains(r.stdout, "; `sqlease migrate up --dsn DSN --schema "+schema+"` installs it afresh") {
		t.Fatalf("second drop: %v", r)
	}
	if left := leftovers(); len(left) != 0 {
		t.Fatalf("second drop left %v", left)
	}
}

func TestDropPostgres(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	schema := fmt.Sprintf("sqlease_cli_drop_%d", time.Now().UnixNano()%1e9)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		db.Close()
	})
	testDropServer(t, dsn, schema, func() []string {
		rows, err := db.QueryContext(t.Context(), `SELECT relname::text FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = $1
			UNION ALL SELECT proname::text FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = $1`, schema)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			rows.Scan(&n)
			out = append(out, n)
		}
		return out
	})
}

// TestDropMySQL runs migrate, drop and status on a DSN without
// parseTime=true, which the CLI does not add: nothing needs it.
func TestDropMySQL(t *testing.T) {
	cfg, err := mysql.ParseDSN(conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime = false
	dsn := cfg.FormatDSN()
	schema := fmt.Sprintf("sqlease_cli_drop_%d", time.Now().UnixNano()%1e9)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+schema)
		db.Close()
	})
	testDropServer(t, dsn, schema, func() []string {
		rows, err := db.QueryContext(t.Context(), `SELECT table_name FROM information_schema.tables WHERE table_schema = ?
			UNION ALL SELECT routine_name FROM information_schema.routines WHERE routine_schema = ?`, schema, schema)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			rows.Scan(&n)
			out = append(out, n)
		}
		return out
	})
}

// TestBadInputPostgres: bad input on PostgreSQL exits 2 with a clear
// message, never a raw server error.
func TestBadInputPostgres(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--dsn", dsn, "--key", "\xff\xfe"}, "not valid UTF-8"},
		{[]string{"status", "--dsn", dsn, "--schema", "pg_catalog"}, "is reserved for the database's own catalogs"},
		{[]string{"migrate", "--dsn", dsn, "--schema", "pg_toast"}, "reserved"},
		{[]string{"drop", "--dsn", dsn, "--schema", "information_schema", "--yes"}, "information_schema"},
	} {
		r := cli(t, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "SQLSTATE") {
			t.Errorf("%q: want exit 2 with %q, got %v", tc.args, tc.want, r)
		}
	}
}

// TestUnknownDSNNamesIt: a DSN of no known form is quoted (user
// information hidden) with the forms that are known, on one line, exit 2.
// TestMalformedDSN: a DSN its driver cannot parse is reported as
// malformed, naming it with the password hidden and the parser's reason,
// before any connection; a DSN that parses but whose server is down is
// reported as unreachable.
func TestMalformedDSN(t *testing.T) {
	t.Setenv(dsnEnv, "")
	for _, tc := range []struct {
		dsn     []string // --dsn and any other flag
		want    string
		unreach bool // parses: the server is down
	}{
		{[]string{"postgres://root:secret@127.0.0.1:badport/test"}, `malformed postgres DSN "postgres://***@127.0.0.1:badport/test": invalid port`, false},
		{[]string{"postgres://root@127.0.0.1:badport/test"}, `malformed postgres DSN "postgres://***@127.0.0.1:badport/test": invalid port`, false},
		{[]string{"postgres://root:secret@127.0.0.1/test?connect_timeout=soon"}, `malformed postgres DSN "postgres://***@127.0.0.1/test?connect_timeout=soon": invalid connect_timeout`, false},
		{[]string{"host=127.0.0.1 port=badport password=secret", "--dialect", "postgres"}, `malformed postgres DSN "host=127.0.0.1 port=badport password=***": invalid port`, false},
		{[]string{"mysql://root:secret@127.0.0.1:badport/test"}, `malformed mysql DSN "mysql://***@127.0.0.1:badport/test": invalid port ":badport" after host`, false},
		{[]string{"root:secret@tcp(127.0.0.1:3306/test"}, `malformed mysql DSN "***@tcp(127.0.0.1:3306/test": invalid DSN: network address not terminated`, false},
		{[]string{"root:secret@tcp(127.0.0.1:abc)/test"}, `malformed mysql DSN "***@tcp(127.0.0.1:abc)/test": invalid port "abc" in address "127.0.0.1:abc" (want 1-65535)`, false},
		{[]string{"root:secret@tcp(127.0.0.1:99999)/test"}, `malformed mysql DSN "***@tcp(127.0.0.1:99999)/test": invalid port "99999" in address "127.0.0.1:99999" (want 1-65535)`, false},
		{[]string{"postgres://root:secret@127.0.0.1:1/test?connect_timeout=5"}, `cannot reach the postgres database postgres://***@127.0.0.1:1/test`, true},
		{[]string{"root:secret@tcp(127.0.0.1:1)/test"}, `cannot reach the mysql database ***@tcp(127.0.0.1:1)/test`, true},
		// libpq's keyword/value form allows spaces around "=".
		{[]string{"host=127.0.0.1 port=1 user=root password = secret dbname=test connect_timeout=5", "--dialect", "postgres"}, `cannot reach the postgres database host=127.0.0.1 port=1 user=root password = *** dbname=test`, true},
		// An unencoded "@" in the password: pgx takes "secret@127.0.0.1"
		// as the host and its error quotes it.
		{[]string{"postgres://root:hunter2@secret@127.0.0.1:1/test?connect_timeout=5"}, `cannot reach the postgres database postgres://***@127.0.0.1:1/test`, true},
		// A quoted password with an escaped quote (libpq's \').
		{[]string{`host=127.0.0.1 port=1 user=root password='it\'s secret' dbname=test connect_timeout=5`, "--dialect", "postgres"}, `cannot reach the postgres database host=127.0.0.1 port=1 user=root password=*** dbname=test`, true},
		{[]string{`host=127.0.0.1 port=badport password='it\'s secret'`, "--dialect", "postgres"}, `malformed postgres DSN "host=127.0.0.1 port=badport password=***": invalid port`, false},
		// An "@" in the query is not the end of the user information.
		{[]string{"postgres://root:secret@127.0.0.1:1/test?connect_timeout=5&application_name=a@b"}, `cannot reach the postgres database postgres://***@127.0.0.1:1/test?connect_timeout=5&application_name=a@b`, true},
		{[]string{"root:secret@tcp([::1])/test"}, `malformed mysql DSN "***@tcp([::1])/test": invalid address "[[::1]]:3306": missing port in address (an IPv6 host with a port is written [::1]:3306)`, false},
	} {
		for _, cmd := range [][]string{{"check"}, {"migrate"}, {"migrate", "status"}, {"status"}, {"sweep"}, {"drop", "--yes"}} {
			args := append(append(cmd, "--dsn"), tc.dsn...)
			r := cli(t, args...)
			msg := strings.TrimSpace(r.stderr)
			if r.code != 2 || !strings.HasPrefix(msg, "sqlease "+cmd[0]+": "+tc.want) || strings.Contains(msg, "\n") {
				t.Errorf("%q: want exit 2 and one line %q, got %v", args, tc.want, r)
			}
			if strings.Contains(msg, "secret") || strings.Contains(msg, "hunter2") {
				t.Errorf("%q: the message shows the password: %s", args, msg)
			}
			if !tc.unreach && strings.Contains(msg, "cannot reach") || tc.unreach && strings.Contains(msg, "malformed") {
				t.Errorf("%q: malformed and unreachable confused: %s", args, msg)
			}
		}
	}
	// A user name without a password is no secret: the driver's message
	// keeps it.
	if got := scrubSecrets("failed to connect to `user=rooty database=test`", "postgres://rooty@127.0.0.1:1/test?password=xyzwv"); got != "failed to connect to `user=rooty database=test`" {
		t.Errorf("scrubSecrets hid a user name without a password: %q", got)
	}
	// A reason that quotes the password has it hidden too.
	err := malformedDSN("mysql", "root:hunter22@tcp(h)/db", errors.New(`bad password "hunter22"`))
	if got, want := err.Error(), `malformed mysql DSN "***@tcp(h)/db": bad password "***"`; got != want {
		t.Errorf("malformedDSN = %q, want %q", got, want)
	}
}

// TestUnknownDialectNamesIt: an unknown --dialect is named with the
// dialects the CLI has backends for, and no advice to import a package
// (which a user of the tool cannot do), whatever the command and whether
// or not a DSN is given.
func TestUnknownDialectNamesIt(t *testing.T) {
	t.Setenv(dsnEnv, "")
	path := migrated(t)
	const known = "mysql, postgres, sqlite" // the built-in backends
	if got := backendNames(); got != known {
		t.Fatalf("backendNames() = %q, want the built-in %q", got, known)
	}
	for _, args := range [][]string{
		{"check", "--dialect", "oracle"},
		{"check", "--dialect", "oracle", "--dsn", "x"},
		{"status", "--dialect", "oracle", "--dsn", path},
		{"status", "--dialect", "oracle"},
		{"migrate", "status", "--dialect", "oracle", "--dsn", path},
		{"sweep", "--dialect", "oracle", "--dsn", unreachableDSN},
		{"drop", "--dialect", "oracle", "--dsn", path, "--yes"},
	} {
		r := cli(t, args...)
		want := "sqlease " + args[0] + `: unknown dialect "oracle" for --dialect; the CLI knows: ` + known + "\n"
		if r.code != 2 || r.stderr != want || r.stdout != "" {
			t.Errorf("%q: want exit 2 and stderr %q, got %v", args, want, r)
		}
	}
	// The database was not touched by the drop above.
	if r := cli(t, "status", "--dsn", path); r.code != 0 {
		t.Errorf("status after drop --dialect oracle: want exit 0, got %v", r)
	}
}

func TestUnknownDSNNamesIt(t *testing.T) {
	for _, tc := range []struct{ dsn, want, hidden string }{
		{"app.txt", `DSN "app.txt"`, ""},
		{"bob:secret@host/db", `DSN "***@host/db"`, "secret"},
		{"weird://bob:secret@host/db", `DSN "weird://***@host/db"`, "secret"},
		{"host=h user=bob password=secret dbname=d", `password=***`, "secret"},
	} {
		r := cli(t, "status", "--dsn", tc.dsn)
		msg := strings.TrimSpace(r.stderr)
		if r.code != 2 || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "postgres://") || !strings.Contains(msg, "--dialect") || strings.Contains(msg, "\n") {
			t.Errorf("status --dsn %q: want exit 2 and one line quoting %s with the known forms, got %v", tc.dsn, tc.want, r)
		}
		if tc.hidden != "" && strings.Contains(msg, tc.hidden) {
			t.Errorf("status --dsn %q: the message shows the password: %s", tc.dsn, msg)
		}
	}
}

// TestFlagErrorsNameTheFlag: a flag error spells the flag with two dashes
// as the usage text does, says what kind of value it takes, never changes
// the value the user gave, and an empty --schema is refused instead of
// silently meaning the connection's schema (SPEC I1).
func TestFlagErrorsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--bogus"}, "unknown flag --bogus;"},
		{[]string{"migrate", "status", "--bogus"}, "unknown flag --bogus;"},
		{[]string{"status", "--dsn"}, "flag needs an argument: --dsn;"},
		{[]string{"sweep", "--limit", "x"}, `invalid value "x" for flag --limit: want a whole number;`},
		{[]string{"sweep", "--limit", "99999999999999999999"}, `for flag --limit: value out of range;`},
		// The user's value is quoted as given, dashes and all.
		{[]string{"sweep", "--limit", "x for -dsn"}, `invalid value "x for -dsn" for flag --limit: want a whole number;`},
		{[]string{"check", "--timeout", "5"}, `invalid value "5" for flag --timeout: want a duration: a number with a unit (ms, s, m, h)`},
		{[]string{"check", "--full=maybe"}, `invalid boolean value "maybe" for --full: want true or false;`},
		{[]string{"status", "--schema", ""}, `invalid value "" for flag --schema: empty; omit --schema for the connection's default schema`},
		// A flag where a value belongs is not taken as the value.
		{[]string{"check", "--schema", "--run", "X"}, `flag needs an argument: --schema (it is followed by the flag "--run");`},
		{[]string{"status", "--prefix", "-dsn=x"}, `flag needs an argument: --prefix (it is followed by the flag "-dsn=x");`},
	} {
		r := cli(t, tc.args...)
		// No flag named with one dash outside the quoted value.
		outside := regexp.MustCompile(`"(?:[^"\\]|\\.)*"`).ReplaceAllString(r.stderr, `""`)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || regexp.MustCompile(`(^|[\s:])-[a-z]`).MatchString(outside) {
			t.Errorf("%q: want exit 2 with %q and no single-dash flag, got %v", tc.args, tc.want, r)
		}
	}
}

// TestRefusedRoleOrDatabase: a server that answers but refuses the role or
// has no such database is not reported as unreachable: the message names
// the role or database and the DSN without its password, exit 2.
func TestRefusedRoleOrDatabase(t *testing.T) {
	type tc struct {
		dsn, want, not string
	}
	var cases []tc
	if os.Getenv("SQLEASE_POSTGRES_DSN") != "" {
		dsn := conftest.PostgresDSN(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		role := *u
		role.User = url.UserPassword("sqlease_no_such_role", "topsecret")
		db := *u
		db.Path = "/sqlease_no_such_db"
		cases = append(cases,
			tc{role.String(), `role "sqlease_no_such_role" was refused by the postgres database postgres://***@` + u.Host + u.Path, "topsecret"},
			tc{db.String(), `database "sqlease_no_such_db" does not exist on the postgres server postgres://***@` + u.Host + "/sqlease_no_such_db", ""})
	}
	if os.Getenv("SQLEASE_MYSQL_DSN") != "" {
		cfg, err := mysql.ParseDSN(conftest.MySQLDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		role := cfg.Clone()
		role.User, role.Passwd = "sqlease_no_such_role", "topsecret"
		db := cfg.Clone()
		db.DBName = "sqlease_no_such_db"
		cases = append(cases,
			tc{role.FormatDSN(), `role "sqlease_no_such_role" was refused by the mysql database ***@` + cfg.Net + "(" + cfg.Addr + ")/" + cfg.DBName, "topsecret"},
			tc{db.FormatDSN(), `database "sqlease_no_such_db" does not exist on the mysql server`, ""},
			// The CLI's URL form.
			tc{"mysql://sqlease_no_such_role:topsecret@" + cfg.Addr + "/" + cfg.DBName, `role "sqlease_no_such_role" was refused by the mysql database`, "topsecret"},
			tc{"mysql://" + cfg.User + "@" + cfg.Addr + "/sqlease_no_such_db", `database "sqlease_no_such_db" does not exist on the mysql server`, ""})
	}
	if len(cases) == 0 {
		t.Skip("needs $SQLEASE_POSTGRES_DSN or $SQLEASE_MYSQL_DSN")
	}
	for _, c := range cases {
		for _, cmd := range []string{"migrate", "status"} {
			r := cli(t, cmd, "--dsn", c.dsn)
			msg := strings.TrimSpace(r.stderr)
			if r.code != 2 || !strings.HasPrefix(msg, "sqlease "+cmd+": "+c.want) || strings.Contains(msg, "\n") || strings.Contains(msg, "cannot reach") {
				t.Errorf("%s --dsn %s: want exit 2 and one line %q, got %v", cmd, redactDSN(c.dsn), c.want, r)
			}
			if c.not != "" && strings.Contains(msg, c.not) {
				t.Errorf("%s: the message shows the password: %s", cmd, msg)
			}
		}
	}
}

// TestSchemaOnSQLite: --schema on SQLite is refused in the tool's terms
// (SQLite has no schemas: use --prefix), not the dialect package's
// (CapSchemas), before and after the database is reached.
func TestSchemaOnSQLite(t *testing.T) {
	path := migrated(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--dsn", path, "--schema", "app"}, `invalid --schema "app": sqlite databases have no schemas; omit --schema and keep lock tables apart with --prefix (such as --prefix app_)`},
		{[]string{"migrate", "--dsn", path, "--schema", "locks"}, `invalid --schema "locks": sqlite databases have no schemas; omit --schema and keep lock tables apart with --prefix (such as --prefix locks_)`},
		{[]string{"sweep", "--dsn", path, "--schema", "Bad-Name"}, `invalid --schema "Bad-Name": sqlite databases have no schemas; omit --schema and keep lock tables apart with --prefix (such as --prefix app_)`},
		{[]string{"drop", "--dsn", filepath.Join(t.TempDir(), "absent.db"), "--schema", "app", "--yes"}, `invalid --schema "app": sqlite databases have no schemas`},
	} {
		r := cli(t, tc.args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "sqlease "+tc.args[0]+": "+tc.want) || strings.Contains(r.stderr, "CapSchemas") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%q: want exit 2 and one line %q, got %v", tc.args, tc.want, r)
		}
	}
	// The suggested flag works.
	if r := cli(t, "migrate", "--dsn", path, "--prefix", "app_"); r.code != 0 {
		t.Errorf("migrate --prefix app_: %v", r)
	}
	if r := cli(t, "status", "--dsn", path, "--prefix", "app_"); r.code != 0 {
		t.Errorf("status --prefix app_: %v", r)
	}
}

// TestEmptyPrefixIsDefault: an empty --prefix means the default prefix, as
// lock.WithTablePrefix("") does, in every command and spelling.
func TestEmptyPrefixIsDefault(t *testing.T) {
	path := migrated(t)
	l := locker(t, path, lock.WithOwner("worker-a"), lock.WithTTL(time.Minute))
	if _, err := l.TryAcquire(t.Context(), "jobs/nightly", lock.Exclusive); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, "migrate", "--dsn", path, "--prefix", ""); r.code != 0 || !strings.Contains(r.stdout, "already up to date") {
		t.Errorf("migrate --prefix '': want the default tables up to date, got %v", r)
	}
	if r := cli(t, "migrate", "status", "--dsn", path, "-prefix="); r.code != 0 || !strings.Contains(r.stdout, "up to date (table sqlease_db_version)") {
		t.Errorf("migrate status -prefix=: want the default version table, got %v", r)
	}
	if hs := statusJSON(t, "--dsn", path, "--prefix", ""); len(hs) != 1 || hs[0].Key != "jobs/nightly" {
		t.Errorf("status --prefix '': want the lease in the default tables, got %+v", hs)
	}
	if r := cli(t, "sweep", "--dsn", path, "--prefix="); r.code != 0 {
		t.Errorf("sweep --prefix=: %v", r)
	}
	if r := cli(t, "drop", "--dsn", path, "--prefix", ""); r.code != 2 || !strings.Contains(r.stderr, "of prefix sqlease_ in") {
		t.Errorf("drop --prefix '' without --yes: want exit 2 naming prefix sqlease_, got %v", r)
	}
	// --schema '' is still refused: it would mean whatever schema the
	// connection has.
	if r := cli(t, "status", "--dsn", path, "--schema", ""); r.code != 2 || !strings.Contains(r.stderr, `invalid value "" for flag --schema: empty`) {
		t.Errorf("status --schema '': want exit 2, got %v", r)
	}
	if r := cli(t, "help", "status"); !strings.Contains(r.stdout, "which an empty --prefix also means") {
		t.Errorf("help status: want --prefix to say an empty one means the default, got %v", r)
	}
}

// TestDropHintRepeatsFlags: drop's closing advice to reinstall repeats the
// flags that were given (--dialect, --dsn as the placeholder DSN, unless
// it came from $SQLEASE_DSN, --prefix), as the advice to migrate does, and
// runs as printed.
func TestDropHintRepeatsFlags(t *testing.T) {
	hint := regexp.MustCompile("; `(sqlease migrate up[^`]*)` installs it afresh\n")
	for _, tc := range []struct {
		env  bool     // the DSN from $SQLEASE_DSN
		args []string // the flags besides --dsn
		want string
	}{
		{false, nil, "sqlease migrate up --dsn DSN"},
		{false, []string{"--prefix", "app_"}, "sqlease migrate up --dsn DSN --prefix app_"},
		{false, []string{"--dialect", "sqlite", "--prefix", "app_"}, "sqlease migrate up --dialect sqlite --dsn DSN --prefix app_"},
		{true, []string{"--prefix", "app_"}, "sqlease migrate up --prefix app_"},
	} {
		t.Setenv(dsnEnv, "")
		path := sqliteFile(t)
		dsnArgs := []string{"--dsn", path}
		if tc.env {
			t.Setenv(dsnEnv, path)
			dsnArgs = nil
		}
		if r := cli(t, append(append([]string{"migrate"}, dsnArgs...), tc.args...)...); r.code != 0 {
			t.Fatalf("migrate %q: %v", tc.args, r)
		}
		r := cli(t, append(append([]string{"drop", "--yes"}, dsnArgs...), tc.args...)...)
		m := hint.FindStringSubmatch(r.stdout)
		if r.code != 0 || m == nil || m[1] != tc.want {
			t.Errorf("drop %q (DSN from env %v): want the hint %q, got %v", tc.args, tc.env, tc.want, r)
			continue
		}
		run := strings.Fields(strings.TrimPrefix(m[1], "sqlease "))
		for i, a := range run {
			if a == "DSN" {
				run[i] = path
			}
		}
		if r := cli(t, run...); r.code != 0 || !strings.Contains(r.stdout, "OK   00001_") {
			t.Errorf("the hinted %q: want the tables installed afresh, got %v", run, r)
		}
		if r := cli(t, append(append([]string{"status"}, dsnArgs...), tc.args...)...); r.code != 0 {
			t.Errorf("status %q after the hinted migrate: %v", tc.args, r)
		}
	}
}

// TestInMemorySQLiteRefused: the commands that read or change lasting
// state refuse an in-memory SQLite database (exit 2, saying why) instead
// of migrating one that vanishes when the command exits; check, which
// never uses the DSN's database, still runs.
func TestInMemorySQLiteRefused(t *testing.T) {
	t.Setenv(dsnEnv, "")
	const want = "names an in-memory sqlite database: it vanishes when this command exits, so nothing done to it would last, and it holds no other process's lock tables; name a database file instead, such as --dsn locks.db"
	for _, dsn := range []string{"file::memory:", ":memory:", "file::memory:?cache=shared", "sqlite::memory:", "file:memdb1?mode=memory&cache=shared", "file:x.db?vfs=memdb"} {
		for _, cmd := range [][]string{{"migrate"}, {"migrate", "up"}, {"migrate", "status"}, {"migrate", "down", "--yes"}, {"status"}, {"sweep"}, {"drop", "--yes"}} {
			args := append(append([]string{}, cmd...), "--dsn", dsn)
			r := cli(t, args...)
			wantLine := fmt.Sprintf("sqlease %s: DSN %q %s\n", cmd[0], dsn, want)
			if r.code != 2 || r.stderr != wantLine || r.stdout != "" {
				t.Errorf("%q: want exit 2 and %q, got %v", args, wantLine, r)
			}
		}
	}
	// From $SQLEASE_DSN too, and with --dialect.
	t.Setenv(dsnEnv, "file::memory:")
	if r := cli(t, "migrate"); r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("migrate with $%s=file::memory:: want exit 2, got %v", dsnEnv, r)
	}
	t.Setenv(dsnEnv, "")
	if r := cli(t, "migrate", "--dialect", "sqlite", "--dsn", "file::memory:"); r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("migrate --dialect sqlite --dsn file::memory:: want exit 2, got %v", r)
	}
	// A file database whose journal is in memory is a file database.
	path := filepath.Join(t.TempDir(), "j.db")
	if r := cli(t, "migrate", "--dsn", "file:"+path+"?_journal_mode=memory"); r.code != 0 {
		t.Errorf("migrate on a file with _journal_mode=memory: %v", r)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("migrate on a file with _journal_mode=memory made no file: %v", err)
	}
}

// TestStatusShowsFIFOTickets: the tickets of FIFO waiters are listed as
// mode queued with their place in the key's queue in a QUEUE column of its
// own (TOKEN "-": a ticket holds nothing), and in --json as
// queue_position, "token" keeping the ticket's sequence number; help
// documents the mode.
func TestStatusShowsFIFOTickets(t *testing.T) {
	path := migrated(t)
	ctx := t.Context()
	holder := locker(t, path, lock.WithOwner("holder"), lock.WithTTL(time.Minute))
	x, err := holder.TryAcquire(ctx, "jobs/fifo", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	queued := func() []holderJSON {
		var q []holderJSON
		for _, h := range statusJSON(t, "--dsn", path, "--key", "jobs/") {
			if h.Mode == "queued" {
				q = append(q, h)
			}
		}
		return q
	}
	// Two waiters, the second after the first's ticket is written.
	for i, owner := range []string{"waiter-1", "waiter-2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := locker(t, path, lock.WithOwner(owner), lock.WithTTL(time.Minute))
			if le, err := w.Acquire(wctx, "jobs/fifo", lock.Exclusive, lock.FIFO()); err == nil {
				le.Release(context.Background())
			}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for len(queued()) < i+1 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	q := queued()
	if len(q) != 2 {
		t.Fatalf("status --json: want 2 queued tickets, got %+v", q)
	}
	for _, h := range q {
		want := map[string]int{"waiter-1": 1, "waiter-2": 2}[h.Owner]
		if h.QueuePosition != want || h.Key != "jobs/fifo" || h.PendingWriter || h.Expired || h.LeaseID == "" {
			t.Errorf("status --json: want %s's live ticket at queue_position %d, got %+v", h.Owner, want, h)
		}
	}
	for _, h := range statusJSON(t, "--dsn", path) {
		if h.Mode != "queued" && h.QueuePosition != 0 {
			t.Errorf("status --json: queue_position %d on a %s row", h.QueuePosition, h.Mode)
		}
	}
	r := cli(t, "status", "--dsn", path)
	for _, w := range []struct {
		owner string
		pos   int
	}{{"waiter-1", 1}, {"waiter-2", 2}} {
		row := regexp.MustCompile(fmt.Sprintf(`(?m)^jobs/fifo\s+queued\s+%s\s+\S+\s+-\s+%d\s+[0-9.]+s$`, w.owner, w.pos))
		if r.code != 0 || !row.MatchString(r.stdout) {
			t.Errorf("status: want %s's ticket as queued, TOKEN -, QUEUE %d, got %v", w.owner, w.pos, r)
		}
	}
	lease := regexp.MustCompile(fmt.Sprintf(`(?m)^jobs/fifo\s+exclusive\s+holder\s+%s\s+%d\s+-\s+`, x.LeaseID(), x.Token()))
	if !lease.MatchString(r.stdout) {
		t.Errorf("status: want the holder's lease with its token and QUEUE -, got %v", r)
	}
	if h := cli(t, "help", "status"); !strings.Contains(h.stdout, "queued for a FIFO") || !strings.Contains(h.stdout, "queue_position") {
		t.Errorf("help status: want the queued mode documented, got %v", h)
	}
}

// TestTimeoutNamesHungCasesDatabases: at --timeout, check names the cases
// still running and the databases they hold (left behind for the user to
// drop), and not those of the cases that ended.
func TestTimeoutNamesHungCasesDatabases(t *testing.T) {
	cfg := conftest.SQLite(t.TempDir())
	_, inUse := trackDatabases(&cfg)
	release := make(chan struct{})
	hungDSN := make(chan string, 1)
	cases := []conformance.Case{
		{Name: "X1_Ends", Rule: "X1", Run: func(e *conformance.Env) {}},
		{Name: "X2_Hangs", Rule: "X2", Run: func(e *conformance.Env) {
			hungDSN <- e.DSN
			<-release
		}},
	}
	_, rep, running := runCasesText(t, cfg, cases, time.Second)
	defer close(release)
	err := timedOut("sqlite", time.Second, running, inUse())
	dsn := <-hungDSN
	want := `timed out after 1s; still running: X2_Hangs; their lock tables are left behind, drop them by hand once they stop: database "` + dsn + `"`
	if rep.Summary.Passed != 1 || err == nil || err.Error() != want {
		t.Errorf("want 1 passed and\n%s\ngot %+v and\n%v", want, rep.Summary, err)
	}
}

// TestDescribeNamespacesNamesMySQLDatabases: what a hung case leaves is
// named in the dialect's words.
func TestDescribeNamespacesNamesMySQLDatabases(t *testing.T) {
	dbs := []conformance.Database{{Namespace: dialect.Namespace{Schema: "sqlease_t_1"}}, {Namespace: dialect.Namespace{Schema: "s", Prefix: "p_"}}}
	if got, want := describeNamespaces("mysql", dbs), `database "sqlease_t_1"; database "s", prefix "p_"`; got != want {
		t.Errorf("mysql: %s, want %s", got, want)
	}
	if got, want := describeNamespaces("postgres", dbs[:1]), `schema "sqlease_t_1"`; got != want {
		t.Errorf("postgres: %s, want %s", got, want)
	}
}
