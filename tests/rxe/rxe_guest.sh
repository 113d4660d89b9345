#!/usr/bin/env bash
# rxe_guest.sh: the Linux kernel's Soft-RoCE (rdma_rxe) as an RDMA peer for
# softhca, in a QEMU guest (TCG) booting Debian 12's own kernel.
#
# Why a guest: rxe lives in the kernel, and the host (or CI container) must
# not load modules; a guest with its own kernel can, and since it runs the
# host's root file system (read-only over virtio-9p) it runs the very
# rdma-core 44 programs installed on the host, with rdma-core's own
# libibverbs and rxe provider. Its eth0 is a tap in a network namespace made
# for it (the "host side"), so a softhca process started there reaches rxe
# over RoCEv2 (UDP 4791) as it would reach another machine.
#
#   host side (netns rxe-host-PID)          guest (QEMU -accel tcg)
#   rxetap0  198.18.1.1/24 2001:2:1::1/64   eth0 198.18.1.2/24 2001:2:1::2/64
#                                           rxe0 on eth0; agent on TCP 7000
#
# Use as a command:
#   rxe_guest.sh prepare          fetch the kernel .deb (apt-get download),
#                                 unpack it, build the initramfs; cached in
#                                 build-rxe-cache/, a no-op once done
#   rxe_guest.sh start            boot, wait until the guest's agent answers
#                                 (prints the boot time); the guest then
#                                 runs until `stop` or RXE_LIFETIME seconds
#   rxe_guest.sh run [-t S] CMD   run CMD (bash) in the guest; its output on
#                                 stdout, its exit status ours (124: timed out)
#   rxe_guest.sh spawn [-t S] CMD start CMD in the background; prints a job id
#   rxe_guest.sh wait [-t S] ID   wait for a job; its output, its status
#   rxe_guest.sh waitfor ID RE [S] wait until a job's output matches RE
#   rxe_guest.sh out ID | outfile ID | kill ID [SIG]
#   rxe_guest.sh host CMD...      run CMD on the host side (in the netns)
#   rxe_guest.sh dmesg            the guest's kernel log (console log if the
#                                 agent is gone)
#   rxe_guest.sh stop             kill QEMU, delete the namespace
# or source it and call rxe_prepare, rxe_start (which also sets an EXIT trap
# that calls rxe_stop), rxe_run, rxe_spawn, rxe_wait, rxe_waitfor, rxe_out,
# rxe_outfile, rxe_kill, rxe_host, rxe_dmesg, rxe_stop, and read
# RXE_NS, RXE_HOST_IP4/6, RXE_GUEST_IP4/6 (addresses without the /len).
#
# CMD: one argument is shell text (as with ssh); several are one argv,
# quoted exactly. It runs as root in /tmp of the guest, where / (the host's
# root) is read-only and /tmp, /run, /dev/shm are tmpfs. $RXE_SHARE in the
# guest is /run/rxe/share, the host directory of the jobs (rxe_sharedir).
#
# Settings (environment): RXE_NAME (default "default": several guests may
# run at once under different names), RXE_CACHE (build-rxe-cache of the
# repository), RXE_MEM (768M), RXE_SMP (2), RXE_BOOT_TIMEOUT (120 s),
# RXE_LIFETIME (1800 s: QEMU is killed after that whatever happens),
# RXE_KERNEL_PKG (default: what linux-image-amd64 depends on, or the .deb
# already in the cache), RXE_CMD_TIMEOUT (60 s, a job's default bound),
# RXE_QEMU_EXTRA (more QEMU arguments, split on blanks).
#
# How the host talks to the guest: a job is a directory of a writable 9p
# share (the host's $state/share); the host writes its command there and
# sends "spawn ID SECS" to the guest's agent (busybox nc on TCP 7000,
# reached with socat from the namespace). The guest writes the job's output
# and, once it ended, its exit status into that directory; the host reads
# them from its own file system. Readiness is the agent's "pong", never a
# fixed sleep; every wait is bounded.
#
# Needs root (namespaces, tap). Installs qemu-system-x86, busybox-static and
# socat when missing (dpkg-query first; apt-get only for what is missing).

RXE_TESTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RXE_REPO=$(cd "$RXE_TESTS_DIR/../.." && pwd)
RXE_CACHE=${RXE_CACHE:-$RXE_REPO/build-rxe-cache}
RXE_NAME=${RXE_NAME:-default}
RXE_STATE=$RXE_CACHE/run/$RXE_NAME
RXE_MEM=${RXE_MEM:-768M}
RXE_SMP=${RXE_SMP:-2}
RXE_BOOT_TIMEOUT=${RXE_BOOT_TIMEOUT:-120}
RXE_LIFETIME=${RXE_LIFETIME:-1800}
RXE_CMD_TIMEOUT=${RXE_CMD_TIMEOUT:-60}
RXE_PORT=7000
RXE_TAP=rxetap0
RXE_HOST_IP4=198.18.1.1 RXE_GUEST_IP4=198.18.1.2
RXE_HOST_IP6=2001:2:1::1 RXE_GUEST_IP6=2001:2:1::2
RXE_GUEST_MAC=52:54:00:12:34:56

rxe_log() { echo "[rxe] $*" >&2; }

# The modules the guest loads, by name; their dependencies come from the
# unpacked tree's modules.dep. Prefixed "?" = optional (loaded if present).
rxe_modules=(
  virtio_pci virtio_net                    # eth0
  9pnet_virtio 9p                          # the host's root and the job share
  crc32_generic                            # rxe's ICRC: crypto_alloc_shash("crc32")
  rdma_rxe                                 # ib_core ib_uverbs udp_tunnel ip6_udp_tunnel
  rdma_ucm                                 # rdma_cm ib_cm iw_cm configfs: rping, ucmatose, ...
  ?ib_umad                                 # /dev/infiniband/umad* for tools that look for it
)

rxe_install_deps() {
  local pkg status missing=()
  for pkg in qemu-system-x86 busybox-static socat iproute2 coreutils; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  rxe_log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# rxe_kernel_pkg: the linux-image package to boot.
rxe_kernel_pkg() {
  if [[ -n ${RXE_KERNEL_PKG:-} ]]; then echo "$RXE_KERNEL_PKG"; return; fi
  local deb
  deb=$(ls -1 "$RXE_CACHE"/dl/linux-image-6.1.0-*-amd64*_amd64.deb 2>/dev/null | sort -V | tail -1)
  if [[ -n $deb ]]; then basename "$deb" | sed 's/_.*//'; return; fi
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6/ { print $2; exit }'
}

rxe_prepare() {
  rxe_install_deps || return 1
  local pkg deb kver kroot stage stamp want
  pkg=$(rxe_kernel_pkg)
  [[ -n $pkg ]] || { rxe_log "cannot tell which linux-image package to use (set RXE_KERNEL_PKG)"; return 1; }
  mkdir -p "$RXE_CACHE/dl"
  deb=$(ls -1 "$RXE_CACHE/dl/${pkg}"_*_amd64.deb 2>/dev/null | sort -V | tail -1)
  if [[ -z $deb ]]; then
    rxe_log "downloading $pkg"
    # Sandbox user root: the cache is root's, _apt may not write into it.
    (cd "$RXE_CACHE/dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) || {
      apt-get update -q >&2 && (cd "$RXE_CACHE/dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
    } || { rxe_log "apt-get download $pkg failed"; return 1; }
    deb=$(ls -1 "$RXE_CACHE/dl/${pkg}"_*_amd64.deb | sort -V | tail -1)
  fi
  kroot=$RXE_CACHE/kroot-$(basename "$deb" .deb)
  if [[ ! -e $kroot/.unpacked ]]; then
    rxe_log "unpacking $(basename "$deb")"
    rm -rf "$kroot" && mkdir -p "$kroot" && dpkg-deb -x "$deb" "$kroot" || return 1
    kver=$(ls "$kroot/lib/modules")
    # The .deb has no modules.dep (its postinst runs depmod); busybox's
    # depmod makes one without kmod on the host.
    busybox depmod -b "$kroot" "$kver" || { rxe_log "depmod failed"; return 1; }
    touch "$kroot/.unpacked"
  fi
  kver=$(ls "$kroot/lib/modules")
  # Rebuild the initramfs whenever its inputs change.
  want=$( { echo "$kver"; echo "${rxe_modules[*]}"; cat "$RXE_TESTS_DIR/guest_init.sh"; busybox 2>&1 | head -1; } | sha256sum | cut -c1-16)
  stamp=$RXE_CACHE/initramfs-$kver.stamp
  if [[ -s $RXE_CACHE/initramfs-$kver.cpio && $(cat "$stamp" 2>/dev/null) == "$want" ]]; then
    ln -sfn "vmlinuz-$kver" "$RXE_CACHE/vmlinuz" && ln -sfn "initramfs-$kver.cpio" "$RXE_CACHE/initramfs.cpio"
    return 0
  fi
  rxe_log "building the initramfs for $kver"
  local moddir=$kroot/lib/modules/$kver
  declare -A deps=() path=() seen=()
  local line mod file d
  # modules.dep lines: "kernel/x/y.ko: kernel/dep1.ko kernel/dep2.ko"
  while IFS= read -r line; do
    file=${line%%:*}
    mod=$(basename "$file" .ko); mod=${mod//-/_}
    path[$mod]=$file
    deps[$mod]=${line#*:}
  done <"$moddir/modules.dep"
  local order=()
  add_module() { # $1 module name; its dependencies first
    local m=${1//-/_} d dn
    [[ -n ${seen[$m]:-} ]] && return 0
    [[ -n ${path[$m]:-} ]] || return 1
    seen[$m]=1
    for d in ${deps[$m]}; do
      dn=$(basename "$d" .ko)
      add_module "$dn" || return 1
    done
    order+=("$m")
  }
  stage=$RXE_CACHE/initramfs-$kver.d
  rm -rf "$stage" && mkdir -p "$stage"/{bin,dev,proc,sys,newroot,lib/modules} || return 1
  : >"$stage/modules.load"
  local name opt
  for name in "${rxe_modules[@]}"; do
    opt=""
    [[ $name == \?* ]] && { opt="?"; name=${name#\?}; }
    local before=${#order[@]}
    if ! add_module "$name"; then
      [[ -n $opt ]] && continue
      rxe_log "module $name (or a dependency) is not in $kver"
      return 1
    fi
    for mod in "${order[@]:before}"; do
      mkdir -p "$stage/lib/modules/$(dirname "${path[$mod]}")"
      cp "$moddir/${path[$mod]}" "$stage/lib/modules/${path[$mod]}" || return 1
      # Only the module asked for may fail when optional; its dependencies
      # are shared with others, so an optional one's failure stays its own.
      if [[ $mod == "${name//-/_}" ]]; then echo "$opt${path[$mod]}"; else echo "${path[$mod]}"; fi >>"$stage/modules.load"
    done
  done
  cp /bin/busybox "$stage/bin/busybox" || return 1
  local applet
  for applet in sh mount insmod mkdir cp chmod cat switch_root sleep echo; do
    ln -s busybox "$stage/bin/$applet"
  done
  install -m 755 "$RXE_TESTS_DIR/guest_init.sh" "$stage/init" || return 1
  # The kernel opens /dev/console for init's stdio before /init runs.
  mknod -m 600 "$stage/dev/console" c 5 1 || return 1
  # Uncompressed: decompressing under TCG costs more than QEMU's copy.
  (cd "$stage" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null) >"$RXE_CACHE/initramfs-$kver.cpio.tmp" || return 1
  mv "$RXE_CACHE/initramfs-$kver.cpio.tmp" "$RXE_CACHE/initramfs-$kver.cpio"
  cp "$kroot/boot/vmlinuz-$kver" "$RXE_CACHE/vmlinuz-$kver" || return 1
  echo "$want" >"$stamp"
  ln -sfn "vmlinuz-$kver" "$RXE_CACHE/vmlinuz" && ln -sfn "initramfs-$kver.cpio" "$RXE_CACHE/initramfs.cpio"
  rxe_log "initramfs: $(wc -c <"$RXE_CACHE/initramfs-$kver.cpio") bytes, modules: $(grep -c . "$stage/modules.load")"
}

# State of a started guest, kept in files so that the command form (one
# process per call) and the sourced form behave alike.
rxe_load() {
  [[ -r $RXE_STATE/env ]] || { rxe_log "no guest \"$RXE_NAME\" is running (rxe_guest.sh start)"; return 1; }
  # shellcheck disable=SC1091
  source "$RXE_STATE/env"
}

rxe_alive() {
  rxe_load 2>/dev/null || return 1
  kill -0 "$RXE_QEMU_PGID" 2>/dev/null
}

rxe_start() {
  local trap_too=1
  [[ ${1:-} == --no-trap ]] && trap_too=0
  if rxe_alive; then rxe_log "guest \"$RXE_NAME\" is already running (rxe_guest.sh stop)"; return 1; fi
  rxe_stop   # what a guest of this name that died left behind (its namespace)
  [[ -s $RXE_CACHE/vmlinuz && -s $RXE_CACHE/initramfs.cpio ]] || rxe_prepare || return 1
  rm -rf "$RXE_STATE" && mkdir -p "$RXE_STATE/share/jobs" || return 1
  RXE_NS=rxe-host-$$
  ip netns add "$RXE_NS" || { rxe_log "cannot create network namespace $RXE_NS"; return 1; }
  printf 'RXE_NS=%q\n' "$RXE_NS" >"$RXE_STATE/env"
  # A signal ends the script through exit, so that the EXIT trap runs.
  ((trap_too)) && { trap 'rxe_stop' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM HUP; }
  # The tap exists (and has its addresses) before QEMU opens it by name.
  ip -n "$RXE_NS" link set lo up &&
    ip -n "$RXE_NS" tuntap add dev "$RXE_TAP" mode tap &&
    ip netns exec "$RXE_NS" sysctl -qw "net.ipv6.conf.$RXE_TAP.accept_dad=0" &&
    ip -n "$RXE_NS" addr add "$RXE_HOST_IP4/24" dev "$RXE_TAP" &&
    ip -n "$RXE_NS" addr add "$RXE_HOST_IP6/64" dev "$RXE_TAP" nodad &&
    ip -n "$RXE_NS" link set "$RXE_TAP" up || { rxe_log "cannot set up $RXE_TAP in $RXE_NS"; return 1; }

  local append="console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable no_timer_check"
  append+=" rxe.ip4=$RXE_GUEST_IP4/24 rxe.ip6=$RXE_GUEST_IP6/64 rxe.port=$RXE_PORT rxe.dev=rxe0"
  local t0; t0=$(date +%s%N)
  # setsid: QEMU and its timeout are one process group that stop kills;
  # timeout bounds the guest's life even if nobody calls stop.
  setsid ip netns exec "$RXE_NS" timeout -k 5 "$RXE_LIFETIME" \
    qemu-system-x86_64 -accel tcg -cpu max -m "$RXE_MEM" -smp "$RXE_SMP" \
      -nographic -vga none -monitor none -serial "file:$RXE_STATE/console.log" -no-reboot \
      -kernel "$RXE_CACHE/vmlinuz" -initrd "$RXE_CACHE/initramfs.cpio" -append "$append" \
      -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
      -virtfs "local,path=$RXE_STATE/share,mount_tag=rxeshare,security_model=none,multidevs=remap" \
      -netdev "tap,id=n0,ifname=$RXE_TAP,script=no,downscript=no" \
      -device "virtio-net-pci,netdev=n0,mac=$RXE_GUEST_MAC,romfile=" \
      -pidfile "$RXE_STATE/qemu.pid" ${RXE_QEMU_EXTRA:-} \
      </dev/null >"$RXE_STATE/qemu.log" 2>&1 &
  RXE_QEMU_PGID=$!
  printf 'RXE_QEMU_PGID=%q\n' "$RXE_QEMU_PGID" >>"$RXE_STATE/env"

  # Ready: the guest prints READY (or FAILED) on its console; then its agent
  # must answer. Bounded by RXE_BOOT_TIMEOUT; a dead QEMU ends it at once.
  local deadline=$((SECONDS + RXE_BOOT_TIMEOUT)) ready=""
  while ((SECONDS < deadline)); do
    if grep -q "rxe-guest: READY" "$RXE_STATE/console.log" 2>/dev/null; then ready=1; break; fi
    if grep -Eq "rxe-guest: FAILED|Kernel panic" "$RXE_STATE/console.log" 2>/dev/null; then break; fi
    kill -0 "$RXE_QEMU_PGID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -n $ready ]]; then
    ready=""
    while ((SECONDS < deadline)); do
      [[ $(rxe_agent ping 2>/dev/null) == pong ]] && { ready=1; break; }
      kill -0 "$RXE_QEMU_PGID" 2>/dev/null || break
      sleep 0.2
    done
  fi
  local ms=$((($(date +%s%N) - t0) / 1000000))
  if [[ -z $ready ]]; then
    rxe_log "the guest is not ready after $ms ms (bound ${RXE_BOOT_TIMEOUT}s); console and QEMU log:"
    tail -n 40 "$RXE_STATE/console.log" >&2 2>/dev/null
    cat "$RXE_STATE/qemu.log" >&2 2>/dev/null
    return 1
  fi
  echo "RXE_BOOT_MS=$ms" >>"$RXE_STATE/env"
  rxe_log "guest ready in $ms ms: $(grep -o 'rxe-guest: READY.*' "$RXE_STATE/console.log")"
}

rxe_stop() {
  rxe_load 2>/dev/null || return 0
  local qpid
  qpid=$(cat "$RXE_STATE/qemu.pid" 2>/dev/null)
  if kill -0 "$RXE_QEMU_PGID" 2>/dev/null; then
    kill -TERM -- "-$RXE_QEMU_PGID" 2>/dev/null
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$RXE_QEMU_PGID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$RXE_QEMU_PGID" 2>/dev/null
  fi
  [[ -n $qpid ]] && kill -KILL "$qpid" 2>/dev/null
  ip netns del "$RXE_NS" 2>/dev/null
  rm -f "$RXE_STATE/env"
  return 0
}

# rxe_agent LINE: one request to the guest's agent; prints its reply.
rxe_agent() {
  rxe_load || return 1
  printf '%s\n' "$1" | ip netns exec "$RXE_NS" timeout 15 \
    socat -t 10 - "TCP4:$RXE_GUEST_IP4:$RXE_PORT,connect-timeout=3"
}

rxe_sharedir() { echo "$RXE_STATE/share"; }

# rxe_cmdtext ARGS...: one argument as is, several quoted into one command.
rxe_cmdtext() {
  if (($# == 1)); then printf '%s\n' "$1"; else printf '%q ' "$@"; echo; fi
}

rxe_spawn() {
  local t=$RXE_CMD_TIMEOUT
  [[ ${1:-} == -t ]] && { t=$2; shift 2; }
  [[ ${1:-} == -- ]] && shift
  (($#)) || { rxe_log "spawn: no command"; return 2; }
  rxe_load || return 1
  local dir id reply
  dir=$(mktemp -d "$RXE_STATE/share/jobs/j$(date +%H%M%S)-XXXX") || return 1
  id=$(basename "$dir")
  { echo 'export RXE_SHARE=/run/rxe/share'; rxe_cmdtext "$@"; } >"$dir/cmd"
  echo "$t" >"$dir/timeout"
  reply=$(rxe_agent "spawn $id $t")
  [[ $reply == ok* ]] || { rxe_log "spawn: the agent answered '${reply:-nothing}'"; return 1; }
  echo "$id"
}

rxe_outfile() { echo "$RXE_STATE/share/jobs/$1/out"; }
rxe_out() { cat "$RXE_STATE/share/jobs/$1/out" 2>/dev/null; }

# rxe_wait [-t SECS] ID: the job's output on stdout, its status as ours;
# 124 when it has not ended within SECS (the job's own bound + 10 s by
# default), and the job is then killed.
rxe_wait() {
  local t=""
  [[ ${1:-} == -t ]] && { t=$2; shift 2; }
  local id=$1 dir=$RXE_STATE/share/jobs/$1
  [[ -d $dir ]] || { rxe_log "wait: no job $id"; return 2; }
  [[ -n $t ]] || t=$(($(cat "$dir/timeout") + 10))
  local deadline=$((SECONDS + t))
  while [[ ! -s $dir/rc ]] && ((SECONDS < deadline)); do sleep 0.05; done
  rxe_out "$id"
  if [[ ! -s $dir/rc ]]; then
    rxe_log "job $id did not end within ${t}s; killing it"
    rxe_kill "$id" KILL >/dev/null
    return 124
  fi
  return "$(cat "$dir/rc")"
}

rxe_run() {
  local targs=()
  [[ ${1:-} == -t ]] && { targs=(-t "$2"); shift 2; }
  local id
  id=$(rxe_spawn "${targs[@]}" "$@") || return 1
  rxe_wait "$id"
}

# rxe_waitfor ID REGEX [SECS]: until the job's output matches REGEX (0), the
# job ends without it (1) or SECS pass (124).
rxe_waitfor() {
  local id=$1 re=$2 t=${3:-20} dir=$RXE_STATE/share/jobs/$1
  local deadline=$((SECONDS + t))
  while ((SECONDS < deadline)); do
    grep -Eq -- "$re" "$dir/out" 2>/dev/null && return 0
    [[ -s $dir/rc ]] && { grep -Eq -- "$re" "$dir/out" 2>/dev/null; return; }
    sleep 0.05
  done
  return 124
}

rxe_kill() { rxe_agent "kill $1 ${2:-TERM}"; }

rxe_host() {
  rxe_load || return 1
  ip netns exec "$RXE_NS" "$@"
}

rxe_dmesg() {
  if rxe_alive && rxe_run -t 20 dmesg; then return 0; fi
  rxe_log "the agent did not answer; the console log instead:"
  cat "$RXE_STATE/console.log"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -u -o pipefail
  cmd=${1:-help}
  shift || true
  case $cmd in
    prepare) rxe_prepare ;;
    start) rxe_start --no-trap || { rxe_stop; exit 1; } ;;
    stop) rxe_stop ;;
    run) rxe_run "$@" ;;
    spawn) rxe_spawn "$@" ;;
    wait) rxe_wait "$@" ;;
    waitfor) rxe_waitfor "$@" ;;
    out) rxe_out "$@" ;;
    outfile) rxe_outfile "$@" ;;
    kill) rxe_kill "$@" ;;
    host) rxe_host "$@" ;;
    dmesg) rxe_dmesg ;;
    ping) rxe_agent ping ;;
    help|-h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" ;;
    *) echo "rxe_guest.sh: unknown command $cmd (see --help)" >&2; exit 2 ;;
  esac
fi
