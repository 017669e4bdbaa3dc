package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"

	"github.com/sqlease/sqlease/lock"
)

// Server instructions per operation (PostgreSQL). bench/server-instructions.sh
// starts a private PostgreSQL cluster under valgrind's callgrind, which
// counts the instructions each server process runs, whatever the machine's
// load. For each workload it runs the bench twice in this mode
// (SQLEASE_BENCH_CHILD=serverops) with two operation counts; the difference
// of the two connections' totals, divided by the difference of the counts,
// is the server's instructions per operation, free of connection start-up
// and warm-up. bench/sqlite-instructions.sh runs this mode without a DSN,
// on a SQLite file, and counts the whole bench process (SQLite runs in it).
//
// Environment of this mode:
const (
	serverOpsWorkloadEnv = "SQLEASE_BENCH_OPS" // raw, sqlease (TryAcquire + Release) or sqlease-do (Do)
	serverOpsCountEnv    = "SQLEASE_BENCH_N"   // operations after the warm-up
	// childDSNEnv: the cluster's DSN; empty for SQLite (a temp file).
)

// serverOpsWarmup operations run before the counted ones: they prepare the
// statements and settle the plans, as on a connection of a long-lived pool.
const serverOpsWarmup = 200

// serverOpsMain migrates a fresh schema, then runs the workload on a pool
// of one connection, so one server process runs every operation, and
// prints that process's ID on stdout before it starts (the script reads
// the process's instruction total from callgrind when it exits; 0 on
// SQLite).
func serverOpsMain() int {
	ctx := context.Background()
	which := os.Getenv(serverOpsWorkloadEnv)
	n, err := strconv.Atoi(os.Getenv(serverOpsCountEnv))
	if err != nil || n < 0 {
		fmt.Fprintf(os.Stderr, "bench serverops: %s=%q: want a count of operations >= 0\n", serverOpsCountEnv, os.Getenv(serverOpsCountEnv))
		return 2
	}
	e, err := setup(ctx, config{dsn: os.Getenv(childDSNEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench serverops:", err)
		return 1
	}
	defer e.close()
	db, err := sql.Open(e.driver, e.dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench serverops:", err)
		return 1
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)

	var w workload
	switch which {
	case "raw":
		r, err := newRawLease(ctx, e, e.db, "raw_ops")
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench serverops:", err)
			return 1
		}
		r.db = db
		w = r.workload("raw", "ops/", false)
	case "sqlease", "sqlease-do":
		l, err := e.newLocker(ctx, db)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench serverops:", err)
			return 1
		}
		defer closeLocker(l)
		w = sqleaseWorkload(l, "ops/", lock.Exclusive)
		if which == "sqlease-do" {
			w = sqleaseDoWorkload(l, "ops/", lock.Exclusive)
		}
	default:
		fmt.Fprintf(os.Stderr, "bench serverops: %s=%q: want raw, sqlease or sqlease-do\n", serverOpsWorkloadEnv, which)
		return 2
	}
	if err := vacuumLockTables(ctx, e); err != nil {
		fmt.Fprintln(os.Stderr, "bench serverops:", err)
		return 1
	}
	// On PostgreSQL, the ID of the server process that runs the workload
	// (the script reads its instruction total); on SQLite, which runs in
	// this process, 0.
	var pid int
	if e.isPG() {
		if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			fmt.Fprintln(os.Stderr, "bench serverops:", err)
			return 1
		}
	}
	fmt.Println(pid)
	for i := 0; i < serverOpsWarmup+n; i++ {
		if err := w.op(ctx, 0); err != nil {
			fmt.Fprintln(os.Stderr, "bench serverops:", err)
			return 1
		}
	}
	return 0
}
