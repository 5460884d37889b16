#!/bin/bash
# rec.sh NAME PIDS... : record for 3 s while LOAD runs
name=$1; shift
args=""; for p in "$@"; do args="$args -p $p"; done
/tmp/offcpu record $args -d 3s --cpu-hz 0 --no-wakeups -o /tmp/fx/$name.pb.gz > /tmp/fx/$name.log 2>&1 &
R=$!; sleep 1.2; eval "$LOAD" > /tmp/fx/$name.load 2>&1; wait $R; tail -1 /tmp/fx/$name.log
