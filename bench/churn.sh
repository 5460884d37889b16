#!/usr/bin/env bash
# Recording system-wide under process churn, side by side in one run:
# (a) offcpu record, (b) optionally another offcpu build, (c) libbpf-tools
# offcputime, while a C
# launcher starts RATE short-lived processes a second for SECS seconds
# (collector/testdata/churn: each sleeps 1 ms in nap_here and exits).
# Reports, per recorder: the share of the processes' off-CPU time with a
# named user frame, peak RSS, BPF map memory, its own CPU per process
# while the launcher runs, its BPF programs' run time per process (kernel
# bpf_stats; every program, the switch programs of all threads included),
# and its CPU over its whole life. Needs root.
# Usage: bench/churn.sh [RATE] [SECS] [OTHER_OFFCPU_BINARY (e.g. an older build)]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-500}
SECS=${2:-30}
OTHER=${3:-}
OUT=bench/out/churn
mkdir -p "$OUT"
gcc -O2 -o "$OUT/churn" collector/testdata/churn/churn.c
gcc -O2 -o "$OUT/nap" collector/testdata/churn/nap.c
go build -o "$OUT/offcpu" ./cmd/offcpu
OFFCPUTIME=$(command -v offcputime || echo /usr/sbin/offcputime)
[ -x "$OFFCPUTIME" ] || { echo "libbpf-tools offcputime not found: apt-get install libbpf-tools" >&2; OFFCPUTIME=""; }

# bpf_ids: the ids of the programs and maps loaded now.
bpf_ids() { { bpftool -j prog show; echo; bpftool -j map show; } | python3 -c '
import json, sys
docs = [json.loads(l) for l in sys.stdin.read().split("\n") if l.strip()]
print(" ".join("p%d" % p["id"] for p in docs[0]), " ".join("m%d" % m["id"] for m in docs[1]))'; }
# bpf_since IDS: run time (ns) of the programs and memory (bytes) of the
# maps loaded since bpf_ids printed IDS: the recorder's.
bpf_since() {
	{ bpftool -j prog show; echo; bpftool -j map show; } | python3 -c '
import json, sys
old = set(sys.argv[1].split())
docs = [json.loads(l) for l in sys.stdin.read().split("\n") if l.strip()]
print(sum(p.get("run_time_ns", 0) for p in docs[0] if "p%d" % p["id"] not in old),
      sum(m.get("bytes_memlock", 0) for m in docs[1] if "m%d" % m["id"] not in old))' "$1"
}
# cpu_ticks PID: user + system clock ticks of a process so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# named FILE COMM: share of COMM's off-CPU time with a named user frame
# in a folded file (comm;user...;-;kernel... value).
named() {
	python3 - "$1" "$2" <<'PY'
import re, sys
tot = named = 0
for line in open(sys.argv[1]):
    stack, v = line.rstrip().rsplit(" ", 1)
    fr = stack.split(";")
    if fr[0] != sys.argv[2]: continue
    user = fr[1:fr.index("-")] if "-" in fr else fr[1:]
    tot += int(v)
    if any(f and not f.startswith("[") and "+0x" not in f for f in user): named += int(v)
print(f"{100*named/max(tot,1):.1f}")
PY
}
# offcputime prints blocks: kernel frames, "-", user frames, "-  comm (pid)", value.
named_offcputime() {
	python3 - "$1" <<'PY'
import sys
tot = named = 0
for b in open(sys.argv[1]).read().split("\n\n"):
    ls = [l.strip() for l in b.strip().split("\n") if l.strip()]
    if len(ls) < 2 or not ls[-1].isdigit(): continue
    head = [l for l in ls if l.startswith("-") and "(" in l]
    if not head or head[0].split()[1] != "nap": continue
    v = int(ls[-1]); tot += v
    i = ls.index(head[0]); seps = [j for j, l in enumerate(ls[:i]) if l == "-"]
    user = ls[seps[-1]+1:i] if seps else []
    if any(not f.startswith("[") and "+0x" not in f and f != "[unknown]" for f in user): named += v
print(f"{100*named/max(tot,1):.1f}")
PY
}

# churn_run: runs the launcher; prints how many processes it started.
churn_run() { "$OUT/churn" "$RATE" "$SECS" "$OUT/nap" 1000 | awk '{print $1}'; }
# record NAME CMD...: runs CMD (a recorder) around the launcher; prints
# "PROCESSES BPF_NS MAP_BYTES CPU_TICKS_DURING CPU_S_ALL PEAK_RSS_KB".
record() {
	local name=$1 n bpf mem ids c0 c1
	shift
	ids=$(bpf_ids)
	/usr/bin/time -f "%U %S %M" -o "$OUT/$name.time" "$@" > "$OUT/$name.out" 2> "$OUT/$name.log" &
	local pid=$!
	sleep 3
	local rec; rec=$(pgrep -P $pid | head -1)
	c0=$(cpu_ticks "$rec")
	n=$(churn_run)
	c1=$(cpu_ticks "$rec")
	read -r bpf mem < <(bpf_since "$ids")
	kill -INT "$rec" 2>/dev/null || true
	wait $pid || true
	awk -v n="$n" -v bpf="$bpf" -v mem="$mem" -v c="$((c1 - c0))" '{print n, bpf, mem, c, $1 + $2, $3}' "$OUT/$name.time"
}

sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=0' EXIT
hz=$(getconf CLK_TCK)

ours=$(record offcpu "$OUT/offcpu" record -d 1h --folded "$OUT/offcpu.folded" -o "$OUT/offcpu.pb.gz")
ours_named=$(named "$OUT/offcpu.folded" nap)
other=""
if [ -n "$OTHER" ]; then
	cp "$OTHER" "$OUT/offcpu-other"
	other=$(record offcpu-other "$OUT/offcpu-other" record -d 1h --folded "$OUT/offcpu-other.folded" -o "$OUT/offcpu-other.pb.gz")
	other_named=$(named "$OUT/offcpu-other.folded" nap)
fi
theirs=""
if [ -n "$OFFCPUTIME" ]; then
	theirs=$(record offcputime "$OFFCPUTIME")
	theirs_named=$(named_offcputime "$OUT/offcputime.out")
fi

printf "%d processes a second for %d s, each sleeping 1 ms in nap_here\n" "$RATE" "$SECS"
echo "| recorder | processes | named user frame | peak RSS | BPF map memory | recorder CPU per process while recording | BPF run time per process | recorder CPU in all (start and end too) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
line() { # NAME NAMED% N BPF MEM CPU_TICKS CPU_S RSS
	awk -v name="$1" -v named="$2" -v n="$3" -v bpf="$4" -v mem="$5" -v ticks="$6" -v cpu="$7" -v rss="$8" -v hz="$hz" 'BEGIN {
		printf "| %s | %d | %s%% | %.0f MB | %.1f MB | %.0f us | %.1f us | %.2f s |\n", name, n, named, rss/1024, mem/1048576, ticks*1e6/hz/n, bpf/1e3/n, cpu }'
}
line "offcpu record" "$ours_named" $ours
[ -n "$other" ] && line "$OTHER record" "$other_named" $other
[ -n "$theirs" ] && line "offcputime (libbpf-tools)" "$theirs_named" $theirs
echo "Files: $OUT/"
