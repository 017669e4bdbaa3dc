#!/usr/bin/env bash
# Instructions per operation on SQLite, counted by valgrind's callgrind:
# sqlease's TryAcquire + Release and Do against the raw single-statement
# lease (bench/baselines.go), on a SQLite file in a temp directory. SQLite
# runs inside the bench process, so the count is the whole process: the
# engine, database/sql, the driver (mattn/go-sqlite3) and SQLite itself.
# Instruction counts depend little on the machine's load, so this compares
# builds even on a busy machine (docs/performance.md, "Instructions per
# operation (SQLite)"); the Go runtime's own threads (GC, sysmon) still
# move a run's count by up to about 2%, so each workload runs RUNS times
# and the median is printed, with the range.
#
#   bash bench/sqlite-instructions.sh            # 3,000 operations per workload, 3 runs
#   N=10000 RUNS=5 bash bench/sqlite-instructions.sh
#   KEEP=/tmp/cg bash bench/sqlite-instructions.sh   # keep the callgrind files
#
# KEEP names a directory that gets the callgrind file of each run
# (sqlite.WORKLOAD.N.RUN.callgrind), for callgrind_annotate.
#
# Needs valgrind (apt-get install valgrind) and cgo (mattn/go-sqlite3). The
# process runs with GOMAXPROCS=1 and without asynchronous preemption.
# Takes about two minutes.
set -euo pipefail
shopt -s inherit_errexit

N=${N-3000}
RUNS=${RUNS-3}
if ! [[ $N =~ ^[1-9][0-9]{0,6}$ ]]; then
	echo "sqlite-instructions: N='$N': want a whole number of operations from 1 to 9999999 (default 3000)" >&2
	exit 2
fi
if ! [[ $RUNS =~ ^[1-9]$ ]]; then
	echo "sqlite-instructions: RUNS='$RUNS': want a number of runs from 1 to 9 (default 3)" >&2
	exit 2
fi
if [ -n "${KEEP-}" ]; then
	[ -d "$KEEP" ] || { echo "sqlite-instructions: KEEP='$KEEP' is not a directory" >&2; exit 2; }
	KEEP=$(cd "$KEEP" && pwd) # before the cd below: a relative KEEP names the caller's directory
fi
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "sqlite-instructions: valgrind not found (apt-get install valgrind)" >&2; exit 2; }

dir=$(mktemp -d /tmp/sqlease-callgrind-XXXXXX)
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
go build -o "$dir/bench" ./bench

# instructions W N R prints the instruction total of a bench process that
# ran workload W's warm-up and then N operations (serverops mode,
# bench/serverops.go), the Rth time.
instructions() {
	local out="$dir/cg.$1.$2.$3"
	if ! GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off SQLEASE_BENCH_CHILD=serverops \
		SQLEASE_BENCH_OPS="$1" SQLEASE_BENCH_N="$2" TMPDIR="$dir" \
		valgrind --tool=callgrind --callgrind-out-file="$out" "$dir/bench" >/dev/null 2>"$dir/log"; then
		echo "sqlite-instructions: workload $1 failed:" >&2
		tail -n 20 "$dir/log" >&2
		exit 1
	fi
	[ -z "${KEEP-}" ] || cp "$out" "$KEEP/sqlite.$1.$2.$3.callgrind"
	sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p' "$dir/log"
}

echo "process instructions per operation, SQLite (mattn/go-sqlite3), $N operations per workload, median of $RUNS runs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %-34s %14s %8s  %s\n' workload "one operation" instr/op "vs raw" "range of the runs"
raw=
for w in raw sqlease sqlease-do; do
	case $w in
	raw) what="upsert + delete (bench/baselines.go)" ;;
	sqlease) what="TryAcquire + Release" ;;
	sqlease-do) what="Do (blocking acquire + release)" ;;
	esac
	pers=()
	for r in $(seq 1 "$RUNS"); do
		a=$(instructions "$w" 0 "$r")
		b=$(instructions "$w" "$N" "$r")
		pers+=($(((b - a) / N)))
	done
	sorted=($(printf '%s\n' "${pers[@]}" | sort -n))
	per=${sorted[$((RUNS / 2))]}
	[ -n "$raw" ] || raw=$per
	printf '%-12s %-34s %14d %7.2fx  %d..%d\n' "$w" "$what" "$per" "$(echo "$per / $raw" | bc -l)" "${sorted[0]}" "${sorted[$((RUNS - 1))]}"
done
