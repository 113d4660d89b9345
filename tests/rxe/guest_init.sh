#!/bin/busybox sh
# guest_init.sh: /init of the rxe guest's initramfs (see rxe_guest.sh).
#
# One file, three roles, picked by $1:
#   (none)   stage 1, PID 1 in the initramfs: load the modules listed in
#            /modules.load (dependency order, made by `rxe_guest.sh prepare`),
#            mount the host's / read-only over virtio-9p (tag hostroot) and
#            the job share read-write (tag rxeshare), give the new root its
#            own proc, sys, dev, /tmp and /run, then switch_root into it.
#   stage2   PID 1 in the host's root: configure eth0 and lo, create rxe0
#            with the host's iproute2 `rdma`, start the agent, print the
#            ready line on the console and stay alive as PID 1.
#   agent    one connection of the agent (busybox nc -ll -e runs it with the
#            socket on stdin/stdout); see "Agent protocol" below.
#
# Everything here runs under busybox sh, from a copy of busybox that stage 1
# puts in /run/rxe, so the guest needs nothing from the host's root to boot
# and to answer the agent; the programs under test (rdma, ibv_*, perftest,
# rdmacm-utils) are the host's own, run from the 9p root.
#
# Settings come on the kernel command line (rxe_guest.sh sets them):
#   rxe.ip4=ADDR/LEN rxe.ip6=ADDR/LEN rxe.port=TCP_PORT rxe.dev=NAME
#
# Agent protocol: the host connects to TCP rxe.port on eth0, sends one line
# and reads the reply:
#   ping            -> "pong"
#   spawn ID SECS   -> starts /run/rxe/share/jobs/ID/cmd under bash, bounded by
#                      SECS (coreutils timeout, KILL 5 s after TERM), in a
#                      process group of its own; output to jobs/ID/out, status
#                      to jobs/ID/rc once it ended (written as rc.tmp and then
#                      renamed, so the host never reads half a number);
#                      replies "ok PID".
#   kill ID SIG     -> sends SIG to the job's process group; "ok" or "gone".
# The share is a host directory, so the host reads a job's output while it
# runs (a server's "listening" line) and its status when it ends, with no
# further round trip.

R=/run/rxe
BB=busybox

console() { echo "rxe-guest: $*" >/dev/console; }

# The value of rxe.KEY= on the kernel command line, or $2.
cmdline_get() {
  local w
  for w in $(cat /proc/cmdline); do
    case $w in "rxe.$1="*) echo "${w#*=}"; return ;; esac
  done
  echo "$2"
}

fail() {
  console "FAILED: $*"
  # Keep PID 1 alive so that the host can still read the console; the host
  # sees the FAILED line and gives up at once instead of waiting for its
  # timeout.
  while :; do $BB sleep 3600; done
}

stage1() {
  export PATH=/bin
  mount -t proc proc /proc
  mount -t sysfs sysfs /sys
  mount -t devtmpfs devtmpfs /dev
  # Modules: "path" must load; "?path" may fail (optional).
  local m opt
  while read -r m; do
    [ -n "$m" ] || continue
    opt=""
    case $m in \?*) opt=1; m=${m#\?} ;; esac
    if ! out=$(insmod "/lib/modules/$m" 2>&1); then
      [ -n "$opt" ] || fail "insmod $m: $out"
    fi
  done </modules.load

  mkdir -p /newroot
  # msize: 9p moves at most this much per request; the default (8 KiB in
  # 6.1) makes every exec from the host's root crawl under TCG. cache=loose:
  # the root is read-only and nobody expects the guest to see host changes
  # made after boot, so lookups and pages may be cached.
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /newroot ||
    fail "cannot mount the host's root (9p tag hostroot)"
  mount -t tmpfs -o mode=755 tmpfs /newroot/run || fail "tmpfs /run"
  mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp || fail "tmpfs /tmp"
  mount --move /proc /newroot/proc && mount --move /sys /newroot/sys && mount --move /dev /newroot/dev ||
    fail "cannot move proc, sys, dev into the new root"
  mkdir -p /newroot/dev/shm /newroot/dev/pts
  mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
  mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
  mkdir -p /newroot$R/share
  # The job share: no cache, so that each write reaches the host at once.
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rxeshare /newroot$R/share ||
    fail "cannot mount the job share (9p tag rxeshare)"
  cp /init /newroot$R/init && cp /bin/busybox /newroot$R/busybox || fail "cannot copy init and busybox to $R"
  chmod 755 /newroot$R/init /newroot$R/busybox
  exec switch_root /newroot $R/busybox sh $R/init stage2
}

stage2() {
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
  BB=$R/busybox
  local ip4 ip6 port dev
  ip4=$(cmdline_get ip4 198.18.1.2/24)
  ip6=$(cmdline_get ip6 2001:2:1::2/64)
  port=$(cmdline_get port 7000)
  dev=$(cmdline_get dev rxe0)
  $BB hostname rxe-guest
  # A syslog-less guest: keep the console for our own lines and errors.
  echo 4 >/proc/sys/kernel/printk
  # This busybox's sh runs its own applets before anything in PATH (its ip
  # lacks nodad, its timeout lacks -k): the host's tools by their paths.
  local IP=/usr/bin/ip
  $IP link set lo up || fail "lo up"
  # No duplicate address detection: the IPv6 address (and the link-local one
  # made when eth0 comes up, which rxe turns into GID 0) are usable at once.
  for c in all default eth0; do echo 0 >/proc/sys/net/ipv6/conf/$c/accept_dad; done
  $IP link set eth0 up || fail "eth0 up"
  $IP addr add "$ip4" dev eth0 || fail "ip addr add $ip4"
  $IP -6 addr add "$ip6" dev eth0 nodad || fail "ip addr add $ip6"
  out=$(/usr/bin/rdma link add "$dev" type rxe netdev eth0 2>&1) || fail "rdma link add $dev: $out"
  # The agent: a persistent listener that forks $R/agent per connection
  # (nc -e takes one program, no arguments).
  printf '#!%s sh\nexec %s sh %s agent\n' $BB $BB $R/init >$R/agent && $BB chmod 755 $R/agent
  $BB nc -ll -p "$port" -e $R/agent </dev/null >/dev/null 2>&1 &
  # Ready once the listener is bound (so the host's first connection works).
  local i=0
  while ! $BB netstat -ltn 2>/dev/null | $BB grep -q ":$port "; do
    i=$((i + 1))
    [ $i -lt 200 ] || fail "the agent does not listen on $port"
    $BB usleep 20000
  done
  console "READY uptime=$($BB cut -d' ' -f1 /proc/uptime)s $($BB uname -r) $dev on eth0 $ip4 $ip6"
  # PID 1 must not exit (a kernel panic); wait reaps our own children.
  while :; do wait; $BB sleep 3600; done
}

agent() {
  local line verb id arg dir pid i
  IFS= read -r line || exit 0
  set -- $line
  verb=$1 id=$2 arg=$3
  case $id in *[!A-Za-z0-9._-]*) echo "bad id"; exit 0 ;; esac
  dir=$R/share/jobs/$id
  case $verb in
    ping) echo pong ;;
    spawn)
      [ -f "$dir/cmd" ] || { echo "no job $id"; exit 0; }
      case $arg in ''|*[!0-9]*) arg=60 ;; esac
      # The job is coreutils timeout and what it runs: timeout makes a
      # process group of its own (pid in jobs/ID/pid), which kill signals;
      # the wrapper around it is outside that group, so that it outlives a
      # killed job and writes its status. setsid: nothing of it stays in
      # nc's group or keeps the socket.
      rm -f "$dir/pid"
      $BB setsid $BB sh -c '
        cd /tmp
        /usr/bin/timeout -k 5 "$1" /usr/bin/bash "$2/cmd" >"$2/out" 2>&1 </dev/null &
        echo $! >"$2/pid.tmp" && mv "$2/pid.tmp" "$2/pid"
        wait $!
        echo $? >"$2/rc.tmp" && mv "$2/rc.tmp" "$2/rc"' job "$arg" "$dir" </dev/null >/dev/null 2>&1 &
      # Reply once the pid is known, so that a kill right after finds it.
      i=0
      while [ ! -s "$dir/pid" ] && [ $i -lt 500 ]; do $BB usleep 10000; i=$((i + 1)); done
      pid=$(cat "$dir/pid" 2>/dev/null)
      echo "ok $pid"
      ;;
    kill)
      pid=$(cat "$dir/pid" 2>/dev/null)
      case $arg in ''|*[!A-Z0-9]*) arg=TERM ;; esac
      # (busybox kill takes no "--" after -s SIG)
      if [ -n "$pid" ] && kill -s "$arg" "-$pid" 2>/dev/null; then echo ok; else echo gone; fi
      ;;
    *) echo "unknown verb $verb" ;;
  esac
}

case ${1:-} in
  stage2) stage2 ;;
  agent) agent ;;
  *) stage1 ;;
esac
