#!/usr/bin/env bash
# Instructions per operation on SQLite, counted by valgrind's callgrind:
# sqlease's TryAcquire + Release and Do against the raw single-statement
# lease (bench/baselines.go), on a SQLite file in a temp directory. SQLite
# runs inside the bench process, so the count is the whole process: the
# engine, database/sql, the driver (mattn/go-sqlite3) and SQLite itself.
# Instruction counts do not depend on the machine's load, so this compares
# builds even on a busy machine (docs/performance.md, "Instructions per
# operation (SQLite)").
#
#   bash bench/sqlite-instructions.sh            # 3,000 operations per workload
#   N=10000 bash bench/sqlite-instructions.sh
#   KEEP=/tmp/cg bash bench/sqlite-instructions.sh   # keep the callgrind files
#
# KEEP names a directory that gets the callgrind file of each run
# (sqlite.WORKLOAD.N.callgrind), for callgrind_annotate.
#
# Needs valgrind (apt-get install valgrind) and cgo (mattn/go-sqlite3). The
# process runs with GOMAXPROCS=1 and without asynchronous preemption, so the
# count does not depend on goroutine scheduling. Takes about a minute.
set -euo pipefail
shopt -s inherit_errexit

cd "$(dirname "$0")/.."
N=${N-3000}
if ! [[ $N =~ ^[1-9][0-9]{0,6}$ ]]; then
	echo "sqlite-instructions: N='$N': want a whole number of operations from 1 to 9999999 (default 3000)" >&2
	exit 2
fi
if [ -n "${KEEP-}" ] && ! [ -d "$KEEP" ]; then
	echo "sqlite-instructions: KEEP='$KEEP' is not a directory" >&2
	exit 2
fi
command -v valgrind >/dev/null || { echo "sqlite-instructions: valgrind not found (apt-get install valgrind)" >&2; exit 2; }

dir=$(mktemp -d /tmp/sqlease-callgrind-XXXXXX)
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
go build -o "$dir/bench" ./bench

# instructions W N prints the instruction total of a bench process that ran
# workload W's warm-up and then N operations (serverops mode, bench/serverops.go).
instructions() {
	local out="$dir/cg.$1.$2"
	if ! GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off SQLEASE_BENCH_CHILD=serverops \
		SQLEASE_BENCH_OPS="$1" SQLEASE_BENCH_N="$2" TMPDIR="$dir" \
		valgrind --tool=callgrind --callgrind-out-file="$out" "$dir/bench" >/dev/null 2>"$dir/log"; then
		echo "sqlite-instructions: workload $1 failed:" >&2
		tail -n 20 "$dir/log" >&2
		exit 1
	fi
	[ -z "${KEEP-}" ] || cp "$out" "$KEEP/sqlite.$1.$2.callgrind"
	sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p' "$dir/log"
}

echo "process instructions per operation, SQLite (mattn/go-sqlite3), $N operations per workload, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %-34s %14s %8s\n' workload "one operation" instr/op "vs raw"
raw=
for w in raw sqlease sqlease-do; do
	case $w in
	raw) what="upsert + delete (bench/baselines.go)" ;;
	sqlease) what="TryAcquire + Release" ;;
	sqlease-do) what="Do (blocking acquire + release)" ;;
	esac
	a=$(instructions "$w" 0)
	b=$(instructions "$w" "$N")
	per=$(((b - a) / N))
	[ -n "$raw" ] || raw=$per
	printf '%-12s %-34s %14d %7.2fx\n' "$w" "$what" "$per" "$(echo "$per / $raw" | bc -l)"
done
