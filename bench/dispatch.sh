#!/usr/bin/env bash
# Throughput of the bundled dispatch core per scenario and variant, the
# variants interleaved run by run (A B A B ...). Prints the median msg/s,
# broker CPU per message and the process's CPU use (cores busy).
# Usage: bench/dispatch.sh [RUNS] [MESSAGES]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
MESSAGES=${2:-200000}
OUT=bench/out/dispatch
mkdir -p "$OUT"
go build -o bench/out/offcpu ./cmd/offcpu
scenarios="key-shared-500x20 shared-500x20 telemetry-high-rate"
printf '%-22s %-10s %12s %12s %10s %8s\n' scenario variant "msg/s" "e2e p99 ms" "µs/msg" "cores"
for sc in $scenarios; do
	args=(--messages "$MESSAGES")
	[ "$sc" = telemetry-high-rate ] && args=(--duration 10s)
	for i in $(seq "$RUNS"); do
		for v in baseline candidate; do
			bench/out/offcpu dispatch -q --scenario "$sc" --variant "$v" "${args[@]}" --json "$OUT/$sc-$v-$i.json" > /dev/null
		done
	done
	for v in baseline candidate; do
		python3 - "$OUT" "$sc" "$v" "$RUNS" <<'PY'
import json, statistics, sys
out, sc, v, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rs = [json.load(open(f"{out}/{sc}-{v}-{i}.json")) for i in range(1, runs + 1)]
med = lambda k: statistics.median(r[k] for r in rs)
cores = statistics.median(r["process_cpu_s"] / r["duration_s"] for r in rs)
print(f"{sc:<22} {v:<10} {med('publish_rate'):12.0f} {med('e2e_p99_ms'):12.1f} {med('cpu_per_msg_us'):10.1f} {cores:8.2f}")
PY
	done
done
