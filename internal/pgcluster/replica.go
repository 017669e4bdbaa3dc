package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// StartStandby makes a hot standby of primary and starts it:
// pg_basebackup -R of the primary into a new temporary directory, on a new
// port, streaming with application_name name (the name a synchronous
// primary waits for, see Config.SynchronousStandby). It streams through a
// Proxy of its own, so CutReplication can partition it from the primary.
// Its synchronous_standby_names is empty: promoted, it waits for nobody.
func StartStandby(ctx context.Context, primary *Cluster, name string) (*Cluster, error) {
	if !validName(name) {
		return nil, fmt.Errorf("pgcluster: standby name %q: want 1-63 ASCII letters, digits or underscores", name)
	}
	link, err := StartProxy(primary.Addr())
	if err != nil {
		return nil, err
	}
	c, err := basebackup(ctx, primary, link.Addr(), true)
	if err != nil {
		link.Close()
		return nil, err
	}
	c.name, c.primary, c.link = name, primary, link
	host, port, _ := net.SplitHostPort(link.Addr())
	// postgresql.auto.conf is read last: this primary_conninfo wins over
	// the one pg_basebackup -R wrote there.
	conf := fmt.Sprintf("primary_conninfo = 'host=%s port=%s user=postgres application_name=%s'\n"+
		"wal_retrieve_retry_interval = '200ms'\n", host, port, name)
	if err := c.appendConf("postgresql.auto.conf", conf); err != nil {
		c.Remove()
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.Remove()
		return nil, err
	}
	return c, nil
}

// BaseBackup takes a base backup of the running cluster c (pg_basebackup
// with its WAL) into a new temporary directory, as a cluster of its own on
// a new port, not started: Start recovers it to the end of the backup and
// runs it as a primary of its own, which never sees what c did after the
// backup (a restore from a backup).
func (c *Cluster) BaseBackup(ctx context.Context) (*Cluster, error) {
	return basebackup(ctx, c, c.Addr(), false)
}

// basebackup copies src, connecting to it through addr, into a new
// cluster, set up as a standby (standby.signal, primary_conninfo) when
// standby; it is not started.
func basebackup(ctx context.Context, src *Cluster, addr string, standby bool) (*Cluster, error) {
	if why := ReplicationUnavailable(); why != "" {
		return nil, errors.New(why)
	}
	c, err := newDir()
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	args := []string{"-h", host, "-p", port, "-U", "postgres", "-D", c.data, "-X", "stream", "-c", "fast", "--no-sync"}
	if standby {
		args = append(args, "-R")
	}
	if out, err := c.run(ctx, "pg_basebackup", args...); err != nil {
		os.RemoveAll(c.dir)
		return nil, fmt.Errorf("pg_basebackup: %v: %s", err, out)
	}
	// The source's settings come with the copy; its port, socket and
	// synchronous standby are not the copy's.
	if err := c.appendConf("postgresql.conf", c.localConf()+"synchronous_standby_names = ''\n"); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

// CutReplication partitions a standby from its primary: its replication
// connection is cut and new ones are refused until ResumeReplication. The
// primary goes on committing (unless it waits for this standby: see
// Config.SynchronousStandby); the standby keeps what it had.
func (c *Cluster) CutReplication() error {
	if c.link == nil {
		return errors.New("pgcluster: CutReplication on a cluster that is not a standby")
	}
	c.link.Block(true)
	c.link.Cut()
	return nil
}

// ResumeReplication lets a standby cut by CutReplication connect to its
// primary again (it retries every 200ms).
func (c *Cluster) ResumeReplication() error {
	if c.link == nil {
		return errors.New("pgcluster: ResumeReplication on a cluster that is not a standby")
	}
	c.link.Block(false)
	return nil
}

// WaitCaughtUp waits until the standby has replayed everything its primary
// has written so far: its pg_last_wal_replay_lsn() reaches the primary's
// pg_current_wal_insert_lsn() taken now (the insert position, not
// pg_current_wal_lsn(): an asynchronous commit may still sit in the WAL
// buffers). It fails when ctx ends first, e.g. while replication is cut.
func (c *Cluster) WaitCaughtUp(ctx context.Context) error {
	if c.primary == nil {
		return errors.New("pgcluster: WaitCaughtUp on a cluster that is not a standby")
	}
	var target string
	if err := c.primary.query(ctx, "SELECT pg_current_wal_insert_lsn()::text", nil, &target); err != nil {
		return fmt.Errorf("pgcluster: primary's WAL insert position: %w", err)
	}
	var replayed string
	for {
		var ok bool
		err := c.query(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false), coalesce(pg_last_wal_replay_lsn()::text, '')", []any{target}, &ok, &replayed)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: standby replayed up to %q, not to the primary's %s: %w (last error: %v)", replayed, target, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Promote makes the standby a primary (pg_promote, which is what
// pg_ctl promote does) and waits until pg_is_in_recovery() is false. Its
// link to the old primary is cut for good.
func (c *Cluster) Promote(ctx context.Context) error {
	if c.primary == nil {
		return errors.New("pgcluster: Promote on a cluster that is not a standby")
	}
	for attempt := 1; ; attempt++ {
		var ok bool
		err := c.query(ctx, "SELECT pg_promote(true, 60)", nil, &ok)
		var pe *pgconn.PgError
		switch {
		case err == nil && !ok:
			return fmt.Errorf("pgcluster: pg_promote did not finish within 60s (see %s)", c.LogPath())
		case err == nil:
		case errors.As(err, &pe) && pe.Code == "55000" && attempt > 1:
			// "recovery is not in progress": the cancelled call below
			// had started the promotion.
		case errors.As(err, &pe) && pe.Code == "40001" && attempt < 20:
			// A recovery conflict cancelled the call on the standby
			// ("canceling statement due to conflict with recovery"):
			// the promotion may have started or not; ask again, after
			// a pause that lets replay move past the conflict (CI saw
			// five conflicts in a row without one).
			select {
			case <-ctx.Done():
				return fmt.Errorf("pgcluster: promote: %w (last error: %v)", ctx.Err(), err)
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			}
			continue
		default:
			return fmt.Errorf("pgcluster: promote: %w", err)
		}
		break
	}
	for {
		var inRecovery bool
		err := c.query(ctx, "SELECT pg_is_in_recovery()", nil, &inRecovery)
		if err == nil && !inRecovery {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: still in recovery after promotion: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.link.Block(true)
	c.link.Cut()
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}
