#!/usr/bin/env bash
# Installs the current build into a temporary prefix and uses it the way
# another project would (README "Install").
#
#   install_test.sh BUILD_DIR CONSUMER_DIR CXX VERSION LIBDIR [EXAMPLES_DIR]
#
# BUILD_DIR: the build to install; CONSUMER_DIR: tests/install/consumer, a
# project using the C++ API; CXX: the compiler; VERSION: the project's
# version; LIBDIR: CMAKE_INSTALL_LIBDIR of the build (lib, or lib/<multiarch>
# when configured for /usr); EXAMPLES_DIR: examples/, built as a project of
# its own against the prefix when given.
#
# Checked, each step failing the test on its own:
#   - `cmake --install BUILD_DIR --prefix P` installs exactly the shipped
#     files: bin/softhca, our libraries in LIBDIR/softhca, the headers, the
#     pkg-config file, the CMake package and the docs; nothing of ours named
#     lib* directly in LIBDIR (rdma-core must not be shadowed), no tests or
#     benchmarks;
#   - the installed tool loads the installed libibverbs.so.1 (RUNPATH) and
#     `softhca info` names P/LIBDIR/softhca as its library directory;
#   - the consumer configures and builds with find_package(softhca) and
#     softhca::softhca, and compiles with `pkg-config --cflags --libs
#     softhca`; both binaries link rdma-core's libibverbs/librdmacm, and
#     under `P/bin/softhca run` load ours from P instead, and see softhca0;
#   - `P/bin/softhca run -- ibv_devices` lists softhca0;
#   - with EXAMPLES_DIR: examples/ configures and builds standalone with
#     find_package(softhca) (PROJECT_IS_TOP_LEVEL), warnings as errors; its
#     rdma_copy links rdma-core's librdmacm, and under `softhca run` copies a
#     file across 127.0.0.1 (server and client started here, each bounded,
#     only their PIDs ever signalled) with the checksums agreeing and the
#     copy equal to the original.
# The temporary directory is removed however the test ends.
set -euo pipefail

if [[ $# -ne 5 && $# -ne 6 ]]; then
  echo "usage: $0 BUILD_DIR CONSUMER_DIR CXX VERSION LIBDIR [EXAMPLES_DIR]" >&2
  exit 2
fi
build=$1
consumer_src=$2
cxx=$3
version=$4
libdir=$5
examples_src=${6:-}

# Runs everything with the caller's loader path out of the way: the point is
# which libraries the installed files find by themselves.
unset LD_LIBRARY_PATH LD_PRELOAD PKG_CONFIG_PATH CMAKE_PREFIX_PATH

tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-install-test.XXXXXX")
server_pid=""
# The example server, if still running, is ours: stop it by its PID.
trap '[[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
# realpath: the tool reports paths through /proc/self/exe, without symlinks.
prefix=$(realpath "$tmp")/prefix
private=$prefix/$libdir/softhca
limit=120  # seconds for any one step; the consumer builds in a few

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { echo "---- $*"; }
# expect TEXT WHAT REGEX...: every extended REGEX matches a line of TEXT.
expect() {
  local text=$1 what=$2 re
  shift 2
  for re in "$@"; do
    grep -Eq -- "$re" <<<"$text" || fail "$what: no line matches '$re' in:"$'\n'"$text"
  done
}
# loaded_from PROGRAM LIBRARY [RUNNER...]: the path ldd resolves LIBRARY to
# for PROGRAM, run under RUNNER (e.g. softhca run), with "dir/../" folded
# but links kept; empty when not found.
loaded_from() {
  local program=$1 library=$2 path
  shift 2
  path=$("$@" ldd "$program" | awk -v lib="$library" '$1 == lib && $2 == "=>" { print $3 }')
  [[ -z $path ]] || realpath -s "$path"
}

step "cmake --install $build --prefix $prefix"
timeout "$limit" cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  fail "cmake --install failed:"$'\n'"$(cat "$tmp/install.log")"

step "installed layout"
for f in bin/softhca \
         "$libdir/softhca/libibverbs.so.1" "$libdir/softhca/librdmacm.so.1" "$libdir/softhca/softhca-cm-agent" \
         include/softhca/softhca.hpp include/softhca/cm.hpp \
         "$libdir/pkgconfig/softhca.pc" \
         "$libdir/cmake/softhca/softhcaConfig.cmake" \
         "$libdir/cmake/softhca/softhcaConfigVersion.cmake" \
         "$libdir/cmake/softhca/softhcaTargets.cmake" \
         share/doc/softhca/README.md share/doc/softhca/LICENSE; do
  [[ -e $prefix/$f ]] || fail "not installed: $f"
done
[[ -x $prefix/bin/softhca ]] || fail "bin/softhca is not executable"
# The CM starts the agent from beside the librdmacm.so.1 it runs in.
[[ -x $prefix/$libdir/softhca/softhca-cm-agent ]] || fail "softhca-cm-agent is not executable"
"$prefix/$libdir/softhca/softhca-cm-agent" --help | grep -q "host's softhca CM agent" ||
  fail "softhca-cm-agent --help does not describe it"
shadowing=$(find "$prefix/$libdir" -mindepth 1 -maxdepth 1 -name 'lib*')
[[ -z $shadowing ]] || fail "libraries directly in $libdir, where they would shadow rdma-core's:"$'\n'"$shadowing"
# Everything installed lies in one of the shipped places (no test, bench or
# example binary, no stray header).
stray=$(cd "$prefix" && find . ! -type d | sed 's|^\./||' | grep -Ev \
  "^(bin/softhca|$libdir/softhca/lib(ibverbs|rdmacm)\.so[.0-9]*|$libdir/softhca/softhca-cm-agent|include/softhca/[a-z_]+\.hpp|$libdir/pkgconfig/softhca\.pc|$libdir/cmake/softhca/softhca[A-Za-z-]*\.cmake|share/doc/softhca/.*)$" || true)
[[ -z $stray ]] || fail "installed files outside the shipped layout:"$'\n'"$stray"

step "the installed tool"
tool=$prefix/bin/softhca
[[ $(loaded_from "$tool" libibverbs.so.1) == "$private/libibverbs.so.1" ]] ||
  fail "bin/softhca does not load $private/libibverbs.so.1:"$'\n'"$(ldd "$tool")"
out=$(timeout "$limit" "$tool" info 2>&1) || fail "softhca info failed:"$'\n'"$out"
grep -Fxq "library directory  $private" <<<"$out" ||
  fail "softhca info does not name $private as its library directory:"$'\n'"$out"
out=$(timeout "$limit" "$tool" devices 2>&1) || fail "softhca devices failed:"$'\n'"$out"
expect "$out" "softhca devices" '^softhca0 '

step "consumer: find_package(softhca) and softhca::softhca"
timeout "$limit" cmake -S "$consumer_src" -B "$tmp/consumer-cmake" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" -DSOFTHCA_VERSION="$version" \
  >"$tmp/consumer.log" 2>&1 || fail "consumer configure failed:"$'\n'"$(cat "$tmp/consumer.log")"
found=$(sed -n 's/^softhca_DIR:PATH=//p' "$tmp/consumer-cmake/CMakeCache.txt")
[[ $found == "$prefix/$libdir/cmake/softhca" ]] ||
  fail "find_package(softhca) found $found, not the package in $prefix"
timeout "$limit" cmake --build "$tmp/consumer-cmake" >>"$tmp/consumer.log" 2>&1 ||
  fail "consumer build failed:"$'\n'"$(cat "$tmp/consumer.log")"
by_cmake=$tmp/consumer-cmake/consumer

step "consumer: pkg-config softhca"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
[[ $(pkg-config --modversion softhca) == "$version" ]] ||
  fail "pkg-config --modversion softhca: $(pkg-config --modversion softhca 2>&1), not $version"
cflags=$(pkg-config --cflags softhca) || fail "pkg-config --cflags softhca failed"
libs=$(pkg-config --libs softhca) || fail "pkg-config --libs softhca failed"
echo "cflags: $cflags"
echo "libs:   $libs"
read -r first_flag _ <<<"$cflags"
include=${first_flag#-I}
[[ $first_flag == -I* && $(realpath "$include") == "$prefix/include" ]] ||
  fail "pkg-config --cflags softhca gives '$cflags', not -I$prefix/include"
for lib in -libverbs -lrdmacm; do
  grep -qw -- "$lib" <<<"$libs" || fail "pkg-config --libs softhca lacks $lib: $libs"
done
by_pkg_config=$tmp/consumer-pkg-config
# shellcheck disable=SC2086  # the flags are words
timeout "$limit" "$cxx" -std=c++23 $cflags "$consumer_src/main.cpp" -o "$by_pkg_config" $libs \
  >"$tmp/pkg-config.log" 2>&1 || fail "g++ with pkg-config's flags failed:"$'\n'"$(cat "$tmp/pkg-config.log")"

for program in "$by_cmake" "$by_pkg_config"; do
  step "$(basename "$program") under $tool run"
  for library in libibverbs.so.1 librdmacm.so.1; do
    # Built as on any rdma-core system: against the system's libraries ...
    system_lib=$(loaded_from "$program" "$library")
    [[ -n $system_lib && $system_lib != "$prefix"/* ]] ||
      fail "$program does not link the system's $library:"$'\n'"$(ldd "$program")"
    # ... and on softhca's under `softhca run`.
    [[ $(loaded_from "$program" "$library" "$tool" run --) == "$private/$library" ]] ||
      fail "under softhca run, $program does not load $private/$library:"$'\n'"$("$tool" run -- ldd "$program")"
  done
  out=$(timeout "$limit" "$tool" run -- "$program" softhca0 2>&1) ||
    fail "$program under softhca run failed:"$'\n'"$out"
  expect "$out" "$program" '^consumer: device softhca0 port 1 active$' \
    '^consumer: registered 4096 bytes$' '^consumer: rdma_cm id created$'
done

step "ibv_devices under $tool run"
out=$(timeout "$limit" "$tool" run -- ibv_devices 2>&1) || fail "softhca run -- ibv_devices failed:"$'\n'"$out"
expect "$out" "ibv_devices" '^[[:space:]]+softhca0[[:space:]]'

if [[ -n $examples_src ]]; then
  step "examples/ as a standalone project: find_package(softhca)"
  # Longer than one step: four programs to compile on possibly busy cores.
  timeout $((3 * limit)) cmake -S "$examples_src" -B "$tmp/examples" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_FLAGS=-Werror \
    >"$tmp/examples.log" 2>&1 || fail "examples configure failed:"$'\n'"$(cat "$tmp/examples.log")"
  found=$(sed -n 's/^softhca_DIR:PATH=//p' "$tmp/examples/CMakeCache.txt")
  [[ $found == "$prefix/$libdir/cmake/softhca" ]] ||
    fail "examples: find_package(softhca) found $found, not the package in $prefix"
  timeout $((3 * limit)) cmake --build "$tmp/examples" >>"$tmp/examples.log" 2>&1 ||
    fail "examples build failed:"$'\n'"$(cat "$tmp/examples.log")"
  for program in cxx_rc_pingpong rc_example cm_example rdma_copy; do
    [[ -x $tmp/examples/$program ]] || fail "examples: $program was not built"
  done
  rdma_copy=$tmp/examples/rdma_copy
  system_lib=$(loaded_from "$rdma_copy" librdmacm.so.1)
  [[ -n $system_lib && $system_lib != "$prefix"/* ]] ||
    fail "rdma_copy does not link the system's librdmacm.so.1:"$'\n'"$(ldd "$rdma_copy")"

  step "examples: rdma_copy under $tool run"
  mkdir -p "$tmp/copy-in" "$tmp/copy-out"
  head -c $((3 * 1024 * 1024 + 17)) /dev/urandom >"$tmp/copy-in/file.bin"
  port=7473
  timeout "$limit" "$tool" run -- "$rdma_copy" --server --bind 127.0.0.1 --port "$port" \
    --output "$tmp/copy-out" >"$tmp/copy-server.log" 2>&1 &
  server_pid=$!
  # Ready once it says it listens (bounded; stops early if it exits).
  for ((i = 0; i < 200; i++)); do
    grep -q "^rdma_copy: listening on" "$tmp/copy-server.log" && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "^rdma_copy: listening on" "$tmp/copy-server.log" ||
    fail "the rdma_copy server did not listen:"$'\n'"$(cat "$tmp/copy-server.log")"
  out=$(timeout "$limit" "$tool" run -- "$rdma_copy" --port "$port" "$tmp/copy-in/file.bin" 127.0.0.1 2>&1) ||
    fail "rdma_copy client failed:"$'\n'"$out"$'\n'"server:"$'\n'"$(cat "$tmp/copy-server.log")"
  wait "$server_pid" || fail "rdma_copy server failed:"$'\n'"$(cat "$tmp/copy-server.log")"
  server_pid=""
  expect "$out" "rdma_copy client" '^rdma_copy: crc32 [0-9a-f]{8} verified by the server$'
  expect "$(cat "$tmp/copy-server.log")" "rdma_copy server" "^rdma_copy: crc32 [0-9a-f]{8} matches the client's\$"
  cmp "$tmp/copy-in/file.bin" "$tmp/copy-out/file.bin" || fail "rdma_copy: the copy differs from the original"
fi

echo "PASS: installed to a temporary prefix; find_package, pkg-config and softhca run work from it"
