#!/usr/bin/env bash
# bench/peers/ucx_over_softhca.sh: UCX over softhca (UCX_TLS=rc_v on
# softhca0:1, inside `softhca run --devices`) against UCX over shared memory
# (UCX_TLS=posix,cma), two processes of one host, in the same run,
# interleaved, server and client pinned to different cores. What it
# answers: what an application written for UCX pays for going through
# softhca's verbs instead of UCX's own shared-memory transports.
#
#   bench/peers/ucx_over_softhca.sh [--reps N] [--cores A,B] [--tool PATH]
#
# Each repetition measures, with ucx_perftest -f (UCP API), one run on each
# transport per line:
#   tag_lat_8    ucp tag_lat -s 8        (p50 latency, us)
#   tag_bw_1m    ucp tag_bw -s 1048576   (overall MB/s; rendezvous: RDMA READ on rc_v)
#   put_bw_64k   ucp_put_bw -s 65536     (overall MB/s; RDMA WRITE on rc_v)
# and prints every sample's median with its spread and softhca / UCX-shm.
set -u -o pipefail

reps=3 cores=0,1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tool=$root/build/bin/softhca
while (($#)); do
  case $1 in
    --reps) reps=$2; shift ;;
    --cores) cores=$2; shift ;;
    --tool) tool=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "--reps takes a whole number >= 1" >&2; exit 2; }
[[ -x $tool ]] || { echo "no softhca tool at $tool: build first (or --tool)" >&2; exit 1; }
for t in ucx_perftest taskset ss; do
  command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 1; }
done
server_core=${cores%,*} client_core=${cores#*,}
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

# The two sides of every comparison: the same ucx_perftest, only the
# transports differ. softhca's side runs in `softhca run --devices`, whose
# device files are what makes UCX see softhca0 at all.
# shellcheck disable=SC2034,SC2054  # read through pair's nameref; posix,cma is one value
softhca_env=(env UCX_TLS=rc_v UCX_NET_DEVICES=softhca0:1 "$tool" run --devices --)
# shellcheck disable=SC2034,SC2054
shm_env=(env UCX_TLS=posix,cma)

port=19450
# pair SIDE AWK_PROGRAM ARGS...: a ucx_perftest server and client (to
# 127.0.0.1) on SIDE (softhca or shm), pinned; prints what AWK_PROGRAM finds
# in the client's output, nothing when a peer failed (the statistics skip it).
pair() {
  local side=$1 prog=$2 spid
  shift 2
  local -n pre=${side}_env
  port=$((port + 1))
  "${pre[@]}" timeout 120 taskset -c "$server_core" ucx_perftest -p "$port" >"$tmp/server" 2>&1 &
  spid=$!
  pids+=("$spid")
  wait_listen "$port" "$spid" || { echo "$side server did not start:" >&2; cat "$tmp/server" >&2; return 1; }
  "${pre[@]}" timeout 120 taskset -c "$client_core" ucx_perftest -p "$port" -f "$@" 127.0.0.1 >"$tmp/client" 2>&1 ||
    { echo "$side client of $* failed:" >&2; cat "$tmp/client" >&2; }
  wait "$spid" 2>/dev/null
  awk "$prog" "$tmp/client"
}

lat='NF == 8 && $1 ~ /^[0-9]+$/ {v = $2} END {print v}'  # -f rows: p50 latency (us)
bw='NF == 8 && $1 ~ /^[0-9]+$/ {v = $6} END {print v}'   # -f rows: overall MB/s
declare -A s
for ((r = 1; r <= reps; r++)); do
  for side in softhca shm; do
    s[tag_lat_8,$side]+="$(pair $side "$lat" -t tag_lat -s 8 -n 200000) "
    s[tag_bw_1m,$side]+="$(pair $side "$bw" -t tag_bw -s 1048576 -n 20000) "
    s[put_bw_64k,$side]+="$(pair $side "$bw" -t ucp_put_bw -s 65536 -n 200000) "
  done
  echo "rep $r done" >&2
done

stats() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{v[NR]=$1} END {if (NR) printf "%s (%s..%s)", v[int((NR+1)/2)], v[1], v[NR]; else print "nan"}'; }
echo "one host, server on core $server_core, client on core $client_core, $reps reps; median (min..max)"
printf '%-11s %-28s %-28s %s\n' what softhca-rc_v ucx-shm softhca/shm
for k in tag_lat_8 tag_bw_1m put_bw_64k; do
  a=$(echo "${s[$k,softhca]}" | stats)
  b=$(echo "${s[$k,shm]}" | stats)
  ratio=$(awk -v x="${a%% *}" -v y="${b%% *}" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "nan" }')
  printf '%-11s %-28s %-28s %s\n' "$k" "$a" "$b" "$ratio"
done
echo "units: latency us (p50), bandwidth MB/s (2^20)"
