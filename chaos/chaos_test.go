package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sqlease/sqlease/chaos"
)

// durationEnv sets the fault phase of TestChaos* (default: the short form,
// chaos.ShortDuration); e.g. SQLEASE_CHAOS_DURATION=10m for the long form.
const durationEnv = "SQLEASE_CHAOS_DURATION"

func chaosDuration(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv(durationEnv)
	if s == "" {
		return chaos.ShortDuration
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s=%q: %v (want a Go duration such as 40s or 10m)", durationEnv, s, err)
	}
	return d
}

func runChaos(t *testing.T, cfg chaos.Config) *chaos.Report {
	t.Helper()
	cfg.Log = testWriter{t}
	rep, err := chaos.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	t.Logf("\n%s", rep)
	return rep
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

func requireClean(t *testing.T, rep *chaos.Report) {
	t.Helper()
	if !rep.OK() {
		t.Errorf("%d violations (%v), %d stuck keys; see the report above", rep.ViolationCount(), rep.ViolationsByRule, len(rep.Stuck))
	}
	if rep.Grants == 0 || rep.Acked == 0 {
		t.Errorf("the run checked %d grants and %d acknowledged writes; want some of each", rep.Grants, rep.Acked)
	}
	faults := 0
	for _, n := range rep.Faults {
		faults += n
	}
	if faults == 0 {
		t.Errorf("no fault was injected")
	}
	if rep.Probes == 0 {
		t.Errorf("no liveness probe ran")
	}
}

// TestChaosSQLite runs the chaos suite on one SQLite WAL file shared by
// several worker processes, with SIGKILL and SIGSTOP/SIGCONT faults.
func TestChaosSQLite(t *testing.T) {
	rep := runChaos(t, chaos.Config{Dialect: "sqlite", Duration: chaosDuration(t)})
	requireClean(t, rep)
}

// TestChaosPostgres runs the chaos suite on a private PostgreSQL cluster
// behind a TCP proxy, with every fault kind. Without server binaries or an
// OS user postgres it runs against $SQLEASE_POSTGRES_DSN in a fresh schema
// without the restart fault, and skips without either.
func TestChaosPostgres(t *testing.T) {
	cfg := chaos.Config{Dialect: "postgres", Duration: chaosDuration(t)}
	if why := chaos.PrivateClusterUnavailable(); why != "" {
		cfg.PostgresDSN = os.Getenv("SQLEASE_POSTGRES_DSN")
		if cfg.PostgresDSN == "" {
			if os.Getenv("SQLEASE_REQUIRE_POSTGRES") == "1" {
				t.Fatalf("SQLEASE_REQUIRE_POSTGRES=1 but no private cluster (%s) and SQLEASE_POSTGRES_DSN is not set", why)
			}
			t.Skipf("no private PostgreSQL cluster (%s) and SQLEASE_POSTGRES_DSN is not set", why)
		}
		t.Logf("no private cluster (%s): using SQLEASE_POSTGRES_DSN without the restart fault", why)
	}
	rep := runChaos(t, cfg)
	requireClean(t, rep)
	for _, kind := range chaos.AllFaults {
		if _, skipped := rep.Skipped[kind]; !skipped && rep.Faults[kind] == 0 {
			t.Errorf("no %s fault was injected", kind)
		}
	}
}

// TestChaosCatchesBrokenWorkers proves the checker can fail: a worker that
// writes without fencing past its lease, and one that claims leases it does
// not hold, are both caught.
func TestChaosCatchesBrokenWorkers(t *testing.T) {
	for _, tc := range []struct {
		mode string
		rule string
	}{
		{chaos.BrokenUnfenced, chaos.RuleFenced},
		{chaos.BrokenPhantom, chaos.RuleS3},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			rep := runChaos(t, chaos.Config{Dialect: "sqlite", Duration: 6 * time.Second, Workers: 3, Keys: 1, Dir: t.TempDir(),
				Faults: []string{}, Broken: tc.mode})
			if rep.ViolationsByRule[tc.rule] == 0 {
				t.Errorf("broken worker %q: no %s violation found (violations: %v)", tc.mode, tc.rule, rep.ViolationsByRule)
			}
		})
	}
}
