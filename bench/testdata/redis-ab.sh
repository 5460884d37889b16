#!/bin/sh
# One run of a key-value server A/B: redis-server with appendfsync $1
# (always: an fdatasync per write; everysec: a background flush once a
# second) under redis-benchmark's SETs on loopback. Writes the requests
# per second to $OFFCPU_METRICS and the server's pid to $2, when given.
# With $SCHEDSTAT_OUT, the server threads' own accounting just before it
# stops: a line per thread, "tid seconds-alive cpu-ns runqueue-ns", from
# /proc/uptime, the thread's start time and /proc/PID/task/TID/schedstat;
# then "after SECONDS", how long the server lived after that.
set -e
fsync=$1 pidfile=$2 requests=${REQUESTS:-20000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# A port below the ephemeral range (a loopback client's port can hold one
# above it), another if the server cannot bind it.
for try in 1 2 3 4 5; do
	port=$((10000 + ($$ + try * 7919) % 20000))
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --appendonly yes --appendfsync "$fsync" \
		--save '' --daemonize no --logfile "$dir/log" &
	server=$!
	i=0
	until redis-cli -p "$port" ping >/dev/null 2>&1; do
		kill -0 "$server" 2>/dev/null || break
		i=$((i + 1)); [ $i -lt 100 ] || { echo "redis-server did not start" >&2; exit 1; }
		sleep 0.05
	done
	kill -0 "$server" 2>/dev/null && break
	echo "redis-server on port $port: $(tail -n 1 "$dir/log")" >&2
done
kill -0 "$server" 2>/dev/null || { echo "redis-server did not start" >&2; exit 1; }
[ -n "$pidfile" ] && echo "$server" > "$pidfile"
rps=$(redis-benchmark -p "$port" -t set -n "$requests" -c 4 -r 100000 -q --csv | awk -F'"' '/^"SET"/ {print $4}')
[ -n "$rps" ] || { echo "redis-benchmark reported no rate" >&2; exit 1; }
if [ -n "$SCHEDSTAT_OUT" ]; then
	hz=$(getconf CLK_TCK)
	read -r up _ < /proc/uptime
	for t in /proc/"$server"/task/*; do
		# Field 22 of stat, after the command in parentheses.
		start=$(sed 's/.*) //' "$t/stat" | cut -d' ' -f20)
		read -r cpu runq _ < "$t/schedstat"
		echo "${t##*/} $(echo "$up $start $hz" | awk '{printf "%.3f", $1 - $2 / $3}') $cpu $runq"
	done > "$SCHEDSTAT_OUT"
fi
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$server" || true
if [ -n "$SCHEDSTAT_OUT" ]; then
	read -r up2 _ < /proc/uptime
	echo "after $(echo "$up2 $up" | awk '{printf "%.3f", $1 - $2}')" >> "$SCHEDSTAT_OUT"
fi
echo "{\"requests_per_s\": $rps}" > "${OFFCPU_METRICS:-/dev/stdout}"
