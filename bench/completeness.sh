#!/usr/bin/env bash
# Share of off-CPU time whose user stack reaches the thread's entry
# function, for offcpu (unwind tables), offcpu --frame-pointers-only and
# libbpf-tools offcputime, on two workloads of this repository:
#   c:   collector/testdata/unwind/blocker.c built -O2 -fomit-frame-pointer
#        (threads blocked in pthread_cond_wait, nanosleep, read, epoll_wait)
#   jvm: collector/testdata/jvm/Contend.java under -XX:+PreserveFramePointer
#        with a perf map (threads contending on a synchronized block)
# A stack counts as whole when it holds the entry frame: run_* or main for
# c, thread_native_entry or JavaMain for the JVM. Threads blocked since
# before a recording started have no user stack in offcpu and are left
# out. Needs root. Usage: bench/completeness.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
OUT=bench/out/completeness
mkdir -p "$OUT"
go build -o "$OUT/offcpu" ./cmd/offcpu
gcc -O2 -fomit-frame-pointer -pthread -o "$OUT/blocker" collector/testdata/unwind/blocker.c
OFFCPUTIME=$(command -v offcputime || echo /usr/sbin/offcputime)
[ -x "$OFFCPUTIME" ] || { echo "libbpf-tools offcputime not found: apt-get install libbpf-tools" >&2; OFFCPUTIME=""; }
HAVE_JAVA=1
for t in java javac jcmd; do command -v $t >/dev/null || HAVE_JAVA=0; done
[ $HAVE_JAVA = 1 ] && javac -d "$OUT" collector/testdata/jvm/Contend.java

# share FORMAT FILE REGEX: percent of off-CPU time in stacks matching REGEX.
share() {
	python3 - "$@" <<'PY'
import re, sys
fmt, path, pat = sys.argv[1], sys.argv[2], re.compile(sys.argv[3])
whole = total = 0
if fmt == "folded":
    for line in open(path):
        stack, _, v = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")[1:]
        user = frames[:frames.index("-")] if "-" in frames else frames
        if not user or user[0].startswith("[user stack"):
            continue
        total += int(v)
        whole += int(v) if any(pat.search(f) for f in user) else 0
else:  # libbpf-tools: frames, "-  comm (pid)", value; blank line between
    frames = []
    lines = open(path).read().split("\n")
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("-") and i + 1 < len(lines):
            v = int(lines[i + 1].strip() or 0)
            total += v
            whole += v if any(pat.search(f) for f in frames) else 0
            frames = []
        elif s and not s.isdigit():
            frames.append(s)
        elif not s:
            frames = []
print(f"{100*whole/total:.1f}%" if total else "n/a")
PY
}

# measure NAME REGEX CMD...: starts the workload, records it three ways.
measure() {
	local name=$1 pat=$2; shift 2
	"$@" > /dev/null &
	local pid=$!
	sleep 2
	"$OUT/offcpu" record -q -p "$pid" -d "${SECS}s" --no-wakeups --cpu-hz 0 -o "$OUT/$name.pb.gz" --folded "$OUT/$name.folded" 2> "$OUT/$name.log" &
	local rec=$!
	if [ "$name" = jvm ]; then sleep "$((SECS - 1))"; jcmd "$pid" Compiler.perfmap > /dev/null; fi
	wait $rec
	"$OUT/offcpu" record -q -p "$pid" -d "${SECS}s" --no-wakeups --cpu-hz 0 --frame-pointers-only -o "$OUT/$name-fp.pb.gz" --folded "$OUT/$name-fp.folded" 2>> "$OUT/$name.log"
	local tool="n/a"
	if [ -n "$OFFCPUTIME" ]; then
		"$OFFCPUTIME" -p "$pid" "$SECS" > "$OUT/$name.offcputime" 2>/dev/null || true
		tool=$(share bcc "$OUT/$name.offcputime" "$pat")
	fi
	kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
	printf '%-6s %14s %22s %22s\n' "$name" "$(share folded "$OUT/$name.folded" "$pat")" "$(share folded "$OUT/$name-fp.folded" "$pat")" "$tool"
}

printf '%-6s %14s %22s %22s\n' workload offcpu "--frame-pointers-only" "offcputime"
measure c '^(run_(cond|sleep|read|epoll)|main)$' "$OUT/blocker" 100000
if [ $HAVE_JAVA = 1 ]; then
	measure jvm 'thread_native_entry|JavaMain' java -XX:+PreserveFramePointer -cp "$OUT" Contend 100000
else
	echo "jvm: no JDK (java, javac, jcmd) here"
fi
