#!/usr/bin/env bash
# Configure and build softhca.
#
#   scripts/build.sh [BUILD_DIR] [CMAKE_ARGS...]
#
# BUILD_DIR defaults to build/ (relative to the repository root unless
# absolute). The build type is Release unless CMAKE_ARGS set another
# -DCMAKE_BUILD_TYPE. Builds with $SOFTHCA_JOBS or nproc parallel jobs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${1:-build}
shift $(($# > 0 ? 1 : 0))
[[ $build_dir = /* ]] || build_dir=$root/$build_dir
jobs=${SOFTHCA_JOBS:-$(nproc)}

cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "$jobs"
