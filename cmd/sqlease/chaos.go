package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sqlease/sqlease/chaos"
	"github.com/sqlease/sqlease/cli"
)

func init() {
	cli.RegisterCommand(cli.Command{
		Name:    "chaos",
		Summary: "run the chaos suite (worker processes under kills, stops, connection faults and server restarts) and check the history",
		Setup:   setupChaos,
	})
}

// setupChaos registers the flags of `sqlease chaos`; the work is in
// package chaos.
func setupChaos(fs *flag.FlagSet, stdout, stderr io.Writer) func(context.Context, []string) error {
	var cfg chaos.Config
	var faults string
	fs.StringVar(&cfg.Dialect, "dialect", "sqlite", "`NAME` of the dialect under test: sqlite (a WAL file shared by the workers) or postgres (a private cluster the suite starts)")
	fs.DurationVar(&cfg.Duration, "duration", chaos.ShortDuration, "length of the fault phase (`DURATION`, 5s..24h)")
	fs.IntVar(&cfg.Workers, "workers", 4, "number of worker processes (`N`, 2..32)")
	fs.IntVar(&cfg.Keys, "keys", 3, "number of keys the workers contend on (`N`, 1..64)")
	fs.IntVar(&cfg.Lockers, "lockers", 2, "Lockers per worker, each with its own TTL in 300ms..2s (`N`, 1..8)")
	fs.StringVar(&faults, "faults", "", "comma-separated fault `KINDS` to inject, or none (default: all the dialect supports of "+strings.Join(chaos.DefaultFaults, ",")+"; also "+chaos.FaultPromote+", PostgreSQL only, opt-in: fail the private cluster over to an asynchronous standby once, with grants lost)")
	fs.StringVar(&cfg.PromoteMode, "promote-mode", chaos.PromoteAsync, "`MODE` of the promote fault: "+chaos.PromoteAsync+" (overlaps across the promotion counted, not S1), "+chaos.PromotePause+" (workers' Lockers with the failover pause: overlaps are S1 violations) or "+chaos.PromoteSync+" (a synchronous standby, no cut: overlaps, lost acknowledged writes and lost live leases are violations)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "`SEED` of the fault schedule and the workers' choices (default: random, printed)")
	fs.StringVar(&cfg.Dir, "dir", "", "keep worker logs and the SQLite file in `DIR` (default: a temporary directory, kept only when the run fails)")
	fs.StringVar(&cfg.PostgresDSN, "dsn", "", "PostgreSQL `DSN` on 127.0.0.1 to use when no private cluster can be started (no server binaries or no OS user postgres); the restart fault is then skipped (default $SQLEASE_DSN)")
	fs.StringVar(&cfg.Isolation, "isolation", "mixed", "PostgreSQL workers' default transaction isolation (`LEVEL`: \"read committed\", \"repeatable read\", \"serializable\", or mixed: one level per worker in turn)")
	fs.StringVar(&cfg.Broken, "broken", "", "make worker w0 misbehave (`MODE`: unfenced or phantom) to see the checker fail")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return cli.UsageError("unexpected argument %q", args[0])
		}
		switch faults {
		case "":
		case "none":
			cfg.Faults = []string{}
		default:
			cfg.Faults = strings.Split(faults, ",")
		}
		if cfg.PostgresDSN == "" {
			cfg.PostgresDSN = os.Getenv("SQLEASE_DSN")
		}
		cfg.Log = stderr
		rep, err := chaos.Run(ctx, cfg)
		if errors.Is(err, chaos.ErrInvalidConfig) {
			return cli.UsageError("%v", err)
		}
		if err != nil {
			return cli.UsageError("%v", err)
		}
		fmt.Fprint(stdout, rep)
		if !rep.OK() {
			return fmt.Errorf("%d violations, %d stuck keys", rep.ViolationCount(), len(rep.Stuck))
		}
		return nil
	}
}
