#!/bin/sh
# What the kernel matrix runs on each kernel (busybox sh in the guests):
# the kernel report and the recorder's kernel-side tests. DIR holds offcpu,
# collector.test, offcpu.test and prebuilt/, for the guest's architecture;
# SRC (host only) is the
# repository, whose package directories the tests build from.
# KMATRIX_TESTS=elsewhere (host only): the tests ran in the main pass
# (go test ./...), which kept the programs they built: report alone.
D=$1
SRC=${2:-}
COLLECTOR_TESTS='^(TestCheckKernel|TestRecordWorkload|TestWakeups|TestTracepointWakeupsOfCommand|TestSchedstatWorkload|TestUnwindWithoutFramePointers|TestRecordTracepointFallback|TestBlockedBeforeStart|TestThreadContext|TestGoThreadLabels|TestTraceContextMap|TestGoLabels|TestGoroutineWaitsMatchTrace|TestGoroutineWaitsInsideWindow|TestGoroutineWaitChain|TestGoroutineRequeuesMatchTrace|TestGoroutineSuspensionsMatchTrace)$'
CMD_TESTS='^(TestContinuousOTLP|TestCriticalPathHandoff|TestCriticalPathGoHandoff)$'
# arm64 guests: the tests whose programs are cross-built (crossbuild) and
# that hold there. Not yet: thread context, Go labels and goroutines
# (their readers are x86-64's).
# KMATRIX_FULL=1 (matrix.sh's): continuous mode's OTLP export there too,
# off in CI for time (its collector's cross build alone takes 40 s).
if [ "$(uname -m)" = aarch64 ]; then
	COLLECTOR_TESTS='^(TestCheckKernel|TestRecordWorkload|TestWakeups|TestTracepointWakeupsOfCommand|TestSchedstatWorkload|TestRecordTracepointFallback|TestUnwindWithoutFramePointers|TestUnwindWakerStacks|TestFramePointersOnlyTruncates|TestBlockedBeforeStart)$'
	CMD_TESTS='^$'
	[ "${KMATRIX_FULL:-}" = 1 ] && CMD_TESTS='^(TestContinuousOTLP)$'
fi
export OFFCPU_REQUIRE_BPF=1
if [ -n "$SRC" ]; then
	export OFFCPU_PREBUILD_OUT="$D/prebuilt"
else
	# Emulated: records that need several cuts run longer.
	export OFFCPU_PREBUILT="$D/prebuilt" PATH="$D:$PATH" OFFCPU_TEST_SCALE=4
fi
echo KMATRIX-JSON-BEGIN
"$D/offcpu" kernel --json
echo KMATRIX-JSON-END
# Start-up, and the verifier's share of it, with the defaults.
"$D/offcpu" record -d 1s -o /tmp/kmatrix-start.pb.gz -- sleep 0.3 2>&1 | grep '^started in'
if [ "${KMATRIX_TESTS:-}" = elsewhere ]; then
	echo "KMATRIX-TESTS-ELSEWHERE go test ./..."
	exit 0
fi
rc=0
(cd "${SRC:-.}/${SRC:+collector}" && "$D/collector.test" -test.run "$COLLECTOR_TESTS" -test.v -test.count=1 -test.timeout 30m) || rc=1
(cd "${SRC:-.}/${SRC:+cmd/offcpu}" && "$D/offcpu.test" -test.run "$CMD_TESTS" -test.v -test.count=1 -test.timeout 10m) || rc=1
exit $rc
