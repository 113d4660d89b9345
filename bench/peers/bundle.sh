#!/usr/bin/env bash
# bench/peers/bundle.sh: packs what the peer benchmarks need into one folder,
# for a machine that has no package manager (a lent benchmark machine).
#
#   bench/peers/bundle.sh DIR [--build BUILD_DIR]
#
# DIR gets:
#   softhca/lib   softhca's libibverbs.so.1 and librdmacm.so.1 (from BUILD_DIR)
#   softhca/bin   udp_pingpong, line_trip and the softhca tool
#   bin           perftest's ib_* programs, ucx_perftest, ip, ss, taskset,
#                 unshare, nsenter, setsid
#   lib           every shared library those need, except glibc's own
#                 (rdma-core's libibverbs too: perftest links it; softhca's
#                 copy comes first wherever a benchmark asks for softhca)
#   ucx           UCX's transport modules
#   env.sh        sourced on the other machine: PATH, LD_LIBRARY_PATH and
#                 UCX_MODULE_DIR pointing into DIR
# The other machine must be x86-64 with a glibc at least as new as this one's.
set -euo pipefail

[[ $# -ge 1 && $1 != -h && $1 != --help ]] || { sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "$0"; exit 0; }
dir=$1; shift
build=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build
while (($#)); do
  case $1 in
    --build) build=$2; shift ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -f $build/lib/libibverbs.so.1 && -x $build/bin/udp_pingpong ]] ||
  { echo "build softhca and udp_pingpong first (cmake --build $build --target udp_pingpong)" >&2; exit 1; }
multiarch=/usr/lib/x86_64-linux-gnu
programs=(ibv_devinfo ib_write_lat ib_write_bw ib_read_lat ib_read_bw ib_send_lat ib_send_bw ib_atomic_lat ib_atomic_bw
  ucx_perftest ip ss taskset unshare nsenter setsid)

rm -rf "$dir"
mkdir -p "$dir"/{bin,lib,ucx,softhca/lib,softhca/bin}
for p in "${programs[@]}"; do
  path=$(command -v "$p") || { echo "missing $p (perftest, ucx-utils, iproute2, util-linux)" >&2; exit 1; }
  cp -L "$path" "$dir/bin/"
done
cp -a "$build"/lib/lib{ibverbs,rdmacm}.so* "$dir/softhca/lib/"
cp -L "$build/bin/udp_pingpong" "$dir/softhca/bin/"
[[ -x $build/bin/softhca ]] && cp -L "$build/bin/softhca" "$dir/softhca/bin/"
[[ -x $build/bin/line_trip ]] && cp -L "$build/bin/line_trip" "$dir/softhca/bin/"
cp -L "$multiarch"/ucx/*.so.0 "$dir/ucx/"

# glibc's libraries stay: the other machine's loader must match its own libc.
glibc='/(ld-linux[^/]*|libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so'
{
  ldd "$dir"/bin/* "$dir"/ucx/* "$dir"/softhca/lib/*.so.1 "$dir"/softhca/bin/* 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}'
  # Providers rdma-core's libibverbs would load, so that UCX's ib module
  # finds its own library where no softhca is asked for.
  echo "$multiarch/libibverbs.so.1" "$multiarch/librdmacm.so.1"
} | tr ' ' '\n' | grep -v -E "$glibc" | sort -u | while read -r lib; do
  cp -L "$lib" "$dir/lib/"
done

cat >"$dir/env.sh" <<'EOF'
# Sourced on the benchmark machine: the bundled tools first.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$bundle/bin:$bundle/softhca/bin:$PATH
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$bundle/ucx
EOF
du -sh "$dir" | awk '{print "bundle: " $1}'
