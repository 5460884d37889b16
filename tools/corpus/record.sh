#!/usr/bin/env bash
# Re-records the verdict corpus (analysis/testdata/corpus): real programs
# from Debian's packages and the runtimes offcpu reads, each under a load
# made on loopback, recorded with wake-ups by `offcpu record -p`. Needs
# root and what .ci/deps installs. Usage: record.sh [NAME...] (all by
# default). MariaDB is driven by sysbench (Debian's package). Then
# `go test ./analysis -run TestCorpus -v` judges them.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=$root/analysis/testdata/corpus
src=$root/tools/corpus
work=$(mktemp -d /tmp/offcpu-corpus.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; rm -rf "$work"; }
trap cleanup EXIT
go build -o "$work/offcpu" ./cmd/offcpu
go build -o "$work/load" ./tools/corpus/load
go build -o "$work/goloop" ./tools/corpus/goloop
mkdir -p "$out"
DUR=${DUR:-4s}

# rec NAME "PIDS" LOADCMD [record flags]: record the processes while the load runs.
rec() {
	local name=$1 procs=$2 load=$3; shift 3
	local args=()
	for p in $procs; do args+=(-p "$p"); done
	echo "corpus: $name (pids $procs)"
	"$work/offcpu" record "${args[@]}" -d "$DUR" --cpu-hz 0 "$@" -o "$work/$name.pb.gz" > "$work/$name.log" 2>&1 &
	local r=$!
	sleep 1.5
	timeout 60 bash -c "$load" > "$work/$name.load" 2>&1 || { echo "corpus: $name: load failed:"; cat "$work/$name.load"; }
	wait $r || { cat "$work/$name.log"; return 1; }
	tail -n 1 "$work/$name.load"
	cp "$work/$name.pb.gz" "$out/$name.pb.gz"
	[ ! -f "$work/$name.goroutines.pb.gz" ] || cp "$work/$name.goroutines.pb.gz" "$out/$name.goroutines.pb.gz"
}
bg() { "$@" & pids+=($!); }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "corpus: nothing listens on $1" >&2; return 1; }
loadfor() { local s=${DUR%s}; echo "$((s + 1))s"; }
want() { [ $# -eq 0 ] || [[ " $WANT " == *" $1 "* ]]; }
WANT="$*"

if want nginx; then
	P=$(port); mkdir -p "$work/nginx/html"; head -c 270000 /dev/urandom > "$work/nginx/html/f"
	cat > "$work/nginx/nginx.conf" <<CONF
worker_processes 2; daemon off; pid $work/nginx/pid; error_log $work/nginx/err;
events { worker_connections 256; }
http { access_log off; aio threads; sendfile off;
  server { listen 127.0.0.1:$P; root $work/nginx/html; } }
CONF
	bg /usr/sbin/nginx -c "$work/nginx/nginx.conf" -p "$work/nginx"; waitport "$P"
	sleep 0.5; m=$(cat "$work/nginx/pid")
	rec nginx "$m $(pgrep -d ' ' -P "$m")" "$work/load -mode http -addr http://127.0.0.1:$P/f -c 8 -d $(loadfor)"
	kill "${pids[-1]}"
fi

if want redis; then
	P=$(port)
	bg /usr/bin/redis-server --port "$P" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync everysec --dir "$work" --io-threads 1
	waitport "$P"
	rec redis "${pids[-1]}" "timeout $(loadfor) redis-benchmark -p $P -c 8 -n 10000000 -t set,get -r 1000 --csv || true"
	kill "${pids[-1]}"
fi

if want memcached; then
	P=$(port)
	bg /usr/bin/memcached -u nobody -l 127.0.0.1 -p "$P" -t 4; waitport "$P"
	rec memcached "${pids[-1]}" "$work/load -mode memcached -addr 127.0.0.1:$P -c 8 -d $(loadfor)"
	kill "${pids[-1]}"
fi

if want postgres; then
	P=$(port); pg=$work/pg; mkdir -p "$pg"; chown postgres "$pg"
	su postgres -c "initdb -D $pg/data -A trust" > /dev/null
	bg su postgres -c "exec postgres -D $pg/data -p $P -k $pg -c listen_addresses=127.0.0.1"
	waitport "$P"
	su postgres -c "pgbench -h 127.0.0.1 -p $P -i -s 2 postgres" > /dev/null 2>&1
	rec postgres "$(pgrep -d ' ' -u postgres -f "postgres|pgbench" | tr ' ' '\n' | while read p; do [ "$(cat /proc/$p/comm)" = postgres ] && echo $p; done | tr '\n' ' ')" \
		"su postgres -c 'pgbench -h 127.0.0.1 -p $P -c 4 -j 2 -T ${DUR%s} postgres'"
	su postgres -c "pg_ctl -D $pg/data stop -m fast" > /dev/null || true
fi

if want prometheus; then
	P=$(port); mkdir -p "$work/prom"
	cat > "$work/prom/prometheus.yml" <<CONF
global: { scrape_interval: 1s, evaluation_interval: 1s }
scrape_configs: [ { job_name: self, static_configs: [ { targets: ["127.0.0.1:$P"] } ] } ]
CONF
	bg /usr/bin/prometheus --config.file "$work/prom/prometheus.yml" --storage.tsdb.path "$work/prom/data" --web.listen-address "127.0.0.1:$P" --log.level=error
	waitport "$P"; sleep 2
	q="http://127.0.0.1:$P/api/v1/query?query=rate(prometheus_http_requests_total%5B5s%5D)"
	rec prometheus "${pids[-1]}" "$work/load -mode http -addr '$q,http://127.0.0.1:$P/metrics' -c 4 -d $(loadfor)" --goroutines
	kill "${pids[-1]}"
fi

if want etcd; then
	P=$(port)
	bg /usr/bin/etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$P" --advertise-client-urls "http://127.0.0.1:$P" \
		--listen-peer-urls "http://127.0.0.1:$(port)" --log-level error
	waitport "$P"; sleep 2
	rec etcd "${pids[-1]}" "$work/load -mode http -body '{\"key\":\"a2V5\",\"value\":\"dmFsdWU=\"}' -addr http://127.0.0.1:$P/v3/kv/put -c 4 -d $(loadfor)" --goroutines
	kill "${pids[-1]}"
fi

if want mariadb; then
	# sysbench (Debian's package) drives it: 4 threads updating 10 rows.
	db=$work/mariadb; mkdir -p "$db"
	mariadb-install-db --no-defaults --datadir="$db/data" --user=root --auth-root-authentication-method=normal > /dev/null
	bg /usr/sbin/mariadbd --no-defaults --datadir="$db/data" --socket="$db/sock" --skip-networking --user=root --innodb-buffer-pool-size=64M
	for _ in $(seq 100); do [ -S "$db/sock" ] && break; sleep 0.1; done
	mariadb --no-defaults -S "$db/sock" -uroot -e 'CREATE DATABASE sbtest'
	sb="sysbench oltp_update_index --db-driver=mysql --mysql-socket=$db/sock --mysql-user=root --tables=1 --table-size=10 --threads=4"
	$sb prepare > /dev/null
	rec mariadb "${pids[-1]}" "$sb --time=${DUR%s} run"
	kill "${pids[-1]}"
fi

if want goloop; then
	D=$(port); P=$(port)
	bg "$work/goloop" -downstream -listen "127.0.0.1:$D"; waitport "$D"
	bg "$work/goloop" -listen "127.0.0.1:$P" -down "127.0.0.1:$D"; waitport "$P"
	rec goloop "${pids[-1]}" "$work/load -mode http -addr http://127.0.0.1:$P/ -c 4 -pause 5ms -d $(loadfor)" --goroutines
	kill "${pids[-1]}" "${pids[-2]}"
fi

if want gunicorn; then
	P=$(port)
	bg /usr/bin/gunicorn -w 2 -b "127.0.0.1:$P" --chdir "$src/gunicorn" app:app --log-level warning
	waitport "$P"; sleep 1
	rec gunicorn "$(pgrep -d ' ' -f "gunicorn -w 2 -b 127.0.0.1:$P")" "$work/load -mode http -addr http://127.0.0.1:$P/ -c 4 -d $(loadfor)"
	kill "${pids[-1]}"
fi

if want node; then
	P=$(port); mkfifo "$work/fifo"
	node "$src/node/blockloop.js" "$P" "$work/fifo" > "$work/node.out" & pids+=($!); waitport "$P"
	# The FIFO's writer: another process, opening it and writing after 5 ms.
	bg python3 "$src/node/fifowriter.py" "$work/fifo"
	rec node "${pids[-2]}" "$work/load -mode http -addr 'http://127.0.0.1:$P/readsync,http://127.0.0.1:$P/,http://127.0.0.1:$P/exec,http://127.0.0.1:$P/' -c 4 -d $(loadfor)"
	kill "${pids[-1]}" "${pids[-2]}"
fi

if want netty || want jdknio; then
	java=$(readlink -f "$(command -v javac)" | sed 's,/bin/javac$,,')
	cp=/usr/share/java/netty-common.jar:/usr/share/java/netty-buffer.jar:/usr/share/java/netty-resolver.jar:/usr/share/java/netty-transport.jar
	"$java/bin/javac" -cp "$cp" -d "$work/java" "$src/java/NettyTasks.java" "$src/java/NioEcho.java"
fi
if want netty; then
	P=$(port)
	bg "$java/bin/java" -cp "$cp:$work/java" NettyTasks "$P"; waitport "$P"; sleep 1
	rec netty "${pids[-1]}" "$work/load -mode echo -addr 127.0.0.1:$P -c 8 -d $(loadfor)"
	kill "${pids[-1]}"
fi
if want jdknio; then
	P=$(port)
	bg "$java/bin/java" -cp "$work/java" NioEcho "$P"; waitport "$P"; sleep 1
	rec jdknio "${pids[-1]}" "$work/load -mode echo -addr 127.0.0.1:$P -c 8 -d $(loadfor)"
	kill "${pids[-1]}"
fi

if want puma; then
	# The Puma test's Rack app: handlers that wait on a Mutex, on a
	# downstream socket and on the GVL (CPU-bound handlers).
	R=$root/collector/testdata/ruby; D=$(port); P=$(port)
	bg ruby "$R/downstream.rb" "$D"; waitport "$D"
	DOWNSTREAM_PORT=$D bg puma -t 8:8 -b "tcp://127.0.0.1:$P" "$R/app.ru"; waitport "$P"; sleep 1
	u=http://127.0.0.1:$P
	rec puma "${pids[-1]}" "$work/load -mode http -addr '$u/cpu,$u/lock,$u/cpu,$u/down,$u/lock,$u/cpu' -c 6 -d $(loadfor)"
	kill "${pids[-1]}" "${pids[-2]}"
fi

if want core; then
	go build -o "$work/offcpu-core" ./cmd/offcpu
	bg "$work/offcpu-core" dispatch --duration 30s --rate 20000 -q > /dev/null; sleep 1
	rec core "${pids[-1]}" "sleep $(loadfor)"
	kill "${pids[-1]}"
fi
ls -la "$out"
