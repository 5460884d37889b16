#!/usr/bin/env bash
# Cost of recording off-CPU stacks system-wide, side by side in one run:
# (a) nothing, (b) libbpf-tools offcputime, (c) offcpu record without
# wake-ups, (d) libbpf-tools wakeuptime, (e) offcpu record with wake-ups
# (its default; on-CPU sampling off in all offcpu runs), and the cost of
# .eh_frame unwinding: (f) frame pointers only, (g, h) every switch walked
# (--no-stack-reuse) with and without unwind tables. The ping-pong is a
# C program on glibc, whose code has no frame pointers here.
# A C ping-pong pinned to one CPU makes ~2 context switches per round.
# Reports ns per sched_switch program run (kernel bpf_stats) and the
# workload's slowdown. Needs root. Usage: bench/overhead.sh [ROUNDS] [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-400000}
REPEATS=${2:-3}
OUT=bench/out
mkdir -p "$OUT"
gcc -O2 -pthread -o "$OUT/pingpong" bench/c/pingpong.c
go build -o "$OUT/offcpu" ./cmd/offcpu
OFFCPUTIME=$(command -v offcputime || echo /usr/sbin/offcputime)
WAKEUPTIME=$(command -v wakeuptime || echo /usr/sbin/wakeuptime)
[ -x "$WAKEUPTIME" ] || WAKEUPTIME=""
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

declare -a base tool ours wtool wours tool_cost ours_cost wtool_cost wours_switch wours_wake
declare -a fp fp_cost walk walk_cost fpwalk fpwalk_cost
# run_tool CMD... : starts a libbpf-tools recorder, runs the workload, prints
# "WALL COST" for programs named $PAT.
run_tool() {
	sysctl -qw kernel.bpf_stats_enabled=1
	"$@" > "$OUT/tool.txt" 2>/dev/null &
	local tp=$!
	sleep 2
	local w; w=$(workload)
	local c; c=$(prog_cost "$PAT")
	kill -INT $tp 2>/dev/null || true; wait $tp || true
	sysctl -qw kernel.bpf_stats_enabled=0
	echo "$w ${c%% *}"
}
# run_ours FLAGS... : prints "WALL SWITCH_NS SWITCH_RUNS WAKING_NS WAKING_RUNS".
run_ours() {
	"$OUT/offcpu" record -o "$OUT/offcpu.pb.gz" --stats --cpu-hz 0 "$@" > /dev/null 2> "$OUT/offcpu.log" &
	local op=$!
	sleep 2
	local w; w=$(workload)
	kill -INT $op 2>/dev/null || true; wait $op || true
	local sw wk
	sw=$(awk '/bpf offcpu_switch:/ {print $6, $3}' "$OUT/offcpu.log")
	wk=$(awk '/bpf offcpu_waking:/ {print $6, $3}' "$OUT/offcpu.log")
	echo "$w ${sw:-0 0} ${wk:-0 0}"
}
for i in $(seq "$REPEATS"); do
	base+=("$(workload)")
	if [ -n "$OFFCPUTIME" ]; then
		PAT=sched_switch; r=$(run_tool "$OFFCPUTIME" 600); tool+=("${r%% *}"); tool_cost+=("${r##* }")
	fi
	r=($(run_ours --no-wakeups)); ours+=("${r[0]}"); ours_cost+=("${r[1]}")
	r=($(run_ours --no-wakeups --frame-pointers-only)); fp+=("${r[0]}"); fp_cost+=("${r[1]}")
	r=($(run_ours --no-wakeups --no-stack-reuse)); walk+=("${r[0]}"); walk_cost+=("${r[1]}")
	r=($(run_ours --no-wakeups --no-stack-reuse --frame-pointers-only)); fpwalk+=("${r[0]}"); fpwalk_cost+=("${r[1]}")
	if [ -n "$WAKEUPTIME" ]; then
		PAT=sched_wakeup; r=$(run_tool "$WAKEUPTIME" 600); wtool+=("${r%% *}"); wtool_cost+=("${r##* }")
	fi
	r=($(run_ours)); wours+=("${r[0]}")
	# Total BPF time per context switch: switch runs plus waking runs.
	wours_switch+=("$(awk -v a="${r[1]}" -v n="${r[2]}" -v b="${r[3]}" -v m="${r[4]}" 'BEGIN {printf "%.0f", n ? (a*n + b*m)/n : 0}')")
	wours_wake+=("${r[3]}")
done

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { awk -v x="$1" 'BEGIN {printf "%.1f", x/1e6}'; }
pct() { awk -v x="$1" -v b="$2" 'BEGIN {printf "%.1f%%", (x-b)*100/b}'; }
b=$(median "${base[@]}")
echo "workload: $ROUNDS round trips, pinned to CPU 0, $REPEATS runs each, medians"
printf '%-34s %10s %9s %16s\n' recorder "wall (ms)" slowdown "ns per run"
printf '%-34s %10s %9s %16s\n' "none" "$(ms "$b")" "-" "-"
if [ ${#tool[@]} -gt 0 ]; then
	t=$(median "${tool[@]}")
	printf '%-34s %10s %9s %16s\n' "libbpf-tools offcputime" "$(ms "$t")" "$(pct "$t" "$b")" "$(median "${tool_cost[@]}") /switch"
fi
o=$(median "${ours[@]}")
printf '%-34s %10s %9s %16s\n' "offcpu record --no-wakeups" "$(ms "$o")" "$(pct "$o" "$b")" "$(median "${ours_cost[@]}") /switch"
row() { local label=$1; shift; local -n w=$1 c=$2; local m; m=$(median "${w[@]}"); printf '%-34s %10s %9s %16s\n' "$label" "$(ms "$m")" "$(pct "$m" "$b")" "$(median "${c[@]}") /switch"; }
row "  --frame-pointers-only" fp fp_cost
row "  --no-stack-reuse (tables)" walk walk_cost
row "  --no-stack-reuse --fp-only" fpwalk fpwalk_cost
if [ ${#wtool[@]} -gt 0 ]; then
	t=$(median "${wtool[@]}")
	printf '%-34s %10s %9s %16s\n' "libbpf-tools wakeuptime" "$(ms "$t")" "$(pct "$t" "$b")" "$(median "${wtool_cost[@]}") /wakeup"
fi
o=$(median "${wours[@]}")
printf '%-34s %10s %9s %16s\n' "offcpu record (wake-ups)" "$(ms "$o")" "$(pct "$o" "$b")" "$(median "${wours_wake[@]}") /waking"
printf '%-34s %10s %9s %16s\n' "  total per switch with wake-ups" "" "" "$(median "${wours_switch[@]}") /switch"
