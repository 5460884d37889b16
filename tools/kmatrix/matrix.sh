#!/usr/bin/env bash
# The kernel matrix: the recorder's kernel-side tests (suite.sh) on this
# machine's kernel and on each of Debian's kernels that kmatrix.sh fetches
# (the newest 6.1 and 6.12 cloud images, amd64 and arm64), booted under
# qemu; then one
# table, check by kernel, with each program's verifier figures. Exit
# status 1 if a test failed on any kernel. Usage: matrix.sh [OUT.md];
# KMATRIX_FULL=1 runs the arm64 guests' slow tests too (suite.sh);
# KMATRIX_DOCS=docs/kernels.md writes the table there.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
K=tools/kmatrix/kmatrix.sh
out=${1:-kmatrix.md}
W=$(mktemp -d /tmp/offcpu-matrix.XXXXXX)
trap 'rm -rf "$W"' EXIT

bash "$K" fetch >/dev/null
mkdir -p "$W/bin"
# Static, so that it runs in a guest as it is; the test binaries find
# their libraries through kmatrix.sh.
CGO_ENABLED=0 go build -o "$W/bin/offcpu" ./cmd/offcpu
go test -c -o "$W/bin/collector.test" ./collector
go test -c -o "$W/bin/offcpu.test" ./cmd/offcpu
cp tools/kmatrix/suite.sh "$W/bin/"
# Debian's sleep (glibc, dynamic) rather than busybox's in the guests: the
# tests read its glibc frames.
cp "$(command -v sleep)" "$W/bin/sleep"
# The arm64 guests' own: static binaries, the tests' programs cross-built
# (Debian's gcc-aarch64-linux-gnu for the C ones), and glibc's sleep
# (busybox's is stripped).
mkdir -p "$W/arm64"
aarch64-linux-gnu-gcc -static -O2 -o "$W/arm64/sleep" tools/kmatrix/sleep.c
CGO_ENABLED=0 GOARCH=arm64 go build -o "$W/arm64/offcpu" ./cmd/offcpu
CGO_ENABLED=0 GOARCH=arm64 go test -c -o "$W/arm64/collector.test" ./collector
CGO_ENABLED=0 GOARCH=arm64 go test -c -o "$W/arm64/offcpu.test" ./cmd/offcpu
go run ./tools/kmatrix/crossbuild -arch arm64 ${KMATRIX_FULL:+-full} -o "$W/arm64/prebuilt"
cp tools/kmatrix/suite.sh "$W/arm64/"
# KMATRIX_PREBUILT=DIR: the programs the main pass built (it ran with
# OFFCPU_PREBUILD_OUT=DIR) and so the host's kernel-side tests too; the
# host is not made to run them again.
host_tests=
if [ -n "${KMATRIX_PREBUILT:-}" ]; then
	cp -r "$KMATRIX_PREBUILT" "$W/bin/prebuilt"
	host_tests=elsewhere
fi

status=0
echo "kmatrix: $(uname -r) (this machine)" >&2
# The host's run builds the test programs, kept in prebuilt/ for the guests.
{ echo "KMATRIX-BEGIN $(uname -r) (host)"; KMATRIX_TESTS=$host_tests sh "$W/bin/suite.sh" "$W/bin" "$src"; echo "KMATRIX-EXIT $?"; } >"$W/host.out" 2>&1 || true
grep -q '^KMATRIX-EXIT 0$' "$W/host.out" || status=1
runs=("$W/host.out")
# The guests side by side, each architecture's pair in turn: each qemu
# (TCG, one vCPU) is one thread, their tests read the guest's own clocks,
# and four on two CPUs slowed the amd64 guests' clocks past their tests'
# tolerances (a 6.12 guest's Go label test, +19.5% on one route).
for arch in amd64 arm64; do
	pids=()
	for rel in $(bash "$K" list | grep -- "-$arch\$"); do
		echo "kmatrix: $rel (qemu)" >&2
		bin=$W/bin
		[[ $arch == arm64 ]] && bin=$W/arm64
		KMATRIX_CMD="KMATRIX_FULL=${KMATRIX_FULL:-} sh ./${bin##*/}/suite.sh /work/${bin##*/}" KMATRIX_TIMEOUT=${KMATRIX_TIMEOUT:-1200} KMATRIX_MEM=3G \
			bash "$K" run "$rel" "$W/$rel.out" -- "$bin" &
		pids+=($!)
		runs+=("$W/$rel.out")
	done
	for pid in "${pids[@]}"; do
		wait "$pid" || status=1
	done
done
go run ./tools/kmatrix/table "${runs[@]}" | tee "$out"
# KMATRIX_DOCS=FILE: the table replaces what lies between FILE's
# "<!-- kmatrix:begin -->" and "<!-- kmatrix:end -->" lines (docs/kernels.md).
if [[ -n ${KMATRIX_DOCS:-} ]]; then
	awk -v table="$out" -v rev="$(git rev-parse --short HEAD)" -v day="$(date +%F)" '
		/<!-- kmatrix:end -->/ { skip = 0 }
		!skip { print }
		/<!-- kmatrix:begin -->/ {
			skip = 1
			print "The matrix on " day " (run of " rev " by tools/kmatrix/matrix.sh; `artifacts/kmatrix.md` in CI). Test times are the guests\x27 own: qemu emulates without KVM, 3–5 times slower (arm64 more). Programs\x27 figures are for the default options (the wait stream off, its code pruned).\n"
			while ((getline line < table) > 0) if (line ~ /^\|/) print line
		}' "$KMATRIX_DOCS" >"$KMATRIX_DOCS.tmp"
	mv "$KMATRIX_DOCS.tmp" "$KMATRIX_DOCS"
fi
if ((status)); then
	for r in "${runs[@]}"; do
		grep -q '^KMATRIX-EXIT 0$' "$r" && continue
		echo "kmatrix: failures in $(basename "$r"):" >&2
		# Each failed test's last 30 log lines (its errors are among its
		# last checks), else the run's tail.
		awk '{ sub(/\r$/, "") }
			/^=== (RUN|CONT)/ { name = $3 }
			/^[ \t]+[^ \t]+_test\.go:[0-9]+:/ { log_[name, n[name]++] = $0 }
			/--- FAIL: / { failed = 1; print; for (i = (n[$3] > 30 ? n[$3] - 30 : 0); i < n[$3]; i++) print log_[$3, i] }
			END { exit !failed }' "$r" >&2 || tail -40 "$r" >&2
	done
fi
exit $status
