#!/usr/bin/env bash
# Soak test of the continuous agent (not part of CI): offcpu records the
# whole machine, a profile every INTERVAL, to a local Collector and to an
# output directory, for DURATION, under process churn (CHURN processes a
# second, each sleeping 1 ms) and the bundled dispatch core run in a loop.
# Every second it samples the agent's RSS (a cut takes seconds: sampling
# once an interval would see one phase of it), every 10 s the memory of
# its BPF maps; at the end it prints the RSS median and maximum after the
# first two minutes, the slopes, the agent's CPU share, and whether every
# interval was exported or counted as dropped.
# The agent's Go heap profiles are saved at two minutes and at the end, and
# a 30-second CPU profile from two minutes on.
#
#   sudo DURATION=30m bash bench/soak.sh
#   sudo IDLE=1 DURATION=5m bash bench/soak.sh   # the agent alone
#   sudo AGENT_FLAGS="--memory-limit 0" bash bench/soak.sh   # more record flags
#   sudo LABELLED=1 CORE=0 bash bench/soak.sh   # a labelled Go server in the
#       # core's place: a new label set per request, its threads' waits linked
#       # (collector/testdata/golabels; with the core too, 2 CPUs are overrun)
set -euo pipefail
trap 'echo "soak: failed at line $LINENO" >&2' ERR
DURATION=${DURATION:-30m}
INTERVAL=${INTERVAL:-10s}
CHURN=${CHURN:-200}
IDLE=${IDLE:-0} # 1: no load, for the agent's cost on an idle machine
LABELLED=${LABELLED:-0}
CORE=${CORE:-1} # 0: no bundled core (the labelled server in its place)
AGENT_FLAGS=${AGENT_FLAGS:-}
AGENT_ENV=${AGENT_ENV:-} # e.g. GOGC=25, for the agent alone
OUT=${OUT:-$(mktemp -d /tmp/offcpu-soak.XXXXXX)}
cd "$(dirname "$0")/.."

secs() { python3 -c "import sys,re; m=re.fullmatch(r'(\d+)(s|m|h)', sys.argv[1]); print(int(m[1])*{'s':1,'m':60,'h':3600}[m[2]])" "$1"; }
total=$(secs "$DURATION")

echo "soak: building into $OUT" >&2
go build -o "$OUT/offcpu" ./cmd/offcpu
(cd tools/otelcol && go build -o "$OUT/otelcol" .)
gcc -O2 -o "$OUT/churn" collector/testdata/churn/churn.c
gcc -O2 -o "$OUT/nap" collector/testdata/churn/nap.c
if [[ $LABELLED == 1 ]]; then
	mkdir -p "$OUT/golabels"
	cp collector/testdata/golabels/main.go "$OUT/golabels/"
	printf 'module golabels\n\ngo 1.19\n' > "$OUT/golabels/go.mod"
	(cd "$OUT/golabels" && GOFLAGS= go build -o "$OUT/golabels-server" .)
fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc=127.0.0.1:$(port)
http=127.0.0.1:$(port)
debug=127.0.0.1:$(port)
cat > "$OUT/collector.yaml" <<EOF
receivers:
  otlp:
    protocols:
      grpc: {endpoint: $grpc}
      http: {endpoint: $http}
exporters:
  capture: {directory: $OUT/received}
service:
  telemetry: {metrics: {level: none}}
  pipelines:
    profiles: {receivers: [otlp], exporters: [capture]}
EOF
"$OUT/otelcol" --config "$OUT/collector.yaml" --feature-gates=service.profilesSupport 2>"$OUT/collector.log" &
colpid=$!
sleep 3

env $AGENT_ENV "$OUT/offcpu" record --continuous --interval "$INTERVAL" --output-dir "$OUT/profiles" --keep 1000 \
	--otlp-endpoint "$grpc" --otlp-insecure --debug-addr "$debug" $AGENT_FLAGS 2>"$OUT/agent.log" &
agent=$!
sleep 5

churnpid= corepid=
if [[ $IDLE != 1 ]]; then
	( while :; do "$OUT/churn" "$CHURN" 60 "$OUT/nap" 1000 >/dev/null; done ) &
	churnpid=$!
	if [[ $CORE == 1 ]]; then
		( while :; do "$OUT/offcpu" dispatch --duration 20s -q >/dev/null 2>&1 || true; done ) &
		corepid=$!
	fi
fi
labpid=
if [[ $LABELLED == 1 ]]; then
	# Requests whose threads block in system calls under pprof.Do: a new
	# label set each, linked on the machine-wide agent's thread waits.
	( while :; do "$OUT/golabels-server" "$OUT/golabels.json" 60s threads || true; done ) &
	labpid=$!
fi

# BPF map memory in $mapmem: the memlock of every map the agent holds,
# with builtins only (as rss_now below).
map_mem() {
	local f l memlock ismap
	mapmem=0
	for f in /proc/$agent/fdinfo/*; do
		memlock=0 ismap=0
		while read -r l; do
			case $l in
			map_type:*) ismap=1 ;;
			memlock:*) memlock=${l#memlock:} ;;
			esac
		done < "$f" 2>/dev/null || true
		if (( ismap )); then
			mapmem=$(( mapmem + memlock ))
		fi
	done
	return 0 # set -e: a function's status is its last command's
}
# The profiles are fetched with curl: once now, so that its first run
# (its libraries' unwind tables read by the agent) is not in the figures.
curl -sf -o /dev/null "http://$debug/debug/pprof/heap" || true
cpu0=$(awk '{print $14+$15}' /proc/$agent/stat)
# The agent's RSS in $rss, with builtins only; $tick is a pipe nobody
# writes, for a one-second wait that starts no process.
rss_now() {
	local l
	while read -r l; do
		if [[ $l == VmRSS:* ]]; then
			l=${l#VmRSS:}
			rss=${l% kB}
			rss=${rss// /}
			rss=${rss//$'\t'/}
			return
		fi
	done < "/proc/$agent/status"
}
exec {tick}<> <(:)
echo "t_s rss_kb bpf_map_bytes" > "$OUT/memory.tsv"
echo "t_s rss_kb" > "$OUT/rss.tsv"
start=$EPOCHSECONDS
while (( EPOCHSECONDS - start < total )); do
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		# No process started per sample: each one would be work for the
		# agent, which records the machine.
		read -r -t 1 -u "$tick" || true
		rss_now
		echo "$(( EPOCHSECONDS - start )) $rss" >> "$OUT/rss.tsv"
	done
	t=$(( EPOCHSECONDS - start ))
	rss_now
	map_mem
	echo "$t $rss $mapmem" >> "$OUT/memory.tsv"
	# The agent's Go heap after two minutes and at the end: compare them
	# with go tool pprof -base heap-120s.pb.gz heap-end.pb.gz.
	if (( t >= 120 )) && [[ ! -e $OUT/heap-120s.pb.gz ]]; then
		cpu120=$(awk '{print $14+$15}' /proc/$agent/stat) t120=$t
		curl -sf -o "$OUT/heap-120s.pb.gz" "http://$debug/debug/pprof/heap" || true
		curl -sf -o "$OUT/cpu-120s.pb.gz" "http://$debug/debug/pprof/profile?seconds=30" &
	fi
done
curl -sf -o "$OUT/heap-end.pb.gz" "http://$debug/debug/pprof/heap" || true
cpu1=$(awk '{print $14+$15}' /proc/$agent/stat)
[[ -n $churnpid ]] && kill "$churnpid" $corepid 2>/dev/null || true
[[ -n $labpid ]] && kill "$labpid" 2>/dev/null || true
pkill -f "$OUT/golabels-server" 2>/dev/null || true
pkill -f "$OUT/churn" 2>/dev/null || true
pkill -f "$OUT/offcpu dispatch" 2>/dev/null || true
kill -TERM "$agent"
wait "$agent" || true
kill -TERM "$colpid"
wait "$colpid" || true

intervals=$(grep -c '^offcpu: interval ' "$OUT/agent.log" || true)
received=$(ls "$OUT/received" | wc -l)
python3 - "$OUT/memory.tsv" "$OUT/rss.tsv" <<EOF
import sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]).read().split('\n')[1:] if l.strip()]
late = [r for r in rows if r[0] >= 120] or rows
def slope(i):
    n = len(late); mx = sum(r[0] for r in late)/n; my = sum(r[i] for r in late)/n
    den = sum((r[0]-mx)**2 for r in late) or 1
    return sum((r[0]-mx)*(r[i]-my) for r in late)/den
print(f"soak: {rows[-1][0]:.0f} s; RSS {late[0][1]/1024:.1f} MB after 2 min, {rows[-1][1]/1024:.1f} MB at the end, peak {max(r[1] for r in rows)/1024:.1f} MB; slope {slope(1)*3600/1024:+.2f} MB/h")
per_s = sorted(float(l.split()[1]) for l in open(sys.argv[2]).read().split('\n')[1:] if l.strip() and float(l.split()[0]) >= 120)
if per_s:
    print(f"soak: RSS sampled every second after 2 min: median {per_s[len(per_s)//2]/1024:.1f} MB, max {per_s[-1]/1024:.1f} MB ({len(per_s)} samples)")
print(f"soak: BPF map memory {late[0][2]/2**20:.1f} MB after 2 min, {rows[-1][2]/2**20:.1f} MB at the end; slope {slope(2)*3600/2**20:+.3f} MB/h")
EOF
[[ -n ${cpu120:-} ]] && echo "soak: agent CPU after two minutes: $(python3 -c "print(f'{($cpu1-$cpu120)/(($total-$t120)*100)*100:.2f}')")% of a CPU"
echo "soak: agent CPU $(( cpu1 - cpu0 )) ticks in ${total} s ($(python3 -c "print(f'{($cpu1-$cpu0)/($total*100)*100:.2f}')")% of a CPU$([[ $IDLE == 1 ]] && echo ", idle machine" || echo ", churn$([[ $CORE == 1 ]] && echo " and the core")$([[ $LABELLED == 1 ]] && echo " and the labelled server") running"))"
echo "soak: $intervals intervals cut, $received messages at the collector"
grep -E '^offcpu: (OTLP|[0-9]+ intervals over|.*evicted)' "$OUT/agent.log" || true
if [[ $LABELLED == 1 ]]; then
	# The last full interval's labelled waits, per route.
	last=$(ls -t "$OUT"/profiles/*.pb.gz | grep -v -e wakeups -e goroutines | sed -n 2p)
	echo "soak: labelled waits in $(basename "$last"):"
	"$OUT/offcpu" analyze --by http.route "$last" | head -20 || true
fi
echo "soak: files in $OUT" >&2
