// Package chaos is sqlease's chaos suite: several OS worker processes take
// leases through the public lock API and write to a ledger table through
// Lease.RunInTx while a driver injects faults, and a checker then verifies
// the whole recorded history against the contract (docs/contract.md).
//
// # Workers
//
// Run re-executes the running program once per worker (the test binary
// under go test, the sqlease binary for `sqlease chaos`) with the worker's
// spec in an environment variable; such a program calls WorkerMain when
// IsWorker reports true. Each worker holds Config.Lockers Lockers with TTLs
// spread over 300 ms..2 s and loops: acquire a random key (60% exclusive,
// 40% shared) → one to three fenced writes, each bumping the key's counter
// row and inserting a ledger row (key, token, lease, worker, mode, commit
// order, database time), one write in four dwelling inside its transaction
// for up to TTL/4 → release. It logs every step (grant with token and
// database time, renewal seen, write acknowledged or refused, release
// result, loss signals, errors) to its own JSON-lines file, one write(2)
// per event, so a SIGKILL leaves whole lines.
//
// # Faults
//
// Every 250-900 ms the driver injects one fault: SIGKILL of a worker
// (restarted 100-500 ms later), SIGSTOP of a worker for less than its
// shortest TTL or up to twice its longest (then SIGCONT), and on PostgreSQL
// pg_terminate_backend of workers' backends, a latency spike (50-400 ms per
// forwarded chunk for 0.5-2.5 s) or a cut of every connection in a TCP proxy
// on 127.0.0.1 that the workers connect through, and a restart (fast or
// immediate, at most every 12 s) of the PostgreSQL server. PostgreSQL runs
// as a private cluster the suite creates with the machine's initdb and
// postgres in a temporary directory, on a free port of 127.0.0.1, as OS user
// postgres; the restart fault is skipped, with its reason in the report,
// where no such cluster can be started. SQLite runs the workers on one WAL
// file with the kill and stop faults.
//
// The promote fault (opt-in, PostgreSQL private cluster only: Config.Faults
// must name it) gives the cluster an asynchronous hot standby at setup.
// Once per run, at 20-40% of the fault phase, the driver waits until the
// standby has replayed every commit acknowledged so far (the Synced
// instant), cuts replication, lets the primary go on until it has made
// more than 100 grants the standby never sees (at most 20 s), kills it,
// promotes the standby and points the workers' proxy at it, cutting their
// open connections. The run goes on there (a later restart restarts the
// new primary). Its instants are in Report.Promotion and faults.jsonl.
//
// Config.PromoteMode chooses how: PromoteAsync is the above; PromotePause
// is the same with every worker's Locker built with
// lock.WithFailoverPause(MaxTTL) (workers log a refusal for the pause as
// an ordinary refusal, class locked, marked pause); PromoteSync starts the
// primary with the standby as its synchronous standby (synchronous_commit
// on) and does not cut replication: after the catch-up the workers go on
// for 0.5-1.5 s, then the primary is killed while the standby is
// connected. In every mode the driver reads the promoted standby's lease
// rows before any worker reaches it.
//
// After the fault phase the driver continues stopped workers, restarts
// killed ones, stops the workers' loops, and asks each worker in turn to
// acquire every key with every Locker (the liveness probe).
//
// # Checks
//
// Over the whole history (check.go):
//
//   - S1: no lease is granted, in database time, while a conflicting lease
//     of the key is still live. A lease is live at least until its last
//     reported expiry when its holder was killed, and at least until its
//     last committed fenced write otherwise.
//   - S3: tokens are unique per key and increase in grant order.
//   - F1: no fenced write commits with a token a conflicting successor
//     superseded: not after the successor's grant (database time) and not
//     after the successor's own write (commit order of the key's counter).
//   - Every acknowledged write is in the ledger.
//   - A worker stopped for longer than a held lease's TTL is told of the
//     loss the first time it asks after resuming (lease.Err, RunInTx or
//     Release reporting the loss, or Remaining 0): workers log every
//     answer, and one that says "held" after such a stop is a violation.
//   - H8: no ErrReentrant for a key the Locker released.
//   - H9: a blocking acquire (WaitTimeout 2 s) returns within 2.5 s, plus a
//     1 s grace for a loaded machine, unless its worker was stopped
//     meanwhile; and it does not return a database error before its
//     WaitTimeout (every error the faults cause is transient, and transient
//     errors while waiting are retried).
//   - Liveness: after the faults, every worker acquires every key with every
//     Locker within the longest TTL (a killed holder's lease blocks that
//     long) plus one backoff step (MaxBackoff) plus a grace for a loaded
//     machine (ProbeGrace); ErrReentrant within that time is retried.
//
// Across a promotion (the promote fault), S1 and S3 are checked among the
// grants of each primary, and:
//
//   - S7: every token granted after the promotion exceeds every token
//     granted on its key before it, the lost grants included.
//   - The fenced-write checks (F1) run over the ledger the new primary has
//     plus the acknowledged writes the promotion lost (a worker saw them
//     accepted), ordered by primary, then by counter. Acknowledged writes
//     missing after the promotion are violations only when acknowledged
//     before Synced; later ones are counted as lost.
//   - A lease from before the promotion that overlaps a conflicting one
//     granted after it is S1 only when the standby is known to have had
//     its row live then (granted or renewed before Synced, not released);
//     otherwise it is counted apart, with the longest overlap (a holder of
//     a lost grant trusts it until its next renewal: the documented
//     residual risk of an asynchronous failover). In the pause and sync
//     modes every such overlap is an S1 violation.
//   - Every lease live at the kill (granted before it, neither released
//     nor reported lost before it, its last acknowledged expiry more than
//     200 ms past it) is looked up among the promoted standby's rows;
//     those missing are counted (LiveLost), and are violations
//     (lost-grant) in the sync mode, where every acknowledged write
//     missing after the promotion is a violation too.
//
// Config.Broken makes one worker misbehave (unfenced writes past its lease,
// or claiming another holder's lease) so tests can prove the checker fails.
//
// # Running it
//
// go test ./chaos runs the short form on SQLite and PostgreSQL (about a
// minute each); SQLEASE_CHAOS_DURATION=10m makes it long. `sqlease chaos
// --dialect postgres --duration 10m` runs it at length from the command
// line and prints the figures: run length, grants checked, faults by kind,
// violations and stuck keys.
package chaos
