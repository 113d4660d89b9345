#!/usr/bin/env bash
# tests/fuzz/run_libfuzzer.sh [HARNESS] [SECONDS] [-- LIBFUZZER_ARGS...]
#
# One fuzz harness under clang's coverage-guided libFuzzer with ASan and
# UBSan, for SECONDS (default 60), by hand: CI runs the same harnesses
# through fuzz_driver.cpp, because the project's compiler (GCC 12) has no
# libFuzzer. HARNESS is
#   wire_parse       the RoCEv2 packet parser (the default)
#   transport_flows  the RC/UC requester and responder state machines
# Only the layers the harness needs and the harness are built, with clang++
# directly, into build-fuzz/; the seeds are what the CI driver starts from
# (--write-seeds). Prints libFuzzer's own report, whose last "#N" line is the
# number of inputs run and "cov:" the edges covered. A crash leaves its input
# in build-fuzz/ (crash-*); replay it with
#   build-fuzz/HARNESS_fuzz build-fuzz/crash-...
# (transport_flows: TRANSPORT_FUZZ_TRACE=1 prints what the input does).
# Needs clang++ and its fuzzer runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
harness=wire_parse
if [[ ${1:-} =~ ^[a-z_]+$ ]]; then
  harness=$1
  shift
fi
seconds=${1:-60}
shift || true
[[ ${1:-} == -- ]] && shift

case $harness in
  wire_parse)
    sources=("$root"/src/wire/*.cpp "$root/tests/fuzz/wire_parse_fuzz.cpp")
    ;;
  transport_flows)
    sources=("$root"/src/wire/*.cpp "$root"/src/transport/*.cpp "$root/src/common/iovec.cpp"
             "$root/tests/fuzz/transport_flows_fuzz.cpp")
    ;;
  *)
    echo "run_libfuzzer: unknown harness $harness (wire_parse or transport_flows)" >&2
    exit 2
    ;;
esac

out=$root/build-fuzz
corpus=$out/corpus-$harness
mkdir -p "$corpus"
cxx=${CXX_FUZZ:-clang++}
flags=(-std=c++2b -O1 -g -Wall -Wextra -Werror -Wno-missing-field-initializers
       -I"$root/src" -I"$root/include" -I"$root/tests/unit")
# libstdc++ 12 offers std::expected only when __cpp_concepts >= 202002, which
# clang 14 does not claim although it compiles what src/wire instantiates.
# Claim it for this build only; a newer clang needs nothing.
if [[ $("$cxx" -std=c++2b -dM -E -x c++ /dev/null | awk '/__cpp_concepts/{print $3}') < 202002L ]]; then
  flags+=(-D__cpp_concepts=202002L -Wno-macro-redefined)
fi

echo "run_libfuzzer: building $harness with $cxx"
"$cxx" "${flags[@]}" "${sources[@]}" "$root/tests/fuzz/${harness}_target.cpp" "$root/tests/fuzz/fuzz_driver.cpp" -lz \
  -o "$out/${harness}_fuzz_driver"
"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined "${sources[@]}" -lz \
  -o "$out/${harness}_fuzz"
"$out/${harness}_fuzz_driver" --write-seeds "$corpus"

cd "$out"
exec "./${harness}_fuzz" -max_total_time="$seconds" -print_final_stats=1 "$@" "$corpus"
