#!/usr/bin/env bash
# Cost of recording off-CPU stacks system-wide, side by side in one run:
# (a) nothing, (b) libbpf-tools offcputime, (c) offcpu record.
# A C ping-pong pinned to one CPU makes ~2 context switches per round.
# Reports ns per sched_switch program run (kernel bpf_stats) and the
# workload's slowdown. Needs root. Usage: bench/overhead.sh [ROUNDS] [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-400000}
REPEATS=${2:-3}
OUT=bench/out
mkdir -p "$OUT"
gcc -O2 -pthread -o "$OUT/pingpong" bench/pingpong.c
go build -o "$OUT/offcpu" ./cmd/offcpu
OFFCPUTIME=$(command -v offcputime || echo /usr/sbin/offcputime)
[ -x "$OFFCPUTIME" ] || { echo "libbpf-tools offcputime not found: apt-get install libbpf-tools" >&2; OFFCPUTIME=""; }

workload() { taskset -c 0 "$OUT/pingpong" "$ROUNDS"; }

# Mean ns per run and run count of BPF programs whose name matches $1.
prog_cost() {
	bpftool -j prog show 2>/dev/null | python3 -c '
import json,sys
pat=sys.argv[1]; ns=cnt=0
for p in json.load(sys.stdin):
    if pat in p.get("name",""):
        ns+=p.get("run_time_ns",0); cnt+=p.get("run_cnt",0)
print(f"{ns/cnt if cnt else 0:.0f} {cnt}")' "$1"
}

declare -a base tool ours tool_cost ours_cost
for i in $(seq "$REPEATS"); do
	base+=("$(workload)")

	if [ -n "$OFFCPUTIME" ]; then
		sysctl -qw kernel.bpf_stats_enabled=1
		"$OFFCPUTIME" 600 > "$OUT/offcputime.txt" 2>/dev/null &
		tp=$!
		sleep 2
		tool+=("$(workload)")
		tool_cost+=("$(prog_cost sched_switch)")
		kill -INT $tp 2>/dev/null || true; wait $tp || true
		sysctl -qw kernel.bpf_stats_enabled=0
	fi

	"$OUT/offcpu" record -o "$OUT/offcpu.pb.gz" --stats > /dev/null 2> "$OUT/offcpu.log" &
	op=$!
	sleep 2
	ours+=("$(workload)")
	kill -INT $op 2>/dev/null || true; wait $op || true
	ours_cost+=("$(awk '/bpf offcpu_switch:/ {print $6, $3}' "$OUT/offcpu.log")")
done

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
b=$(median "${base[@]}")
o=$(median "${ours[@]}")
oc=$(median "$(for c in "${ours_cost[@]}"; do echo "${c%% *}"; done)")
echo "workload: $ROUNDS round trips, pinned to CPU 0, $REPEATS runs each, medians"
printf '%-28s %12s %10s %14s\n' recorder "wall (ms)" slowdown "ns/switch run"
ms() { awk -v x="$1" 'BEGIN {printf "%.1f", x/1e6}'; }
pct() { awk -v x="$1" -v b="$2" 'BEGIN {printf "%.1f%%", (x-b)*100/b}'; }
printf '%-28s %12s %10s %14s\n' "none" "$(ms "$b")" "-" "-"
if [ ${#tool[@]} -gt 0 ]; then
	t=$(median "${tool[@]}")
	tc=$(median "$(for c in "${tool_cost[@]}"; do echo "${c%% *}"; done)")
	printf '%-28s %12s %10s %14s\n' "libbpf-tools offcputime" "$(ms "$t")" "$(pct "$t" "$b")" "$tc"
fi
printf '%-28s %12s %10s %14s\n' "offcpu record" "$(ms "$o")" "$(pct "$o" "$b")" "$oc"
