#!/usr/bin/env bash
# bench/peers/ab_perftest.sh: two softhca builds, the same perftest runs,
# interleaved, so that a change's cost is measured against its parent in the
# same minutes on the same machine.
#
#   bench/peers/ab_perftest.sh --a LIBDIR_A --b LIBDIR_B [--reps N] [--cores S,C]
#
# --cores pins the server to core S and the client to core C (taskset), as
# one_host_bench.sh does; unpinned by default.
#
# Runs, for each repetition, A then B of:
#   ib_write_lat -s 2 (typical us), ib_send_lat -s 2 (typical us),
#   ib_write_bw -s 64 (Mpps), ib_write_bw -s 65536 (GB/s)
# and prints every sample and the median per build and test.
set -euo pipefail

reps=3
a="" b=""
pin_server=() pin_client=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --a) a="$2"; shift 2 ;;
    --b) b="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --cores) pin_server=(taskset -c "${2%,*}"); pin_client=(taskset -c "${2#*,}"); shift 2 ;;
    -h|--help) sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for dir in "$a" "$b"; do
  [[ -f "$dir/libibverbs.so.1" ]] || { echo "no softhca libibverbs.so.1 in '$dir' (see --help)" >&2; exit 2; }
done

port=19700
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # wait_listen

# one LIBDIR OUTFILE PROGRAM ARGS...: a server and a client on loopback.
one() {
  local libdir="$1" out="$2" srv
  shift 2
  port=$((port + 1))
  LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 120 "${pin_server[@]}" "$@" -p "$port" >"$out.srv" 2>&1 &
  srv=$!
  wait_listen "$port" "$srv" || { echo "server did not start: $*" >&2; cat "$out.srv" >&2; return 1; }
  LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 120 "${pin_client[@]}" "$@" -p "$port" 127.0.0.1 >"$out" 2>&1 || { cat "$out" >&2; return 1; }
  wait "$srv" 2>/dev/null || true
}

declare -A samples
tests=(write_lat send_lat write_bw_64 write_bw_64k)
measure() {  # measure TEST BUILD LIBDIR
  local test="$1" build="$2" libdir="$3" f="$tmp/$1.$2" v
  case "$test" in
    write_lat) one "$libdir" "$f" ib_write_lat -d softhca0 -x 0 -s 2 -n 20000
      v=$(awk '$1 == 2 && NF >= 5 {print $5}' "$f") ;;
    send_lat) one "$libdir" "$f" ib_send_lat -d softhca0 -x 0 -s 2 -n 20000
      v=$(awk '$1 == 2 && NF >= 5 {print $5}' "$f") ;;
    write_bw_64) one "$libdir" "$f" ib_write_bw -d softhca0 -x 0 -s 64 -n 200000
      v=$(awk '$1 == 64 && NF >= 5 {print $5}' "$f") ;;
    write_bw_64k) one "$libdir" "$f" ib_write_bw -d softhca0 -x 0 -s 65536 -n 20000
      v=$(awk '$1 == 65536 && NF >= 4 {printf "%.2f", $4 / 1000 * 1.048576}' "$f") ;;
  esac
  [[ -n "$v" ]] || { echo "could not parse $test ($build):" >&2; cat "$f" >&2; exit 1; }
  samples[$test.$build]+="$v "
  printf '  %-13s %s rep %d: %s\n' "$test" "$build" "$rep" "$v"
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

echo "A: $a"
echo "B: $b"
echo "$reps repetitions, $(nproc) cores, $(uname -r)"
for ((rep = 1; rep <= reps; rep++)); do
  for test in "${tests[@]}"; do
    measure "$test" A "$a"
    measure "$test" B "$b"
  done
done
printf '\n%-13s %10s %10s %8s\n' test A B B/A
for test in "${tests[@]}"; do
  ma=$(median <<<"${samples[$test.A]}")
  mb=$(median <<<"${samples[$test.B]}")
  printf '%-13s %10s %10s %8.2f\n' "$test" "$ma" "$mb" "$(awk -v a="$ma" -v b="$mb" 'BEGIN {print (a > 0 ? b / a : 0)}')"
done
echo "(latency in us, typical; write_bw_64 in Mpps; write_bw_64k in GB/s)"
