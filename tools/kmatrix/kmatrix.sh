#!/usr/bin/env bash
# kmatrix.sh — boot Debian kernel images under qemu (TCG) with a tiny busybox
# initramfs and run a command inside, so BPF code can be tested against
# several kernels on a machine without KVM. Releases ending in -arm64 boot
# under qemu-system-aarch64 (virt), with Debian's arm64 busybox: the files
# given must then be arm64 and static (no loader is copied for them).
set -euo pipefail

CACHE=${KMATRIX_CACHE:-/var/cache/offcpu-kmatrix}
BACKPORTS_SOURCES=/etc/apt/sources.list.d/offcpu-kmatrix-backports.sources
export DEBIAN_FRONTEND=noninteractive

usage() {
	cat >&2 <<'EOF'
usage:
  kmatrix.sh fetch                      install qemu/busybox, cache kernels, list them
  kmatrix.sh list                       list cached kernel releases
  kmatrix.sh run RELEASE OUTFILE -- FILE...
      boot RELEASE with FILEs in the guest's /work and run $KMATRIX_CMD there
      (by /bin/sh). Serial output goes to OUTFILE. Exit status: the command's,
      124 on timeout, 125 if the guest never reported one.
env: KMATRIX_CACHE (default /var/cache/offcpu-kmatrix), KMATRIX_CMD (required
     for run), KMATRIX_TIMEOUT (seconds, default 900), KMATRIX_MEM (default 2G)
EOF
	exit 2
}
log() { echo "kmatrix: $*" >&2; }
die() { log "$*"; exit 2; }

pkg_installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }

ensure_tools() {
	local missing=() p
	for p in qemu-system-x86 qemu-system-arm busybox-static cpio; do
		pkg_installed "$p" || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	log "installing ${missing[*]}"
	apt-get update -qq
	# No recommends: they would pull in a GUI stack and firmware we never use.
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# newest_pkg REGEX: newest package name matching REGEX, by version sort, or "".
newest_pkg() {
	apt-cache search --names-only "$1" | awk '{print $1}' | sort -V | tail -n1
}

# fetch_kernel PKG: cache the vmlinuz of linux-image-<release>-unsigned PKG.
fetch_kernel() {
	local pkg=$1 rel dl
	rel=${pkg#linux-image-}
	rel=${rel%-unsigned}
	[[ -f $CACHE/$rel/vmlinuz ]] && return 0
	log "downloading $pkg"
	dl=$(mktemp -d "$CACHE/.dl.XXXXXX")
	# Sandbox user root: _apt cannot write into our 0700 temp dir.
	(cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root "$pkg")
	dpkg-deb -x "$dl"/*.deb "$dl/x"
	[[ -f $dl/x/boot/vmlinuz-$rel ]] || die "$pkg has no boot/vmlinuz-$rel"
	mkdir -p "$CACHE/$rel"
	# Install atomically so an interrupted fetch never looks cached.
	cp "$dl/x/boot/vmlinuz-$rel" "$CACHE/$rel/vmlinuz.tmp"
	mv "$CACHE/$rel/vmlinuz.tmp" "$CACHE/$rel/vmlinuz"
	rm -rf "$dl"
}

# ensure_arm64: apt knows arm64 packages; Debian's arm64 busybox is
# cached (unpacked: installing it would replace the host's own).
ensure_arm64() {
	if ! dpkg --print-foreign-architectures | grep -qx arm64; then
		log "adding the arm64 architecture to apt"
		dpkg --add-architecture arm64
		apt-get update -qq
	fi
	[[ -x $CACHE/arm64/busybox ]] && return 0
	local dl
	dl=$(mktemp -d "$CACHE/.dl.XXXXXX")
	(cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root busybox-static:arm64)
	dpkg-deb -x "$dl"/*.deb "$dl/x"
	mkdir -p "$CACHE/arm64"
	cp "$dl/x/bin/busybox" "$CACHE/arm64/busybox.tmp"
	mv "$CACHE/arm64/busybox.tmp" "$CACHE/arm64/busybox"
	rm -rf "$dl"
}

cmd_fetch() {
	ensure_tools
	mkdir -p "$CACHE"
	ensure_arm64
	local re61='^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$'
	local re612='^linux-image-6\.12\.[0-9]+\+[a-z0-9]+-cloud-amd64-unsigned$'
	local p61 p612
	p61=$(newest_pkg "$re61")
	[[ -n $p61 ]] || die "no 6.1 cloud kernel found in apt indexes"
	p612=$(newest_pkg "$re612")
	if [[ -z $p612 ]]; then
		log "no 6.12 cloud kernel known to apt; adding bookworm-backports"
		cat >"$BACKPORTS_SOURCES" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
		apt-get update -qq
		p612=$(newest_pkg "$re612")
		[[ -n $p612 ]] || die "no 6.12 cloud kernel found even with backports"
	fi
	fetch_kernel "$p61"
	fetch_kernel "$p612"
	# The same series for arm64 (Graviton, Ampere): the newest of each.
	local a61 a612
	a61=$(newest_pkg "${re61//amd64/arm64}")
	a612=$(newest_pkg "${re612//amd64/arm64}")
	[[ -n $a61 && -n $a612 ]] || die "no arm64 6.1 or 6.12 cloud kernel found in apt indexes"
	fetch_kernel "$a61"
	fetch_kernel "$a612"
	cmd_list
}

cmd_list() {
	[[ -d $CACHE ]] || return 0
	find "$CACHE" -mindepth 2 -maxdepth 2 -name vmlinuz -printf '%h\n' |
		xargs -r -n1 basename | sort -V
}

# copy_debug ROOT LIB: the host's detached debug file of LIB (by build id,
# as libc6-dbg installs glibc's), so the guest names what the host names.
copy_debug() {
	local root=$1 bid dbg
	bid=$(readelf -n "$2" 2>/dev/null | awk '/Build ID/ { print $3 }')
	[[ -n $bid ]] || return 0
	dbg=/usr/lib/debug/.build-id/${bid:0:2}/${bid:2}.debug
	[[ -f $dbg && ! -e $root$dbg ]] || return 0
	mkdir -p "$root${dbg%/*}"
	cp -L "$dbg" "$root$dbg"
}

# copy_libs ROOT: copy loader + shared libs of every dynamic ELF under
# ROOT/work to the same absolute paths in ROOT, so the guest can run them.
copy_libs() {
	local root=$1 f p
	while IFS= read -r -d '' f; do
		[[ $(head -c4 "$f" | tr -d '\0') == $'\x7fELF' ]] || continue
		# ldd prints "name => /path (addr)" and "/lib64/ld-... (addr)";
		# static binaries yield no paths (and a non-zero exit we ignore).
		while read -r p; do
			[[ -e $root$p ]] && continue
			mkdir -p "$root${p%/*}"
			cp -L "$p" "$root$p"
			copy_debug "$root" "$p"
		done < <(ldd "$f" 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }')
		if ldd "$f" 2>/dev/null | grep -q 'not found'; then
			log "warning: $f: unresolved libraries: $(ldd "$f" | grep 'not found' | tr -s ' \t\n' ' ')"
		fi
	done < <(find "$root/work" -type f -print0)
}

# sh_quote STR: STR as a single-quoted POSIX shell word.
sh_quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# build_initramfs DIR ARCH FILE...: writes DIR/initrd.gz.
build_initramfs() {
	local dir=$1 arch=$2 root=$1/root f a
	shift 2
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,work,etc,root}
	if [[ $arch == arm64 ]]; then
		cp "$CACHE/arm64/busybox" "$root/bin/busybox"
	else
		cp /bin/busybox "$root/bin/busybox"
	fi
	# The host's busybox lists the applets (the guest's may not run here).
	for a in $(/bin/busybox --list-full); do
		[[ -e $root/$a ]] || ln -s /bin/busybox "$root/$a"
	done
	# The kernel opens /dev/console for init before devtmpfs is mounted.
	mknod -m 600 "$root/dev/console" c 5 1
	# Minimal identity/name files: Go's os/user and "localhost" lookups want them.
	echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
	echo 'root:x:0:' >"$root/etc/group"
	printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
	for f in "$@"; do
		[[ -e $f ]] || die "no such file: $f"
		[[ ! -e $root/work/${f##*/} ]] || die "duplicate basename: ${f##*/}"
		cp -rL "$f" "$root/work/"
	done
	[[ $arch == arm64 ]] || copy_libs "$root"
	cat >"$root/init" <<EOF
#!/bin/sh
# Generated by kmatrix.sh. Mount failures are ignored: not every kernel
# config has every filesystem, and the payload reports what it needs.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ip link set lo up 2>/dev/null
# Leading newline: firmware leaves terminal escapes without one on the console.
echo
echo "KMATRIX-BEGIN \$(uname -r)"
cd /work
# stdin is the serial line; nothing types there, so don't let the payload wait on it.
/bin/sh -c $(sh_quote "$KMATRIX_CMD") </dev/null
st=\$?
# Newline first so the marker starts a line even after unterminated output.
echo
echo "KMATRIX-EXIT \$st"
poweroff -f
echo o >/proc/sysrq-trigger
# Last resort: init exiting panics the kernel; panic=-1 + -no-reboot ends qemu.
sleep 30
EOF
	chmod 755 "$root/init"
	# -1: decompression speed inside the TCG guest matters more than size.
	(cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) |
		gzip -1 >"$dir/initrd.gz"
}

cmd_run() {
	(($# >= 2)) || usage
	local rel=$1 out=$2
	shift 2
	[[ ${1:-} == -- ]] && shift
	[[ -n ${KMATRIX_CMD:-} ]] || die "KMATRIX_CMD is not set"
	local kernel=$CACHE/$rel/vmlinuz timeout=${KMATRIX_TIMEOUT:-900} mem=${KMATRIX_MEM:-2G}
	[[ -f $kernel ]] || die "kernel $rel is not cached; run: $0 fetch (have: $(cmd_list | tr '\n' ' '))"
	ensure_tools

	local arch=amd64 qemu
	[[ $rel == *-arm64 ]] && arch=arm64
	qemu=(qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m "$mem" -append "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off nokaslr")
	if [[ $arch == arm64 ]]; then
		[[ -x $CACHE/arm64/busybox ]] || die "no arm64 busybox cached; run: $0 fetch"
		# pauth-impdef: the emulated pointer authentication's cheap hash.
		qemu=(qemu-system-aarch64 -M virt -accel tcg -cpu max,pauth-impdef=on -smp 1 -m "$mem"
			-append "console=ttyAMA0 panic=-1 quiet loglevel=3 nokaslr")
	fi
	tmp=$(mktemp -d /tmp/kmatrix.XXXXXX)
	trap 'rm -rf "$tmp"' EXIT
	local t0 t1 t2 qrc st
	t0=$(date +%s.%N)
	build_initramfs "$tmp" "$arch" "$@"
	t1=$(date +%s.%N)
	log "initramfs: $(du -h "$tmp/initrd.gz" | cut -f1) compressed, built in $(elapsed "$t0" "$t1")s"

	# Serial output goes through tr (line-buffered so the BEGIN timestamp is
	# taken when the line arrives) and tee into OUTFILE; the loop below only
	# watches for the marker and drains the rest.
	set +e
	timeout -k 10 "$timeout" "${qemu[@]}" \
		-kernel "$kernel" -initrd "$tmp/initrd.gz" -nographic -no-reboot -nic none \
		</dev/null 2>&1 |
		stdbuf -oL tr -d '\r' | tee "$out" | {
		while IFS= read -r line; do
			if [[ $line == KMATRIX-BEGIN* ]]; then
				date +%s.%N >"$tmp/begin"
				break
			fi
		done
		cat >/dev/null
	}
	qrc=${PIPESTATUS[0]}
	set -e
	t2=$(date +%s.%N)
	if [[ -f $tmp/begin ]]; then
		log "$rel: boot to KMATRIX-BEGIN $(elapsed "$t1" "$(cat "$tmp/begin")")s, total $(elapsed "$t1" "$t2")s"
	fi

	st=$(grep -aE '^KMATRIX-EXIT [0-9]+$' "$out" | tail -n1 | cut -d' ' -f2 || true)
	if [[ -n $st ]]; then
		return "$st"
	fi
	if ((qrc == 124 || qrc == 137)); then
		log "$rel: timed out after ${timeout}s; last lines of $out:"
		st=124
	else
		log "$rel: guest gave no KMATRIX-EXIT (qemu status $qrc); last lines of $out:"
		st=125
	fi
	tail -n 30 "$out" >&2
	return "$st"
}

elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

case ${1:-} in
fetch) cmd_fetch ;;
list) cmd_list ;;
run) shift; cmd_run "$@" ;;
*) usage ;;
esac
