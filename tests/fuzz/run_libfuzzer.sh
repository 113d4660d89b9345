#!/usr/bin/env bash
# tests/fuzz/run_libfuzzer.sh [SECONDS] [-- LIBFUZZER_ARGS...]
#
# The wire parser harness (wire_parse_fuzz.cpp) under clang's coverage-guided
# libFuzzer with ASan and UBSan, for SECONDS (default 60), by hand: CI runs the
# same harness through fuzz_driver.cpp, because the project's compiler (GCC
# 12) has no libFuzzer. Only src/wire and the harness are built, with clang++
# directly, into build-fuzz/; the seeds are the unit tests' golden packets.
# Prints libFuzzer's own report, whose last "#N" line is the number of inputs
# run. A crash leaves its input in build-fuzz/ (crash-*); replay it with
#   build-fuzz/wire_parse_fuzz build-fuzz/crash-...
# Needs clang++ and its fuzzer runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=${1:-60}
shift || true
[[ ${1:-} == -- ]] && shift

out=$root/build-fuzz
mkdir -p "$out/corpus"
cxx=${CXX_FUZZ:-clang++}
flags=(-std=c++2b -O1 -g -Wall -Wextra -Werror -Wno-missing-field-initializers
       -I"$root/src" -I"$root/tests/unit")
# libstdc++ 12 offers std::expected only when __cpp_concepts >= 202002, which
# clang 14 does not claim although it compiles what src/wire instantiates.
# Claim it for this build only; a newer clang needs nothing.
if [[ $("$cxx" -std=c++2b -dM -E -x c++ /dev/null | awk '/__cpp_concepts/{print $3}') < 202002L ]]; then
  flags+=(-D__cpp_concepts=202002L -Wno-macro-redefined)
fi
sources=("$root"/src/wire/*.cpp "$root/tests/fuzz/wire_parse_fuzz.cpp")

echo "run_libfuzzer: building with $cxx"
"$cxx" "${flags[@]}" "${sources[@]}" "$root/tests/fuzz/fuzz_driver.cpp" -lz -o "$out/wire_parse_fuzz_driver"
"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined "${sources[@]}" -lz \
  -o "$out/wire_parse_fuzz"
"$out/wire_parse_fuzz_driver" --write-seeds "$out/corpus"

cd "$out"
exec ./wire_parse_fuzz -max_total_time="$seconds" -print_final_stats=1 "$@" corpus
