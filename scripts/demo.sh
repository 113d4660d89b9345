#!/usr/bin/env bash
# scripts/demo.sh: see softhca run unmodified RDMA programs on this machine.
#
#   scripts/demo.sh [--skip-deps] [BUILD_DIR]
#
# Installs the Debian packages (scripts/install-deps.sh), builds softhca
# (Release, in BUILD_DIR, default build/), then, with
# LD_LIBRARY_PATH=BUILD_DIR/lib and through tests/system/harness.sh (time
# limits, readiness polling on the out-of-band TCP port 18515):
#   1. ibv_devinfo
#   2. ib_write_bw -d softhca0 -x 0 -s 65536 -n 2000   server + client (127.0.0.1)
#   3. ib_write_lat -d softhca0 -x 0 -s 2              server + client
# and prints their output and a one-line summary. Exit status 0 if all passed.
set -u -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

skip_deps=0
build_dir=build
while (($#)); do
  case $1 in
    --skip-deps) skip_deps=1 ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) build_dir=$1 ;;
  esac
  shift
done
[[ $build_dir = /* ]] || build_dir=$root/$build_dir
libdir=$build_dir/lib
harness=$root/tests/system/harness.sh

if ((!skip_deps)); then
  bash scripts/install-deps.sh || { echo "demo.sh: installing packages failed"; exit 1; }
fi
bash scripts/build.sh "$build_dir" || { echo "demo.sh: build failed"; exit 1; }
if [[ ! -e $libdir/libibverbs.so.1 ]]; then
  echo "demo.sh: the build produced no $libdir/libibverbs.so.1"
  exit 1
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/softhca-demo.XXXXXX") || exit 1
trap 'rm -rf "$logs"' EXIT
status=0

echo
echo "== ibv_devinfo (LD_LIBRARY_PATH=$libdir)"
bash "$harness" --name ibv_devinfo --timeout 30 --libdir "$libdir" --run 'ibv_devinfo -d softhca0' \
  --expect 'hca_id:[[:space:]]+softhca0' --expect PORT_ACTIVE || status=1

bw="ib_write_bw -d softhca0 -x 0 -s 65536 -n 2000"
echo
echo "== $bw"
bash "$harness" --name ib_write_bw --timeout 120 --libdir "$libdir" --port 18515 --keep "$logs" \
  --server "$bw" --client "$bw 127.0.0.1" \
  --expect-client '^[[:space:]]*65536[[:space:]]+2000[[:space:]]+[0-9]' || status=1

lat="ib_write_lat -d softhca0 -x 0 -s 2"
echo
echo "== $lat"
bash "$harness" --name ib_write_lat --timeout 60 --libdir "$libdir" --port 18515 --keep "$logs" \
  --server "$lat" --client "$lat 127.0.0.1" \
  --expect-client '^[[:space:]]*2[[:space:]]+[0-9]+[[:space:]]+[0-9]' || status=1

# perftest rows: bw "#bytes #iterations peak average msgrate",
# lat "#bytes #iterations t_min t_max t_typical t_avg ...".
bw_avg=$(awk '$1 == 65536 && $2 == 2000 { print $4; exit }' "$logs/ib_write_bw.client.log" 2>/dev/null)
lat_typ=$(awk '$1 == 2 && $2 ~ /^[0-9]+$/ && NF >= 6 { print $5; exit }' "$logs/ib_write_lat.client.log" 2>/dev/null)
lat_avg=$(awk '$1 == 2 && $2 ~ /^[0-9]+$/ && NF >= 6 { print $6; exit }' "$logs/ib_write_lat.client.log" 2>/dev/null)

echo
if ((status == 0)); then
  echo "softhca demo: PASS: ib_write_bw 64 KiB ${bw_avg:-?} MB/s average; ib_write_lat 2 B ${lat_typ:-?} us typical, ${lat_avg:-?} us average"
else
  echo "softhca demo: FAIL: see the harness lines above (ib_write_bw ${bw_avg:-n/a} MB/s, ib_write_lat ${lat_typ:-n/a} us)"
fi
exit "$status"
