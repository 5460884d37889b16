#!/bin/bash
# recjvm.sh NAME LOAD JAVA-ARGS... : start a JVM with frame pointers, warm up, record 3 s, write the perf map
name=$1; load=$2; shift 2
java -XX:+PreserveFramePointer "$@" > /tmp/jvm/$name.out 2>&1 &
J=$!
sleep 2
[ -n "$load" ] && (eval "$load" &) && sleep 1
/tmp/offcpu record -p $J -d 3s --cpu-hz 0 --no-wakeups -o /tmp/jvm/$name.pb.gz > /tmp/jvm/$name.log 2>&1 &
R=$!
sleep 2.5
jcmd $J Compiler.perfmap > /dev/null
wait $R
kill $J; wait $J 2>/dev/null
rm -f /tmp/perf-$J.map
tail -1 /tmp/jvm/$name.log
