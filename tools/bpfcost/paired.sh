#!/usr/bin/env bash
# paired.sh OLD NEW N -- WORKLOAD...: the BPF time a recorded switch costs
# under two offcpu builds, alternated N times. Each run is `BUILD record
# --stats -- taskset -c 0 WORKLOAD`; its cost is the time of the programs a
# switch runs (the switch, the wake-up, the switch-in's end) over the
# switches. Prints each pair and the median ratio NEW/OLD. As root, on a
# quiet machine (docs/overhead.md).
set -euo pipefail
[ $# -ge 5 ] && [ "$4" = "--" ] || { echo "usage: $0 OLD NEW N -- WORKLOAD..." >&2; exit 2; }
old=$1 new=$2 n=$3
shift 4
cost() {
	"$1" record --stats -o "${TMPDIR:-/tmp}/paired.pb.gz" -- taskset -c 0 "${@:2}" 2>&1 | awk '
		/bpf offcpu_switch:/ {sr = $3; sm = $6}
		/bpf offcpu_waking:/ {wr = $3; wm = $6}
		/bpf offcpu_switched_in:/ {ir = $3; im = $6}
		END { if (sr == 0) exit 1; printf "%.0f\n", (sr * sm + wr * wm + ir * im) / sr }'
}
for _ in $(seq "$n"); do
	echo "$(cost "$old" "$@") $(cost "$new" "$@")"
done | awk '{ print $1 " ns, " $2 " ns"; r[NR] = $2 / $1 }
	END { n = asort(r); printf "median ratio new/old %.3f (%d pairs)\n", r[int((n + 1) / 2)], n }'
