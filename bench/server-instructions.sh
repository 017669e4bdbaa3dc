#!/usr/bin/env bash
# Server instructions per operation on PostgreSQL, counted by valgrind's
# callgrind: sqlease's TryAcquire + Release and Do against the raw
# single-statement lease (bench/baselines.go), on a private cluster started
# for the run. Instruction counts do not depend on the machine's load, so
# this measures what the server does per operation even on a busy machine
# (docs/performance.md, "Server instructions per operation (PostgreSQL)").
#
#   bash bench/server-instructions.sh            # 1,000 operations per workload
#   N=3000 bash bench/server-instructions.sh
#   KEEP=/tmp/cg bash bench/server-instructions.sh   # keep the callgrind files
#
# KEEP names a directory that gets the callgrind file of each run's server
# process (WORKLOAD.N.callgrind), for callgrind_annotate.
#
# Needs valgrind (apt-get install valgrind) and PostgreSQL's server binaries
# ($SQLEASE_PG_BIN, else the newest /usr/lib/postgresql/*/bin). The server
# must not run as root: run this as OS user postgres, or as root with an OS
# user postgres (the server then runs as postgres through runuser). Takes
# about a minute.
set -euo pipefail
shopt -s inherit_errexit

if [ -n "${KEEP-}" ]; then
	[ -d "$KEEP" ] || { echo "server-instructions: KEEP='$KEEP' is not a directory" >&2; exit 2; }
	KEEP=$(cd "$KEEP" && pwd) # before the cd below: a relative KEEP names the caller's directory
fi
cd "$(dirname "$0")/.."
N=${N-1000}
if ! [[ $N =~ ^[1-9][0-9]{0,6}$ ]]; then
	echo "server-instructions: N='$N': want a whole number of operations from 1 to 9999999 (default 1000)" >&2
	exit 2
fi
command -v valgrind >/dev/null || { echo "server-instructions: valgrind not found (apt-get install valgrind)" >&2; exit 2; }
bin=${SQLEASE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$bin/initdb" ] && [ -x "$bin/postgres" ] || { echo "server-instructions: no initdb/postgres in '$bin'; set SQLEASE_PG_BIN" >&2; exit 2; }
if [ "$(id -un)" = postgres ]; then
	aspg=()
elif [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
	aspg=(runuser -u postgres --)
else
	echo "server-instructions: run as OS user postgres, or as root with an OS user postgres" >&2
	exit 2
fi

dir=$(mktemp -d /tmp/sqlease-callgrind-XXXXXX)
chmod 755 "$dir"
[ ${#aspg[@]} -eq 0 ] || chown postgres "$dir"
server=
cleanup() {
	# The server runs in a session of its own (setsid below), whose process
	# group is its ID: an immediate shutdown (SIGQUIT) of the whole group
	# ends the postmaster and its children, under valgrind or not, and
	# nothing of the cluster is kept.
	if [ -n "$server" ]; then
		kill -QUIT -- "-$server" 2>/dev/null || true
		for _ in $(seq 1 150); do kill -0 -- "-$server" 2>/dev/null || break; sleep 0.2; done
		kill -KILL -- "-$server" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

go build -o "$dir/bench" ./bench
"${aspg[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >/dev/null
port=$((20000 + RANDOM % 20000))
# autovacuum off: nothing else runs in the server while a workload is
# counted (each workload VACUUMs its tables before its warm-up).
cat >>"$dir/data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = off
autovacuum = off
shared_buffers = 32MB
EOF
# setsid: a session and process group of its own, so a Ctrl-C of this
# script reaches only the script, whose cleanup then stops the server.
setsid "${aspg[@]}" valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$dir/cg.%p" \
	"$bin/postgres" -D "$dir/data" >"$dir/server.log" 2>&1 &
server=$!
dsn="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
for _ in $(seq 1 300); do
	"$bin/pg_isready" -q -h 127.0.0.1 -p "$port" && break
	sleep 0.5
done
"$bin/pg_isready" -q -h 127.0.0.1 -p "$port" || { echo "server-instructions: the server did not start:" >&2; tail -n 20 "$dir/server.log" >&2; exit 1; }

# instructions N prints the instruction total of the server process that
# ran the workload's warm-up and then N operations.
instructions() {
	local pid total
	pid=$(SQLEASE_BENCH_CHILD=serverops SQLEASE_BENCH_DSN="$dsn" SQLEASE_BENCH_OPS="$1" SQLEASE_BENCH_N="$2" "$dir/bench")
	if ! [[ $pid =~ ^[0-9]+$ ]]; then
		echo "server-instructions: workload $1 printed '$pid', not a server process ID" >&2
		exit 1
	fi
	for _ in $(seq 1 150); do
		total=$(sed -n "s/^==$pid== Collected : \([0-9]*\)$/\1/p" "$dir/server.log")
		if [ -n "$total" ]; then
			[ -z "${KEEP-}" ] || cp "$dir/cg.$pid" "$KEEP/$1.$2.callgrind"
			echo "$total"
			return
		fi
		sleep 0.2
	done
	echo "server-instructions: no callgrind total for server process $pid" >&2
	exit 1
}

echo "server instructions per operation, PostgreSQL $("$bin/postgres" --version | awk '{print $3}'), $N operations per workload, load average $(cut -d' ' -f1-3 /proc/loadavg)"
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
