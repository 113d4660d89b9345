#!/usr/bin/env bash
# bench/peers/scaling.sh: how softhca's one-host data path scales with
# concurrent pairs, next to UCX over shared memory in the same run.
#
#   bench/peers/scaling.sh [--pairs "1 2 4 8"] [--sizes "64 65536"]
#                          [--seconds S] [--reps N] [--libdir DIR]
#                          [--share-cores]
#
# For each message size and each pair count N (skipped where the machine has
# fewer than 2N cores), N pairs run at once, each process pinned to a core of
# its own (server of pair i on core 2i, client on 2i+1).
# --share-cores runs pair counts the machine has too few cores for: the
# client of pair i on core i mod C and its server on core (i + 1) mod C,
# so that on 2 cores two pairs put one client on each core, beside the
# other pair's server. The servers of a one-sided write only wait (softhca's
# ib_write_bw server sleeps in a socket read; UCX's put_bw server polls its
# worker), so this measures how far N clients on C cores go, not the bar.
# Each run:
#   softhca   ib_write_bw -s SIZE -D S            (BW average, MsgRate)
#   ucx       ucx_perftest -t ucp_put_bw -s SIZE, UCX_TLS=posix,cma, with an
#             iteration count that a lone pair finishes in about S seconds
# and, once per size, one softhca pair with -q 8. Prints per repetition the
# sum over pairs of MB/s and Mmsg/s, then the medians and the scaling ratio
# aggregate / (N x one pair) that issue #11 sets a bar on (>= 0.8).
set -u -o pipefail

pairs="1 2 4 8" sizes="64 65536" seconds=3 reps=1 share_cores=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
libdir=$root/build/lib
while (($#)); do
  case $1 in
    --pairs) pairs=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --reps) reps=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    --share-cores) share_cores=1 ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -f $libdir/libibverbs.so.1 ]] || { echo "no softhca library in $libdir: build first" >&2; exit 1; }
for tool in ib_write_bw ucx_perftest taskset ss; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
cores=$(nproc)
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

# server_core I / client_core I: where pair I's processes run.
server_core() { if ((share_cores)); then echo $((($1 + 1) % cores)); else echo $((2 * $1)); fi; }
client_core() { if ((share_cores)); then echo $(($1 % cores)); else echo $((2 * $1 + 1)); fi; }

# run_pairs TAG N PORT_BASE SERVER_ENV -- CMD...: N pairs of CMD at once, the
# client adding 127.0.0.1; each client's output in $tmp/TAG.I.
run_pairs() {
  local tag=$1 n=$2 base=$3 env_=$4 i
  shift 5
  local servers=() clients=()
  for ((i = 0; i < n; i++)); do
    env "$env_" timeout $((seconds * 4 + 60)) taskset -c "$(server_core "$i")" "$@" -p $((base + i)) >"$tmp/$tag.s$i" 2>&1 &
    servers+=($!); pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    wait_listen $((base + i)) "${servers[i]}" || { echo "$tag: server $i did not start" >&2; cat "$tmp/$tag.s$i" >&2; }
  done
  for ((i = 0; i < n; i++)); do
    env "$env_" timeout $((seconds * 4 + 60)) taskset -c "$(client_core "$i")" "$@" -p $((base + i)) 127.0.0.1 >"$tmp/$tag.$i" 2>&1 &
    clients+=($!); pids+=($!)
  done
  for i in "${clients[@]}" "${servers[@]}"; do wait "$i" 2>/dev/null; done
}

# sum AWK_PROGRAM FILES...: the sum of the one number AWK_PROGRAM prints for
# each file (run once per file, so that its END block sees one file).
sum() {
  local prog=$1 f; shift
  for f in "$@"; do awk "$prog" "$f"; done |
    awk 'NF {s += $1; n++} END {if (n) printf "%.3f %d", s, n; else print "nan 0"}'
}

last() { local v=${1% }; echo "${v##* }"; }
sv="LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ux="UCX_TLS=posix,cma"
declare -A samples
for ((r = 1; r <= reps; r++)); do
  for size in $sizes; do
    # UCX runs by iteration count: size it from one lone pair.
    run_pairs cal 1 13400 "$ux" -- ucx_perftest -t ucp_put_bw -s "$size" -n $((size < 4096 ? 2000000 : 100000)) -f
    rate=$(awk 'NF == 8 && $1 ~ /^[0-9]+$/ {v = $8} END {print v + 0}' "$tmp/cal.0")
    iters=$(awk -v r="$rate" -v s="$seconds" 'BEGIN {n = int(r * s); print (n < 10000 ? 10000 : n)}')
    for n in $pairs; do
      ((2 * n <= cores || share_cores)) || { echo "skipping $n pairs: $cores cores (--share-cores runs them)" >&2; continue; }
      run_pairs sh "$n" 18700 "$sv" -- ib_write_bw -s "$size" -D "$seconds"
      read -r bw got < <(sum '$1 == '"$size"' && NF == 5 {print $4}' "$tmp"/sh.[0-9]*)
      read -r mr _ < <(sum '$1 == '"$size"' && NF == 5 {print $5}' "$tmp"/sh.[0-9]*)
      ((got == n)) || { echo "softhca $n x $size: $got of $n pairs reported" >&2; cat "$tmp"/sh.* >&2; }
      samples[softhca,$size,$n]+="$bw/$mr "
      rm -f "$tmp"/sh.*
      run_pairs ux "$n" 13400 "$ux" -- ucx_perftest -t ucp_put_bw -s "$size" -n "$iters" -f
      read -r bw got < <(sum 'NF == 8 && $1 ~ /^[0-9]+$/ {v = $6} END {print v}' "$tmp"/ux.[0-9]*)
      read -r mr _ < <(sum 'NF == 8 && $1 ~ /^[0-9]+$/ {v = $8 / 1e6} END {print v}' "$tmp"/ux.[0-9]*)
      ((got == n)) || { echo "ucx $n x $size: $got of $n pairs reported" >&2; cat "$tmp"/ux.* >&2; }
      samples[ucx,$size,$n]+="$bw/$mr "
      rm -f "$tmp"/ux.*
      echo "rep $r size $size pairs $n: softhca $(last "${samples[softhca,$size,$n]}") ucx $(last "${samples[ucx,$size,$n]}") (MB/s/Mmsg/s, sums)" >&2
    done
    run_pairs q8 1 18700 "$sv" -- ib_write_bw -s "$size" -D "$seconds" -q 8
    read -r bw _ < <(sum '$1 == '"$size"' && NF == 5 {print $4}' "$tmp"/q8.0)
    read -r mr _ < <(sum '$1 == '"$size"' && NF == 5 {print $5}' "$tmp"/q8.0)
    samples[q8,$size]+="$bw/$mr "
  done
done

median() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "nan"}'; }
field() { tr ' ' '\n' | awk -F/ -v f="$1" 'NF == 2 {print $f}'; }
ratio() { awk -v x="$1" -v y="$2" -v n="$3" 'BEGIN { if (y > 0) printf "%.2f", x / (n * y); else print "nan" }'; }
echo "machine: $cores cores$( ((share_cores)) && echo ", cores shared (--share-cores)"); ${seconds}s per run; reps $reps; every number is the sum over the pairs"
printf '%-8s %-8s %-5s %12s %10s %7s\n' size stack pairs MB/s Mmsg/s scale
for size in $sizes; do
  for stack in softhca ucx; do
    one_mr=$(echo "${samples[$stack,$size,1]:-}" | field 2 | median)
    for n in $pairs; do
      [[ -n ${samples[$stack,$size,$n]:-} ]] || continue
      bw=$(echo "${samples[$stack,$size,$n]}" | field 1 | median)
      mr=$(echo "${samples[$stack,$size,$n]}" | field 2 | median)
      printf '%-8s %-8s %-5s %12s %10s %7s\n' "$size" "$stack" "$n" "$bw" "$mr" "$(ratio "$mr" "$one_mr" "$n")"
    done
  done
  bw=$(echo "${samples[q8,$size]}" | field 1 | median)
  mr=$(echo "${samples[q8,$size]}" | field 2 | median)
  printf '%-8s %-8s %-5s %12s %10s   (one pair, -q 8)\n' "$size" softhca 1 "$bw" "$mr"
done
echo "softhca / ucx at one pair, by size:"
for size in $sizes; do
  s=$(echo "${samples[softhca,$size,1]:-}" | field 2 | median)
  u=$(echo "${samples[ucx,$size,1]:-}" | field 2 | median)
  echo "  $size: $(ratio "$s" "$u" 1)"
done
