#!/usr/bin/env bash
# rdma_copy.sh: examples/rdma_copy as a user runs it, on softhca.
#
#   rdma_copy.sh copy|empty RDMA_COPY LIBDIR HARNESS PORT
#   rdma_copy.sh errors     RDMA_COPY LIBDIR PORT
#   rdma_copy.sh peer_gone  RDMA_COPY LIBDIR PORT
#   rdma_copy.sh two_hosts  RDMA_COPY LIBDIR TWO_HOSTS_SH PORT
#
# copy: a random file of 9 MiB + 1234 bytes (not a whole number of the 1 MiB
#   chunks) from a client to a server on 127.0.0.1, through harness.sh (each
#   program bounded, the client started once the server's "listening on"
#   line appears, only our processes killed). Passes when both exit 0, both
#   print the file's CRC-32 (computed here, independently, from gzip's
#   trailer) as agreed, and the received file is byte for byte the sent one
#   (cmp) under the sender's name in the --output directory.
# empty: the same with an empty file (CRC-32 00000000).
# errors: a missing file, a port nobody listens on and an address that is
#   not one: each a non-zero exit with a message that says what is wrong.
# peer_gone: a 64 MiB copy in 4 KiB chunks whose server is stopped
#   (SIGTERM) once it reports its first chunk: the client must exit 1
#   within 10 s saying the server went away, and the server must leave no
#   partial file behind.
# two_hosts: the copy between two network namespaces (two_hosts.sh: the
#   udp link over a veth); exits 77 (skipped) where none can be made.
# The temporary directory is removed however the test ends.
set -u -o pipefail

mode=${1:-}
case $mode in
  copy | empty | two_hosts) (($# == 5)) || { echo "usage: see the header of $0" >&2; exit 2; } ;;
  errors | peer_gone) (($# == 4)) || { echo "usage: see the header of $0" >&2; exit 2; } ;;
  *) echo "usage: see the header of $0" >&2; exit 2 ;;
esac
rdma_copy=$2 libdir=$3

tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-rdma-copy.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# The namespaces of two_hosts.sh see the same /tmp; other users' programs
# (nobody, in a root-run test) must be able to read and write it there.
chmod 755 "$tmp"
mkdir -p "$tmp/in" "$tmp/out"

fail() {
  echo "rdma_copy.sh $mode: FAIL: $*"
  exit 1
}

# crc32 FILE: zlib's CRC-32, as rdma_copy prints it (8 hex digits), read
# from the trailer of a gzip stream (its first 4 bytes, little endian).
crc32() {
  gzip -1 -c <"$1" | tail -c 8 | od -An -tx4 -N4 --endian=little | tr -d ' \n'
}

make_file() {  # make_file SIZE: $tmp/in/data.bin of SIZE random bytes
  head -c "$1" /dev/urandom >"$tmp/in/data.bin" || fail "cannot make the test file"
}

check_copy() {  # the received file equals the sent one
  [[ -f $tmp/out/data.bin ]] || fail "no $tmp/out/data.bin: $(ls -la "$tmp/out")"
  cmp "$tmp/in/data.bin" "$tmp/out/data.bin" || fail "the received file differs from the sent one"
  # No temporary file left beside it.
  [[ $(find "$tmp/out" -mindepth 1 | wc -l) == 1 ]] || fail "stray files in the output directory: $(ls -A "$tmp/out")"
}

case $mode in
  copy | empty)
    harness=$4 port=$5
    if [[ $mode == copy ]]; then make_file $((9 * 1024 * 1024 + 1234)); else make_file 0; fi
    crc=$(crc32 "$tmp/in/data.bin")
    size=$(stat -c %s "$tmp/in/data.bin")
    echo "rdma_copy.sh $mode: $size bytes, crc32 $crc"
    bash "$harness" --name "rdma_copy.$mode" --timeout 30 --ready-timeout 20 --libdir "$libdir" --port "$port" \
      --ready-regex "^rdma_copy: listening on 127[.]0[.]0[.]1:$port\$" \
      --server "$rdma_copy --server --bind 127.0.0.1 --port $port --output $tmp/out" \
      --client "$rdma_copy --port $port --chunk 1M --progress $tmp/in/data.bin 127.0.0.1" \
      --expect-server "^rdma_copy: received $tmp/out/data.bin [(]$size bytes[)] in " \
      --expect-server "^rdma_copy: crc32 $crc matches the client's\$" \
      --expect-client "^rdma_copy: sent $tmp/in/data.bin [(]$size bytes[)] to 127[.]0[.]0[.]1:$port in .* MB/s\$" \
      --expect-client "^rdma_copy: crc32 $crc verified by the server\$" \
      --expect-client "^100[.]0%" || fail "the pair failed (above)"
    check_copy
    ;;

  errors)
    port=$4
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # expect_error WHAT REGEX ARGS...: rdma_copy ARGS exits 1 and says REGEX.
    expect_error() {
      local what=$1 re=$2 out rc
      shift 2
      out=$(timeout 30 "$rdma_copy" "$@" 2>&1)
      rc=$?
      echo "[$what] exit $rc: $out"
      [[ $rc == 1 ]] || fail "$what: exit $rc, not 1"
      grep -Eq -- "$re" <<<"$out" || fail "$what: no line matches /$re/"
    }
    expect_error "missing file" "^rdma_copy: cannot open $tmp/in/nothing: No such file or directory\$" \
      --port "$port" "$tmp/in/nothing" 127.0.0.1
    make_file 4096
    expect_error "no server" "^rdma_copy: connection to 127[.]0[.]0[.]1:$port refused [(]is .rdma_copy --server. running there[?][)]\$" \
      --timeout 10 --port "$port" "$tmp/in/data.bin" 127.0.0.1
    expect_error "bad address" "^rdma_copy: cannot resolve 'no-such-host[.]invalid': " \
      --port "$port" "$tmp/in/data.bin" no-such-host.invalid
    [[ -z $(ls -A "$tmp/out") ]] || fail "files were written: $(ls -A "$tmp/out")"
    # Bad usage: exit 2, and --help: exit 0.
    timeout 10 "$rdma_copy" --chunk 0 "$tmp/in/data.bin" 127.0.0.1 >/dev/null 2>&1
    [[ $? == 2 ]] || fail "--chunk 0 should exit 2"
    timeout 10 "$rdma_copy" --help | grep -q "^Usage:" || fail "--help prints no usage"
    ;;

  peer_gone)
    port=$4
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    make_file $((64 * 1024 * 1024))
    # timeout(1) passes the SIGTERM we send it on to rdma_copy.
    timeout 60 "$rdma_copy" --server --bind 127.0.0.1 --port "$port" --output "$tmp/out" --progress \
      >"$tmp/server.log" 2>&1 &
    server=$!
    for ((i = 0; i < 200; i++)); do
      grep -q "^rdma_copy: listening on" "$tmp/server.log" && break
      kill -0 "$server" 2>/dev/null || break
      sleep 0.1
    done
    grep -q "^rdma_copy: listening on" "$tmp/server.log" || { kill -KILL "$server"; fail "the server did not listen: $(cat "$tmp/server.log")"; }
    timeout 60 "$rdma_copy" --port "$port" --chunk 4K --timeout 10 "$tmp/in/data.bin" 127.0.0.1 >"$tmp/client.log" 2>&1 &
    client=$!
    # The server's first progress line comes with its first chunk.
    for ((i = 0; i < 200; i++)); do
      grep -q "%" "$tmp/server.log" && break
      kill -0 "$client" 2>/dev/null || break
      sleep 0.05
    done
    kill -TERM "$server" 2>/dev/null
    stopped=$(date +%s%3N)
    wait "$server"
    server_rc=$?
    wait "$client"
    client_rc=$?
    took=$(($(date +%s%3N) - stopped))
    echo "server (exit $server_rc):"; sed 's/^/  /' "$tmp/server.log"
    echo "client (exit $client_rc, $took ms after the server was stopped):"; sed 's/^/  /' "$tmp/client.log"
    grep -q "%" "$tmp/server.log" || fail "the server never reported a chunk"
    [[ $client_rc == 1 ]] || fail "the client exited $client_rc, not 1"
    ((took < 10000)) || fail "the client took $took ms to notice"
    grep -Eq "^rdma_copy: the server (disconnected before the copy was complete|went away)" "$tmp/client.log" ||
      fail "the client does not say that the server went away"
    [[ -z $(ls -A "$tmp/out") ]] || fail "the stopped server left files: $(ls -A "$tmp/out")"
    ;;

  two_hosts)
    two_hosts=$4 port=$5
    make_file $((9 * 1024 * 1024 + 1234))
    crc=$(crc32 "$tmp/in/data.bin")
    echo "rdma_copy.sh $mode: crc32 $crc"
    bash "$two_hosts" --name two_hosts.rdma_copy --libdir "$libdir" --port "$port" --timeout 60 \
      --ready-log "^rdma_copy: listening on " \
      --server "$rdma_copy --server --bind @SERVER@ --port $port --output $tmp/out" \
      --client "$rdma_copy --port $port $tmp/in/data.bin @SERVER@" \
      --expect "^rdma_copy: crc32 $crc verified by the server\$"
    rc=$?
    ((rc == 77)) && exit 77
    ((rc == 0)) || fail "the pair failed (above)"
    check_copy
    ;;
esac
echo "rdma_copy.sh $mode: PASS"
