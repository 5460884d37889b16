#!/usr/bin/env bash
# Flame graph speed on 100,000 unique stacks (depth 10-40, about 36 MB):
# offcpu flamegraph, and flamegraph.pl side by side when a copy exists
# locally ($FLAMEGRAPH_PL or flamegraph.pl on PATH; never fetched here).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/out
mkdir -p "$OUT"
go build -o "$OUT/offcpu" ./cmd/offcpu
OFFCPU_FOLDED_OUT="$PWD/$OUT/100k.folded" go test -count=1 -run TestWriteBenchInput ./flamegraph > /dev/null
ls -l "$OUT/100k.folded" | awk '{printf "input: %.1f MB, %d stacks\n", $5/1e6, 100000}'
time_cmd() { local s e; s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N); awk -v s="$s" -v e="$e" 'BEGIN {printf "%.3f", e-s}'; }
for i in 1 2 3; do
	t=$(time_cmd "$OUT/offcpu" flamegraph -o "$OUT/100k.svg" "$OUT/100k.folded")
	echo "offcpu flamegraph: ${t}s, $(stat -c %s "$OUT/100k.svg") bytes"
done
PL=${FLAMEGRAPH_PL:-$(command -v flamegraph.pl || true)}
if [ -n "$PL" ] && [ -f "$PL" ]; then
	t=$(time_cmd perl "$PL" "$OUT/100k.folded")
	perl "$PL" "$OUT/100k.folded" > "$OUT/100k.pl.svg"
	echo "flamegraph.pl: ${t}s, $(stat -c %s "$OUT/100k.pl.svg") bytes"
else
	echo "flamegraph.pl: not found (set FLAMEGRAPH_PL to a local copy to compare)"
fi
echo "go benchmark:"
go test -run xxx -bench Flamegraph100k -benchtime 5x ./flamegraph | grep Benchmark
