#!/bin/bash
# recjvm.sh NAME LOAD JAVA-ARGS... : start a JVM with no profiling flag, warm up, record 3 s
# (offcpu names its Java frames from the JVM's own structures)
name=$1; load=$2; shift 2
java "$@" > /tmp/jvm/$name.out 2>&1 &
J=$!
sleep 2
[ -n "$load" ] && (eval "$load" &) && sleep 1
/tmp/offcpu record -p $J -d 3s --cpu-hz 0 --no-wakeups -o /tmp/jvm/$name.pb.gz > /tmp/jvm/$name.log 2>&1
kill $J; wait $J 2>/dev/null
tail -1 /tmp/jvm/$name.log
