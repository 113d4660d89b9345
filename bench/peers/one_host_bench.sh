#!/usr/bin/env bash
# bench/peers/one_host_bench.sh: softhca between two processes of one host
# against UCX over shared memory (UCX_TLS=posix,cma), in the same run, with
# server and client pinned to different cores. Issue #11's table.
#
#   bench/peers/one_host_bench.sh [--reps N] [--libdir DIR] [--cores A,B]
#
# Each repetition measures, interleaved:
#   write_lat    ib_write_lat -s 2 (t_typical, us)   vs ucp_put_lat -s 8 (p50)
#   send_lat     ib_send_lat -s 2                    vs ucp_am_lat -s 8 (p50)
#   read_lat     ib_read_lat -s 2                    vs ucp_get -s 8 (p50)
#   atomic_lat   ib_atomic_lat (fetch-and-add)       vs ucp_fadd -s 8 (p50)
#   bw_64k       ib_write_bw -s 65536 (MB/s)         vs ucp_put_bw -s 65536
#   bw_1m        ib_write_bw -s 1048576              vs ucp_put_bw -s 1048576
#   rate_64      ib_write_bw -s 64 (M msg/s)         vs ucp_put_bw -s 64
# and, before each repetition, the one-way time of a bare cache line
# between the same two cores (bench/micro/line_trip, from the build beside
# --libdir or on PATH): the floor under the latencies, which on a VM moves
# with the placement of its vCPUs.
# The bandwidth runs of both make as many transfers (100,000 of 64 KiB,
# 5,000 of 1 MiB): with a fifth as many, softhca's 64 KiB run lasted 30 ms
# and its start weighed on the average (0.64-0.94 of UCX in a run where
# equal counts gave 0.99-1.03).
# and prints every sample, the medians with their spread, softhca / UCX of
# the medians, and the median of the per-repetition ratios ("paired").
# Bars (issue #11): write_lat and send_lat <= 1.2; bw_64k and bw_1m >= 0.9;
# rate_64 >= 10 M msg/s and >= 0.3.
set -u -o pipefail

reps=3 cores=0,1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
libdir=$root/build/lib
while (($#)); do
  case $1 in
    --reps) reps=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    --cores) cores=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -f $libdir/libibverbs.so.1 ]] || { echo "no softhca library in $libdir: build first" >&2; exit 1; }
for tool in ib_write_lat ib_send_lat ib_read_lat ib_atomic_lat ib_write_bw ucx_perftest taskset ss; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
server_core=${cores%,*} client_core=${cores#*,}
line_trip=$libdir/../bin/line_trip
[[ -x $line_trip ]] || line_trip=$(command -v line_trip || true)
[[ -n $line_trip ]] || echo "no line_trip (cmake --build build --target line_trip): the line's trip is not measured" >&2
tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # wait_listen

port=19400
# pair ENV AWK_PROGRAM -- CMD...: server then client (adding 127.0.0.1) of
# CMD, pinned; prints what AWK_PROGRAM finds in the client's output.
pair() {
  local env_=$1 prog=$2 spid
  shift 3
  port=$((port + 1))
  env "$env_" timeout 60 taskset -c "$server_core" "$@" -p "$port" >"$tmp/server" 2>&1 &
  spid=$!
  pids+=("$spid")
  wait_listen "$port" "$spid" || { echo "server of $* did not start:" >&2; cat "$tmp/server" >&2; return 1; }
  env "$env_" timeout 60 taskset -c "$client_core" "$@" -p "$port" 127.0.0.1 >"$tmp/client" 2>&1 ||
    { echo "client of $* failed:" >&2; cat "$tmp/client" >&2; }
  wait "$spid" 2>/dev/null
  awk "$prog" "$tmp/client"
}

sv="LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ux="UCX_TLS=posix,cma"
lat='$1 == 2 || $1 == 8 {v = $5} END {print v}'        # perftest: t_typical
bw='$1 == SIZE && NF == 5 {v = $4} END {print v}'       # perftest: BW average
rate='$1 == 64 && NF == 5 {v = $5} END {print v}'       # perftest: MsgRate (Mpps)
ulat='NF == 8 && $1 ~ /^[0-9]+$/ {v = $2} END {print v}'  # ucx -f: p50 latency
ubw='NF == 8 && $1 ~ /^[0-9]+$/ {v = $6} END {print v}'   # ucx -f: overall MB/s
urate='NF == 8 && $1 ~ /^[0-9]+$/ {v = $8 / 1e6} END {print v}'
declare -A s
for ((r = 1; r <= reps; r++)); do
  [[ -n $line_trip ]] &&
    s[line_ns,trip]+="$("$line_trip" --cores "$server_core,$client_core" --iters 100000 | awk '{for (i = 1; i < NF; i++) if ($(i + 1) == "ns") {print $i; exit}}') "
  s[write_lat,softhca]+="$(pair "$sv" "$lat" -- ib_write_lat -s 2 -n 20000) "
  s[write_lat,ucx]+="$(pair "$ux" "$ulat" -- ucx_perftest -t ucp_put_lat -s 8 -n 200000 -f) "
  s[send_lat,softhca]+="$(pair "$sv" "$lat" -- ib_send_lat -s 2 -n 20000) "
  s[send_lat,ucx]+="$(pair "$ux" "$ulat" -- ucx_perftest -t ucp_am_lat -s 8 -n 200000 -f) "
  s[read_lat,softhca]+="$(pair "$sv" "$lat" -- ib_read_lat -s 2 -n 20000) "
  s[read_lat,ucx]+="$(pair "$ux" "$ulat" -- ucx_perftest -t ucp_get -s 8 -n 200000 -f) "
  s[atomic_lat,softhca]+="$(pair "$sv" '$1 == 8 {v = $5} END {print v}' -- ib_atomic_lat -A FETCH_AND_ADD -n 20000) "
  s[atomic_lat,ucx]+="$(pair "$ux" "$ulat" -- ucx_perftest -t ucp_fadd -s 8 -n 200000 -f) "
  s[bw_64k,softhca]+="$(pair "$sv" "${bw/SIZE/65536}" -- ib_write_bw -s 65536 -n 100000) "
  s[bw_64k,ucx]+="$(pair "$ux" "$ubw" -- ucx_perftest -t ucp_put_bw -s 65536 -n 100000 -f) "
  s[bw_1m,softhca]+="$(pair "$sv" "${bw/SIZE/1048576}" -- ib_write_bw -s 1048576 -n 5000) "
  s[bw_1m,ucx]+="$(pair "$ux" "$ubw" -- ucx_perftest -t ucp_put_bw -s 1048576 -n 5000 -f) "
  s[rate_64,softhca]+="$(pair "$sv" "$rate" -- ib_write_bw -s 64 -D 2) "
  s[rate_64,ucx]+="$(pair "$ux" "$urate" -- ucx_perftest -t ucp_put_bw -s 64 -n 20000000 -f) "
  echo "rep $r done" >&2
done

stats() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{v[NR]=$1} END {if (NR) printf "%s (%s..%s)", v[int((NR+1)/2)], v[1], v[NR]; else print "nan"}'; }
echo "one host, server on core $server_core, client on core $client_core, $reps reps; median (min..max)"
# paired: the median over repetitions of each repetition's own ratio (its
# softhca run against the UCX run right after it), which a machine that
# drifts between runs (a VM whose vCPUs move) sways less than the ratio
# of the two medians.
paired() {
  awk -v xs="$1" -v ys="$2" 'BEGIN {
    n = split(xs, x, " "); split(ys, y, " "); m = 0
    for (i = 1; i <= n; i++) if (y[i] > 0 && x[i] != "") r[++m] = x[i] / y[i]
    if (!m) { print "nan"; exit }
    for (i = 2; i <= m; i++) { v = r[i]; for (j = i - 1; j > 0 && r[j] > v; j--) r[j + 1] = r[j]; r[j + 1] = v }
    printf "%.2f", r[int((m + 1) / 2)] }'
}
printf '%-11s %-28s %-28s %-11s %s\n' what softhca ucx softhca/ucx paired
for k in write_lat send_lat read_lat atomic_lat bw_64k bw_1m rate_64; do
  a=$(echo "${s[$k,softhca]}" | stats)
  b=$(echo "${s[$k,ucx]}" | stats)
  ratio=$(awk -v x="${a%% *}" -v y="${b%% *}" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "nan" }')
  printf '%-11s %-28s %-28s %-11s %s\n' "$k" "$a" "$b" "$ratio" "$(paired "${s[$k,softhca]}" "${s[$k,ucx]}")"
done
[[ -n ${s[line_ns,trip]:-} ]] &&
  echo "a bare cache line between the two cores, one way: $(echo "${s[line_ns,trip]}" | stats) ns"
echo "units: latency us, bandwidth MB/s (2^20), rate M msg/s"
echo "samples, in run order (softhca | ucx):"
[[ -n ${s[line_ns,trip]:-} ]] && printf '  %-11s %s\n' "line trip" "${s[line_ns,trip]}"
for k in write_lat send_lat read_lat atomic_lat bw_64k bw_1m rate_64; do
  printf '  %-11s %s| %s\n' "$k" "${s[$k,softhca]}" "${s[$k,ucx]}"
done
