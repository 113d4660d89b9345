#!/usr/bin/env bash
# Checks that unmodified rdma-core 44 peers link against our libibverbs.so.1.
#
#   ldd_peers_test.sh OUR_LIB_DIR
#
# For each peer program and provider library, runs `LD_LIBRARY_PATH=OUR_LIB_DIR
# ldd -r` (which resolves every data and function relocation, as the peers'
# BIND_NOW does at start-up) and fails on any "undefined symbol", "not found" or
# "no version information" line, or when libibverbs.so.1 is not taken from
# OUR_LIB_DIR. The provider libraries libmlx5/libefa are linked into perftest
# and import IBVERBS_PRIVATE_34, so they are checked on their own too.
#
# Exit status: 0 all good, 1 a link problem, 2 usage, 77 (ctest SKIP) when some
# peer is not installed and everything that is installed links.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUR_LIB_DIR" >&2
  exit 2
fi
if [[ ! -r $1/libibverbs.so.1 ]]; then
  echo "FAIL: no libibverbs.so.1 in $1" >&2
  exit 1
fi
libdir=$(realpath "$1")

multiarch=/usr/lib/x86_64-linux-gnu
peers=(
  /usr/bin/ibv_devinfo
  /usr/bin/ibv_rc_pingpong
  /usr/bin/ib_write_bw
  /usr/bin/ib_send_lat
  "$multiarch/libmlx5.so.1"
  "$multiarch/libefa.so.1"
)

failed=0
missing=0
for peer in "${peers[@]}"; do
  if [[ ! -e $peer ]]; then
    echo "MISSING: $peer is not installed (ibverbs-utils / perftest / ibverbs-providers)"
    missing=1
    continue
  fi
  out=$(LC_ALL=C LD_LIBRARY_PATH="$libdir" ldd -r "$peer" 2>&1)
  rc=$?
  problems=$(grep -E 'undefined symbol|not found|no version information' <<<"$out" | LC_ALL=C sort -u)
  resolved=$(awk '$1 == "libibverbs.so.1" && $2 == "=>" { print $3; exit }' <<<"$out")
  ok=1
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $peer: ldd -r exited with $rc"
    ok=0
  fi
  if [[ -n $problems ]]; then
    echo "FAIL: $peer:"
    sed 's/^/    /' <<<"$problems"
    ok=0
  fi
  if [[ -z $resolved ]]; then
    echo "FAIL: $peer: libibverbs.so.1 is not among its dependencies"
    ok=0
  elif [[ $(realpath "$(dirname "$resolved")") != "$libdir" ]]; then
    echo "FAIL: $peer: libibverbs.so.1 resolves to $resolved, not into $libdir"
    ok=0
  fi
  if [[ $ok -eq 1 ]]; then
    echo "ok: $peer (libibverbs.so.1 => $resolved)"
  else
    failed=1
    echo "--- full ldd -r output for $peer:"
    sed 's/^/    /' <<<"$out"
  fi
done

if [[ $failed -ne 0 ]]; then
  exit 1
fi
if [[ $missing -ne 0 ]]; then
  exit 77
fi
exit 0
