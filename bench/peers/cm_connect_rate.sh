#!/usr/bin/env bash
# bench/peers/cm_connect_rate.sh: rdma_cm connection set-up rate, cmtime -c N,
# between two hosts (two network namespaces on a veth pair, through
# tests/system/two_hosts.sh: CM MADs over the udp link) and on one host
# (127.0.0.1 in a network namespace of its own: the local CM transport),
# interleaved.
#
#   bench/peers/cm_connect_rate.sh [--reps N] [--connections N] [--libdir DIR]
#
# Runs as root. Prints, per repetition and as medians, cmtime's "connect"
# step as connections per second (N / the step's total time); issue #10's
# bar is >= 3,000/s between hosts.
set -u -o pipefail

reps=3 count=1000
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
libdir=$root/build/lib
while (($#)); do
  case $1 in
    --reps) reps=$2; shift ;;
    --connections) count=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
libdir=$(cd "$libdir" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# connects/s from cmtime's output on stdin: "connect : total_ms max_ms min_us us/conn".
rate() { awk -v n="$count" '/^(\[[^]]*\] )?connect +:/ { for (i = 1; i <= NF; i++) if ($i == ":") { printf "%.0f\n", n / ($(i + 1) / 1000); exit } }'; }

two_hosts() {
  bash "$root/tests/system/two_hosts.sh" --name bench --timeout 120 --libdir "$libdir" --port 18515 \
    --ready-log "cm: listening on" --env SOFTHCA_LOG=info --server-persists \
    --server "cmtime -b @SERVER@ -p 7174" --client "cmtime -s @SERVER@ -p 7174 -c $count" \
    | grep "client\]" | sed 's/^\[bench client\] //' | rate
}

# In a network and mount namespace of its own (lo, an empty /dev/shm), so
# that nothing else on this machine shares its CM port or its softhca
# processes; tests/system/harness.sh starts the client once the server logs
# that it listens.
one_host() {
  unshare -n -m --propagation private sh -c '
    ip link set lo up && mount -t tmpfs tmpfs /dev/shm || exit 1
    exec bash "$1" --name bench --timeout 120 --libdir "$2" --port 18515 \
      --ready-regex "cm: listening on" --server-persists --no-backtrace \
      --server "env SOFTHCA_LOG=info cmtime -b 127.0.0.1 -p 7174" --client "cmtime -s 127.0.0.1 -p 7174 -c $3"' \
    sh "$root/tests/system/harness.sh" "$libdir" "$count" 2>&1 | grep "client\]" | sed 's/^\[bench client\] //' | rate
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else print v[int((NR + 1) / 2)] }'; }

: >"$tmp/two" ; : >"$tmp/one"
for ((r = 1; r <= reps; r++)); do
  two=$(two_hosts); one=$(one_host)
  echo "rep $r: two hosts ${two:-failed} connects/s, one host ${one:-failed} connects/s"
  [[ -n $two ]] && echo "$two" >>"$tmp/two"
  [[ -n $one ]] && echo "$one" >>"$tmp/one"
done
echo "median over $reps reps of cmtime -c $count: two hosts $(median <"$tmp/two") connects/s," \
     "one host $(median <"$tmp/one") connects/s (bar between hosts: >= 3000)"
