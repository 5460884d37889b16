#!/usr/bin/env bash
# A real server's throughput under each recorder, rounds interleaved:
# redis-server on loopback driven by redis-benchmark (GET and SET, 50
# clients), with no recorder, offcpu record (every interval walked), offcpu
# record --budget 1%, offcpu record --no-wakeups (what offcputime records:
# no waker stacks), the agent at its defaults (record --continuous, 10 s
# intervals: give it REQUESTS=1000000 so that cuts fall within the load)
# and libbpf-tools offcputime, each system-wide with user and kernel
# stacks. Prints requests per second per round, the medians, and the
# median of each recorder's ratio to the same round's unprofiled run with
# its range. ROUNDS (default 5), REQUESTS (default 300000), RECORDERS
# (default: none offcpu offcpu-budget offcpu-no-wakeups offcpu-continuous
# offcputime). As root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-300000}
OUT=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"' EXIT
go build -o "$OUT/offcpu" ./cmd/offcpu
PORT=6399
redis-server --port $PORT --save '' --appendonly no --daemonize no > "$OUT/redis.log" 2>&1 &
for _ in $(seq 50); do redis-cli -p $PORT ping > /dev/null 2>&1 && break; sleep 0.1; done

# load prints the mean of GET and SET requests per second.
load() {
	redis-benchmark -p $PORT -t get,set -n "$REQUESTS" -c 50 -q --csv |
		awk -F'"' '/^"(GET|SET)"/ {s += $4; n++} END {printf "%.0f", s / n}'
}

# under CMD... runs the load while CMD records, then stops it.
under() {
	"$@" > "$OUT/rec.log" 2>&1 &
	local pid=$!
	sleep 3 # attached
	load
	kill -INT $pid
	wait $pid || true
}

declare -A all
read -ra names <<< "${RECORDERS:-none offcpu offcpu-budget offcpu-no-wakeups offcpu-continuous offcputime}"
for r in $(seq "$ROUNDS"); do
	for n in "${names[@]}"; do
		case $n in
		none) v=$(load) ;;
		offcpu) v=$(under "$OUT/offcpu" record -q -o "$OUT/o.pb.gz") ;;
		offcpu-budget) v=$(under "$OUT/offcpu" record -q --budget 1% -o "$OUT/o.pb.gz") ;;
		offcpu-no-wakeups) v=$(under "$OUT/offcpu" record -q --no-wakeups -o "$OUT/o.pb.gz") ;;
		offcpu-continuous) v=$(under "$OUT/offcpu" record -q --continuous --output-dir "$OUT/intervals" --keep 5) ;;
		offcputime) command -v offcputime > /dev/null || continue; v=$(under offcputime 600) ;;
		esac
		all[$n]+="$v "
		echo "round $r $n: $v requests/s"
	done
done
echo
# Paired: each round against the same round's unprofiled run (the load
# drifts between rounds more than within one).
echo "| recorder | requests/s (median of $ROUNDS) | vs none | paired: median of rounds (range) | rounds |"
echo "|---|---:|---:|---:|---|"
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(echo ${all[none]} | median)
for n in "${names[@]}"; do
	[ -n "${all[$n]:-}" ] || continue
	m=$(echo ${all[$n]} | median)
	ratios=$(paste <(echo ${all[$n]} | tr ' ' '\n') <(echo ${all[none]} | tr ' ' '\n') | awk 'NF == 2 {printf "%.4f ", $1 / $2}')
	pm=$(echo $ratios | median)
	range=$(echo $ratios | tr ' ' '\n' | grep . | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%+.1f%% to %+.1f%%", 100 * (lo - 1), 100 * (hi - 1)}')
	echo "| $n | $m | $(awk -v m="$m" -v b="$base" 'BEGIN {printf "%+.1f%%", 100 * (m - b) / b}') | $(awk -v r="$pm" 'BEGIN {printf "%+.1f%%", 100 * (r - 1)}') ($range) | ${all[$n]}|"
done
