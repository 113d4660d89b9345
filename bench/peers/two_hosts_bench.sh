#!/usr/bin/env bash
# bench/peers/two_hosts_bench.sh: the udp link between two network
# namespaces on a veth pair, against what the same pair does without it.
#
#   bench/peers/two_hosts_bench.sh [--reps N] [--libdir DIR] [--mtu BYTES] [--duration SECONDS]
#                                  [--only lat|bw]
#
# Runs as root (it makes the namespaces: 198.18.0.1 and .2, removed at the
# end). Each repetition measures, interleaved:
#   udp one-way     build/bin/udp_pingpong: half a UDP round trip, median (us)
#   write_lat       ib_write_lat -s 2 on softhca: t_typical (us)
#   send_lat        ib_send_lat -s 2 on softhca: t_typical (us)
#   ucx_tcp_lat     ucx_perftest -t ucp_put_lat -s 2, UCX_TLS=tcp: median (us)
#   write_bw        ib_write_bw -s 65536 on softhca: BW average (MB/s)
#   ucx_tcp_bw      ucx_perftest -t tag_bw -s 65536, UCX_TLS=tcp: overall (MB/s)
#   write_bw_loss1  ib_write_bw -s 65536 with SOFTHCA_FAULT=loss=0.01 at both ends
# and prints every sample, the medians, and the ratios issues #9 and #42 set
# bars on: write_lat and send_lat / ucx_tcp_lat (<= 1.2) and / udp one-way
# (<= 1.0), write_bw / ucx_tcp_bw (>= 1.0), write_bw_loss1 / write_bw
# (>= 0.5). --only lat runs the first five, --only bw the last three.
# --duration: the bandwidth runs last SECONDS each (ib_write_bw -D;
# ucx_perftest, which has no such option, makes SECONDS x 30,000 transfers,
# about as long at 2 GB/s) instead of 5,000 transfers each: a third of a
# second is mostly a stream's start, and short runs moved with their place
# in an interleaved rotation as much as with the build.
set -u -o pipefail

reps=3 duration= only=
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
libdir=$root/build/lib
mtu=1500
while (($#)); do
  case $1 in
    --reps) reps=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    --mtu) mtu=$2; shift ;;
    --duration) duration=$2; shift ;;
    --only) only=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -z $only || $only == lat || $only == bw ]] || { echo "--only takes lat or bw" >&2; exit 2; }
if [[ -n $duration ]] && ! [[ $duration =~ ^([1-9]|[1-2][0-9]|30)$ ]]; then
  echo "--duration takes whole seconds, 1 to 30" >&2
  exit 2
fi
# How much each bandwidth run moves: perftest's and UCX's arguments.
if [[ -n $duration ]]; then
  bw_amount=(-D "$duration") ucx_iters=$((duration * 30000)) limit=$((60 + 4 * duration))
else
  bw_amount=(-n 5000) ucx_iters=5000 limit=60
fi
bindir=$(cd "$libdir/../bin" && pwd)
[[ -x $bindir/udp_pingpong ]] || { echo "build udp_pingpong first (cmake --build build --target udp_pingpong)" >&2; exit 2; }

a=softhca-bench-$$-a b=softhca-bench-$$-b va=sba$$ vb=sbb$$
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
  ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b" || { echo "cannot create network namespaces (root?)" >&2; exit 1; }
ip link add "$va" type veth peer name "$vb" && ip link set "$va" netns "$a" && ip link set "$vb" netns "$b"
ip -n "$a" addr add 198.18.0.1/30 dev "$va"; ip -n "$b" addr add 198.18.0.2/30 dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" mtu "$mtu" up; ip -n "$b" link set "$vb" mtu "$mtu" up

# on NS ENV... -- CMD: a command on a host with a private /dev/shm.
on() {
  local ns=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  exec setsid ip netns exec "$ns" unshare -m --propagation private \
    sh -c 'mount -t tmpfs tmpfs /dev/shm && exec "$@"' sh env "${envs[@]}" "$@"
}

wait_port() {  # NS PORT PROTO
  local i
  for ((i = 0; i < 200; i++)); do
    ip netns exec "$1" ss "-l${3}nH" "sport = :$2" | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

# pair NAME PORT PROTO FIELD_CMD SERVER_ENV CLIENT_ENV -- CMD...: runs CMD as
# server on A and CMD 198.18.0.1 as client on B; prints what FIELD_CMD (awk)
# extracts from the client's output.
pair() {
  local name=$1 port=$2 proto=$3 field=$4
  shift 4
  local senv=() cenv=()
  while [[ $1 != -- ]]; do senv+=("$1"); shift; done
  shift
  while [[ $1 != -- ]]; do cenv+=("$1"); shift; done
  shift
  (on "$a" "${senv[@]}" -- timeout "$limit" "$@") >"$tmp/$name.server" 2>&1 &
  local spid=$!
  pids+=("$spid")
  wait_port "$a" "$port" "$proto" || { echo "$name: the server did not start" >&2; return 1; }
  (on "$b" "${cenv[@]}" -- timeout "$limit" "$@" 198.18.0.1) >"$tmp/$name.client" 2>&1
  kill -TERM -- "-$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  awk "$field" "$tmp/$name.client"
}

sv="LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
declare -A samples
lat() { [[ $only != bw ]]; }
bw() { [[ $only != lat ]]; }
for ((r = 1; r <= reps; r++)); do
  if lat; then
    v=$( (on "$a" -- "$bindir/udp_pingpong" -s -p 19800) >/dev/null 2>&1 & echo $!)
    pids+=("$v")
    wait_port "$a" 19800 u
    x=$(on "$b" -- "$bindir/udp_pingpong" -c 198.18.0.1 -p 19800 -n 20000 | awk '{print $4}')
    kill -KILL -- "-$v" 2>/dev/null
    samples[udp]+="$x "
    x=$(pair write_lat 18515 t '/^ *2 /{print $5}' "$sv" -- "$sv" -- ib_write_lat -x 0 -s 2 -n 5000)
    samples[write_lat]+="$x "
    x=$(pair send_lat 18515 t '/^ *2 /{print $5}' "$sv" -- "$sv" -- ib_send_lat -x 0 -s 2 -n 5000)
    samples[send_lat]+="$x "
    x=$(pair ucx_lat 13337 t '/^Final:/{print $3}' UCX_TLS=tcp -- UCX_TLS=tcp -- ucx_perftest -p 13337 -t ucp_put_lat -s 2 -n 20000)
    samples[ucx_tcp_lat]+="$x "
  fi
  if bw; then
    x=$(pair write_bw 18515 t '/^ *65536 /{print $4}' "$sv" -- "$sv" -- ib_write_bw -x 0 -s 65536 "${bw_amount[@]}")
    samples[write_bw]+="$x "
    x=$(pair ucx 13337 t '/^Final:/{print $7}' UCX_TLS=tcp -- UCX_TLS=tcp -- ucx_perftest -p 13337 -t tag_bw -s 65536 -n "$ucx_iters")
    samples[ucx_tcp_bw]+="$x "
    x=$(pair loss 18515 t '/^ *65536 /{print $4}' "$sv" SOFTHCA_FAULT=loss=0.01,seed=$r -- "$sv" SOFTHCA_FAULT=loss=0.01,seed=$((r + 100)) -- \
        ib_write_bw -x 0 -s 65536 "${bw_amount[@]}")
    samples[write_bw_loss1]+="$x "
  fi
  echo "rep $r of $reps done" >&2
done

median() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "nan"}'; }
echo "samples (reps=$reps, veth MTU $mtu${duration:+, ${duration} s per bandwidth run}):"
declare -A m
keys=()
lat && keys+=(udp write_lat send_lat ucx_tcp_lat)
bw && keys+=(write_bw ucx_tcp_bw write_bw_loss1)
for k in "${keys[@]}"; do
  m[$k]=$(echo "${samples[$k]}" | median)
  printf '  %-16s %s -> median %s\n' "$k" "${samples[$k]}" "${m[$k]}"
done
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "nan" }'; }
echo "ratios:"
if lat; then
  echo "  write_lat / ucx tcp put_lat:  $(ratio "${m[write_lat]}" "${m[ucx_tcp_lat]}")   (bar <= 1.2)"
  echo "  send_lat / ucx tcp put_lat:   $(ratio "${m[send_lat]}" "${m[ucx_tcp_lat]}")   (bar <= 1.2)"
  echo "  write_lat / udp one-way:      $(ratio "${m[write_lat]}" "${m[udp]}")   (bar <= 1.0)"
  echo "  send_lat / udp one-way:       $(ratio "${m[send_lat]}" "${m[udp]}")   (bar <= 1.0)"
fi
if bw; then
  echo "  write_bw / ucx tcp tag_bw:    $(ratio "${m[write_bw]}" "${m[ucx_tcp_bw]}")   (bar >= 1.0)"
  echo "  write_bw at 1% loss / 0%:     $(ratio "${m[write_bw_loss1]}" "${m[write_bw]}")   (bar >= 0.5)"
fi
