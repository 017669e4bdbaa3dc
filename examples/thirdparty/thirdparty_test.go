package thirdparty_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/sqlease/sqlease/cli"
	"github.com/sqlease/sqlease/conformance"

	"github.com/sqlease/sqlease/examples/thirdparty"
)

func init() { thirdparty.RegisterBackend() }

// TestMain lets multi-process cases re-execute this test binary as their
// children: a child does its share of the work and exits before any test
// runs (TestCheck's children would otherwise run TestCheck again).
func TestMain(m *testing.M) {
	if conformance.IsChild() {
		os.Exit(conformance.ChildMain())
	}
	os.Exit(m.Run())
}

// TestConformance runs the whole suite on the example dialect, as any
// dialect's tests do.
func TestConformance(t *testing.T) {
	cfg := thirdparty.Config(t.TempDir())
	cfg.Short = testing.Short()
	conformance.Run(t, cfg)
}

// TestCheck runs `sqlease check` on the example dialect through the
// importable tool, and checks that it leaves no file behind.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := cli.Main([]string{"check", "--dsn", filepath.Join(dir, "locks.tpdb"), "--run", "S1_|S3_|F1_|D2_Sweep", "--parallel", "2"}, &stdout, &stderr)
	if code != 0 || !regexp.MustCompile(`(?m)^\d+ passed, 0 failed, \d+ skipped$`).MatchString(stdout.String()) {
		t.Fatalf("check: exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("check left %d entries next to the DSN's file", len(ents))
	}
	t.Logf("%s", stdout.String())
}
