#!/usr/bin/env bash
# Benchmark, not a test: perftest on softhca against UCX's ucx_perftest over
# shared memory (UCX_TLS=posix,cma), in the same run, repeated; prints median,
# spread (min..max) and the ratio softhca / UCX, and writes a Markdown table.
#
#   bench/peers/perftest_vs_ucx.sh [--reps N] [--libdir DIR] [--out FILE]
#
# Scenarios (issue #2, item 10):
#   latency:   ib_write_lat -s 2 (t_typical)    vs  ucx_perftest -t ucp_put_lat -s 8 (50th percentile)
#   bandwidth: ib_write_bw -s 1048576 (average) vs  ucx_perftest -t tag_bw -s 1048576 (average)
# Lower is better for latency, higher for bandwidth. Both sides print MB/s in
# units of 2^20 bytes. Every server runs on 127.0.0.1 with a timeout and is
# killed by PID if it outlives its client.
set -euo pipefail

reps=5
libdir="$(cd "$(dirname "$0")/../.." && pwd)/build/lib"
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --libdir) libdir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f "$libdir/libibverbs.so.1" ]] || { echo "no softhca library in $libdir: build first (scripts/build.sh)" >&2; exit 1; }
for tool in ib_write_lat ib_write_bw ucx_perftest ss; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 1; }
done

port=19900
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # wait_listen

# run_pair NAME ENV_SERVER... -- : runs "$server_cmd" then "$client_cmd"; client output in $tmp/NAME
run_pair() {
  local name="$1"; shift
  port=$((port + 1))
  local server=("${@}")
  local srv_pid
  env "${pair_env[@]}" timeout 120 "${server[@]}" -p "$port" >"$tmp/$name.srv" 2>&1 &
  srv_pid=$!
  if ! wait_listen "$port" "$srv_pid"; then
    echo "server for $name did not start:" >&2; cat "$tmp/$name.srv" >&2; kill "$srv_pid" 2>/dev/null || true; return 1
  fi
  env "${pair_env[@]}" timeout 120 "${server[@]}" -p "$port" "${client_extra[@]}" >"$tmp/$name" 2>&1 || {
    echo "client for $name failed:" >&2; cat "$tmp/$name" >&2; kill "$srv_pid" 2>/dev/null || true; return 1; }
  for _ in $(seq 100); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.05; done
  kill "$srv_pid" 2>/dev/null || true
  wait "$srv_pid" 2>/dev/null || true
}

declare -A samples
measure() {  # measure KEY
  local key="$1" value
  case "$key" in
    softhca_lat)
      pair_env=(LD_LIBRARY_PATH="$libdir"); client_extra=(127.0.0.1)
      run_pair "$key" ib_write_lat -d softhca0 -x 0 -s 2 -n 20000
      value=$(awk '$1 == 2 && NF >= 5 {print $5}' "$tmp/$key") ;;
    ucx_lat)
      pair_env=(UCX_TLS=posix,cma,self); client_extra=(127.0.0.1 -t ucp_put_lat -s 8 -n 200000)
      run_pair "$key" ucx_perftest
      value=$(awk '/^Final:/ {print $3}' "$tmp/$key") ;;
    softhca_bw)
      pair_env=(LD_LIBRARY_PATH="$libdir"); client_extra=(127.0.0.1)
      run_pair "$key" ib_write_bw -d softhca0 -x 0 -s 1048576 -n 3000
      value=$(awk '$1 == 1048576 && NF >= 4 {print $4}' "$tmp/$key") ;;
    ucx_bw)
      pair_env=(UCX_TLS=posix,cma,self); client_extra=(127.0.0.1 -t tag_bw -s 1048576 -n 3000)
      run_pair "$key" ucx_perftest
      value=$(awk '/^Final:/ {print $6}' "$tmp/$key") ;;
  esac
  [[ -n "$value" ]] || { echo "could not parse $key:" >&2; cat "$tmp/$key" >&2; exit 1; }
  samples[$key]+="$value "
  printf '  %-12s rep %d: %s\n' "$key" "$rep" "$value" >&2
}

echo "softhca vs UCX, $reps repetitions, $(nproc) cores, $(uname -r)" >&2
for ((rep = 1; rep <= reps; rep++)); do
  # Interleave the peers so that background noise hits both alike.
  for key in softhca_lat ucx_lat softhca_bw ucx_bw; do measure "$key"; done
done

stats() {  # stats "v1 v2 ...": median min max
  tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "%s %s %s", m, v[1], v[NR]}'
}
read -r slat_m slat_lo slat_hi <<<"$(stats "${samples[softhca_lat]}")"
read -r ulat_m ulat_lo ulat_hi <<<"$(stats "${samples[ucx_lat]}")"
read -r sbw_m sbw_lo sbw_hi <<<"$(stats "${samples[softhca_bw]}")"
read -r ubw_m ubw_lo ubw_hi <<<"$(stats "${samples[ucx_bw]}")"
lat_ratio=$(awk -v a="$slat_m" -v b="$ulat_m" 'BEGIN {printf "%.2f", a / b}')
bw_ratio=$(awk -v a="$sbw_m" -v b="$ubw_m" 'BEGIN {printf "%.2f", a / b}')

table=$(cat <<TABLE
| scenario | softhca median (min..max) | UCX median (min..max) | ratio softhca/UCX | bar (issue #2) |
|---|---|---|---|---|
| latency, us: ib_write_lat -s 2 t_typical vs ucp_put_lat -s 8 p50 | $slat_m ($slat_lo..$slat_hi) | $ulat_m ($ulat_lo..$ulat_hi) | $lat_ratio | <= 10 |
| bandwidth, MB/s: ib_write_bw -s 1 MiB vs tag_bw -s 1 MiB | $sbw_m ($sbw_lo..$sbw_hi) | $ubw_m ($ubw_lo..$ubw_hi) | $bw_ratio | >= 0.5 |
TABLE
)
echo "$table"
if [[ -n "$out" ]]; then
  {
    echo "Measured $(date -u +%Y-%m-%d) with \`bench/peers/perftest_vs_ucx.sh --reps $reps\` on $(nproc) cores ($(uname -r)), UCX $(ucx_info -v | sed -n 's/# Version //p'), UCX_TLS=posix,cma,self."
    echo
    echo "$table"
  } >"$out"
fi
