#!/usr/bin/env bash
# bench/peers/rsocket_throughput.sh: stream throughput of rsockets on
# softhca next to plain TCP over loopback, on 127.0.0.1, interleaved:
#   rstream  -S SIZE -C COUNT -T b   over softhca (rsockets)
#   rstream  -S SIZE -C COUNT -T bs  the same program on TCP sockets (-T s)
#   iperf3 -t SECS                   through Debian's librspreload.so on softhca
#   iperf3 -t SECS                   plain TCP
#   rstream -S 64 -C 1 -I 2000 -T b  ping-pong latency, rsockets and TCP (us per
#                                    transfer as rstream prints it: half a round trip)
#
#   bench/peers/rsocket_throughput.sh [--reps N] [--size BYTES] [--count N]
#                                     [--seconds S] [--libdir DIR]
#
# Prints each repetition and the median of each (Gbit/s, the receiver's
# figure for iperf3, the client's for rstream, which sends), with the ratio
# rsockets / TCP. Every peer it starts, it stops by PID.
set -u -o pipefail

reps=3 size=1000000 count=500 seconds=3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
libdir=$root/build/lib
preload=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
while (($#)); do
  case $1 in
    --reps) reps=$2; shift ;;
    --size) size=$2; shift ;;
    --count) count=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
libdir=$(cd "$libdir" && pwd)
for prog in rstream iperf3; do
  command -v $prog >/dev/null || { echo "rsocket_throughput: $prog is not installed" >&2; exit 77; }
done
[[ -f $preload ]] || { echo "rsocket_throughput: no $preload (package librdmacm1)" >&2; exit 77; }
tmp=$(mktemp -d)
server=
trap '[[ -n $server ]] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT

# run_pair PORT SERVER_CMD... -- CLIENT_CMD...: the server in the
# background, the client once the server had 1 s to listen; prints the
# client's output. Our libraries come first in LD_LIBRARY_PATH for both
# (TCP runs do not load them).
run_pair() {
  local -a srv=() cli=()
  while [[ $1 != -- ]]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  LD_LIBRARY_PATH=$libdir timeout 120 "${srv[@]}" >"$tmp/server.log" 2>&1 &
  server=$!
  sleep 1
  LD_LIBRARY_PATH=$libdir timeout 120 "${cli[@]}" 2>&1
  wait "$server" 2>/dev/null
  server=
}

rstream_gbps() {  # rstream's "custom" line: name bytes xfers iters total time Gb/sec usec/xfer
  awk '$1 == "custom" { print $7 }'
}
rstream_usec() { awk '$1 == "custom" { print $8 }'; }
iperf_gbps() {  # the receiver's summary line, in Gbit/s
  awk '/receiver$/ { for (i = 1; i <= NF; i++) if ($i ~ /bits\/sec$/) { v = $(i - 1); u = $i } }
       END { if (u == "Mbits/sec") v /= 1000; if (u == "Kbits/sec") v /= 1e6; print v }'
}

declare -A results
kinds=(rstream_rsocket rstream_tcp iperf3_rsocket iperf3_tcp lat64_rsocket lat64_tcp)
for ((r = 1; r <= reps; r++)); do
  v=$(run_pair rstream -p 7580 -S "$size" -C "$count" -T b -- \
        rstream -s 127.0.0.1 -p 7580 -S "$size" -C "$count" -T b | rstream_gbps)
  results[rstream_rsocket]+="$v "
  v=$(run_pair rstream -p 7581 -S "$size" -C "$count" -T b -T s -- \
        rstream -s 127.0.0.1 -p 7581 -S "$size" -C "$count" -T b -T s | rstream_gbps)
  results[rstream_tcp]+="$v "
  v=$(run_pair env LD_PRELOAD=$preload iperf3 -s -1 -p 7582 -- \
        env LD_PRELOAD=$preload iperf3 -c 127.0.0.1 -p 7582 -t "$seconds" | iperf_gbps)
  results[iperf3_rsocket]+="$v "
  v=$(run_pair iperf3 -s -1 -p 7583 -- iperf3 -c 127.0.0.1 -p 7583 -t "$seconds" | iperf_gbps)
  results[iperf3_tcp]+="$v "
  v=$(run_pair rstream -p 7584 -S 64 -C 1 -I 2000 -T b -- \
        rstream -s 127.0.0.1 -p 7584 -S 64 -C 1 -I 2000 -T b | rstream_usec)
  results[lat64_rsocket]+="$v "
  v=$(run_pair rstream -p 7585 -S 64 -C 1 -I 2000 -T b -T s -- \
        rstream -s 127.0.0.1 -p 7585 -S 64 -C 1 -I 2000 -T b -T s | rstream_usec)
  results[lat64_tcp]+="$v "
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "n/a" }'; }
spread() { tr ' ' '\n' | grep . | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s..%s", lo, hi }'; }
printf "%-16s %-30s %10s %12s\n" kind "runs (Gbit/s; lat64: us)" median spread
for k in "${kinds[@]}"; do
  printf "%-16s %-30s %10s %12s\n" "$k" "${results[$k]}" "$(median <<<"${results[$k]}")" "$(spread <<<"${results[$k]}")"
done
for prog in rstream iperf3 lat64; do
  a=$(median <<<"${results[${prog}_rsocket]}") b=$(median <<<"${results[${prog}_tcp]}")
  awk -v a="$a" -v b="$b" -v p="$prog" 'BEGIN { if (b > 0) printf "%s: rsockets/TCP = %.2f\n", p, a / b }'
done
